//! Kernels for testing backends: [`op_zoo`] uses every op of the IR, so a backend that
//! matches the interpreter on it implements the whole op set. [`check_text_input`] is
//! what the parser fuzzer asserts of every input. [`prefetch_gather`] places blocks from
//! a scalar-prefetch table.

use crate::dsl::prelude::*;
use crate::dsl::{branch, for_range};
use crate::{Array, UnaryOp};

fn spec(shape: [u64; 2]) -> BlockSpecFn {
    block_spec(shape, |i| vec![i[0].clone(), 0.into()])
}

/// A kernel over `f32[16, 8]` and `i32[16, 8]` inputs (two programs of 8 rows) that
/// uses every op and operator (`tests::op_zoo_uses_every_op` checks it): unary/binary
/// float and integer math (floor division and remainder of negatives), every
/// comparison, transposes, reshapes, gathers along each axis, sum/min/max reductions, `dot` (plain and
/// transposed), loads of whole blocks, static and dynamic slices, a single row and
/// masked lanes, plain and masked stores, an `if` with a result, a `for` with a carried
/// value, `select`, casts between bool, i32, bf16 and f32, `iota`, `program_id`,
/// `num_programs`, `debug_print`, `check`, `check_index`. Outputs: `f32[16, 8]`, `i32[16, 8]`.
pub fn op_zoo() -> Kernel {
    let f = TensorType::new(DType::F32, [16, 8]);
    let i = TensorType::new(DType::I32, [16, 8]);
    pallas_call(|x: Ref, n: Ref, of: Ref, oi: Ref| {
        let pid = program_id(0);
        let v = x.read();
        // Windows: rows [2, 6), rows [pid, pid + 4), row 3, masked lanes.
        let rows = x.load(s![ds(2, 4), ..]).sum(0) + x.load(s![ds(pid, 4), ..]).max(0);
        let row = x.load(s![3, ..]) + rows;
        debug_print!("op_zoo row:", pid, row, row.gt(0.0));
        // Checks that hold for every input (a failing one is tested on its own).
        check!(row.eq(row) | row.ne(row), "op_zoo row:", row);
        check_index!(pid.ge(0), "op_zoo pid:", pid);
        let masked = x.load_masked(s![.., ..], v.gt(0.0), -1.0);
        let gram = v.dot(masked.t()) * 0.125 + dot_general(v, v, false, true) * 0.0625;
        let v = v + gram.reshape([64]).reshape([8, 8]) + row.expand_dims(0);
        let a = v.abs() + 0.5;
        // Every float unary op on values in [0.96, 1.5] (a new op is covered with no
        // edit here), and on negatives where they are defined.
        let unit = a.tanh() + 0.5;
        let all_unary = UnaryOp::ALL.iter().filter(|op| op.accepts(DType::F32));
        let t = all_unary.fold(v.tanh() + v.erf() + a.pow(1.5) + (v % 0.3), |t, &op| {
            t + unit.apply(op)
        });
        let tt = t.t().t() + t.transpose(vec![1, 0]).t();
        let mins = tt.min_keepdims(1) + tt.max_keepdims(0);
        let k = n.read();
        // Gathers along both axes, with indices in range and (k is in [-11, 11]) clamped.
        let rows_at = n.load(s![ds(0, 3), ..]) % 8;
        let gathered = v.take_along_axis(k, 1) + v.take_along_axis(rows_at, 0).sum_keepdims(0);
        let q = k / 3 + k % 3 + (-k) / 4 + (-k) % 4 + k.maximum(2).minimum(5) - k.abs();
        let q = q + (!k) + (k.ge(0) & k.lt(4)).cast(DType::I32) + iota([8, 8], 1) * num_programs(0);
        let q = q + (k.eq(1) | k.ne(2)).cast(DType::I32) + k.le(-3).cast(DType::I32) + pid;
        let flag = q.cast(DType::F32).sum(1).sum(0).gt(0.0);
        let ((), picked) = branch(flag, (), |vars| (vars, mins * 2.0), |vars| (vars, -mins));
        let looped = for_range(0, 3, 1, picked, |j, acc| {
            acc + j.cast(DType::F32) + k.cast(DType::F32) * 0.25
        });
        let sel = select(v.lt(0.0), looped, -(-v.exp()));
        of.write(sel + gathered + q.cast(DType::F32).cast(DType::BF16).cast(DType::F32));
        of.store_masked(s![.., ..], sel * 0.5, k.gt(5));
        oi.write(
            q + sel.cast(DType::I32)
                + sel
                    .gt(1.0)
                    .cast(DType::I32)
                    .cast(DType::Bool)
                    .cast(DType::I32),
        );
    })
    .name("zoo")
    .grid([2])
    .input(f.clone(), spec([8, 8]))
    .input(i.clone(), spec([8, 8]))
    .output(f, spec([8, 8]))
    .output(i, spec([8, 8]))
    .build()
    .expect("the op zoo verifies")
}

/// Deterministic inputs for [`op_zoo`], with negative integers.
pub fn op_zoo_inputs() -> [Array; 2] {
    let x: Vec<f32> = (0..128)
        .map(|i| ((i * 37 % 29) as f32 - 14.0) / 7.0)
        .collect();
    let n: Vec<i32> = (0..128).map(|i| (i * 13 % 23) - 11).collect();
    [
        Array::from_f32(DType::F32, [16, 8], x).expect("128 elements"),
        Array::from_i32([16, 8], n).expect("128 elements"),
    ]
}

/// Kernels [`check_text_input`] also interprets: few programs, small arrays, no loops
/// (whose trip counts are data and could run for minutes).
fn small_enough_to_run(k: &Kernel, text: &str) -> bool {
    let small = |t: &TensorType| t.byte_size().is_some_and(|b| b <= 1 << 16);
    let programs = k.grid.iter().try_fold(1u64, |a, &g| a.checked_mul(g));
    programs.is_some_and(|p| p <= 64)
        && k.refs.iter().all(|r| small(&r.ty))
        && k.value_types.iter().all(small)
        && !text.contains(" for ")
}

/// A kernel whose index maps read a scalar-prefetch operand (Pallas's
/// `PrefetchScalarGridSpec`): output block `i` (of `block_rows` rows of `cols`) is input
/// block `table[i]` doubled, plus `table[i]` read again as a scalar in the body. Inputs
/// `table: i32[out_blocks]` (each entry below `in_blocks`), `x: f32[in_blocks *
/// block_rows, cols]`; output `f32[out_blocks * block_rows, cols]`.
pub fn prefetch_gather(in_blocks: u64, out_blocks: u64, block_rows: u64, cols: u64) -> Kernel {
    let at = |blocks: u64| TensorType::new(DType::F32, [blocks * block_rows, cols]);
    pallas_call(|table: Ref, x: Ref, o: Ref| {
        crate::dsl::kernel_prologue("prefetch_gather", &[(table, "table"), (x, "x"), (o, "o")]);
        let t = table.load(crate::s![program_id(0)]).cast(DType::F32);
        o.write(x.read() * 2.0 + t);
    })
    .grid([out_blocks])
    .scalar_prefetch(TensorType::new(DType::I32, [out_blocks]))
    .input(
        at(in_blocks),
        block_spec([block_rows, cols], |i| {
            vec![crate::dsl::prefetched(0, [i[0].clone()]), 0.into()]
        }),
    )
    .output(at(out_blocks), spec([block_rows, cols]))
    .build()
    .expect("prefetch_gather verifies")
}

/// The parser's contract on untrusted text: any input is parsed (and so verified) or
/// rejected with an error, never a panic; a kernel that parses prints back to text that
/// parses to the same kernel; small ones run on the interpreter without a panic (the
/// verifier's acceptance is what the interpreter relies on). Panics on a violation.
pub fn check_text_input(text: &str) {
    let Ok(kernel) = crate::parse_kernel(text) else {
        return;
    };
    let printed = crate::print_kernel(&kernel);
    let reparsed = crate::parse_kernel(&printed)
        .unwrap_or_else(|e| panic!("the printed kernel does not parse: {e}\n{printed}"));
    assert_eq!(
        reparsed, kernel,
        "print/parse round trip changed the kernel"
    );
    if small_enough_to_run(&kernel, text) {
        let inputs: Vec<Array> = kernel.input_types().into_iter().map(Array::zeros).collect();
        let options = crate::InterpretOptions {
            poison_uninitialized: true,
            threads: 1,
        };
        let _ = crate::interpret(&kernel, &inputs, &options);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::ir::{BinaryOp, CmpPred, Index, OpKind, ReduceOp, Start, UnaryOp};

    fn index_forms(index: &[Index]) -> impl Iterator<Item = String> + '_ {
        index.iter().map(|i| {
            match i {
                Index::Full => "index.full",
                Index::At(_) => "index.at",
                Index::Slice {
                    start: Start::Static(_),
                    ..
                } => "index.slice.static",
                Index::Slice {
                    start: Start::Dynamic(_),
                    ..
                } => "index.slice.dynamic",
            }
            .to_string()
        })
    }

    /// What an op exercises: its mnemonic, comparison predicate, and for memory ops
    /// their mask and index forms.
    fn features(kind: &OpKind) -> Vec<String> {
        let mut out = vec![kind.mnemonic().to_string()];
        match kind {
            OpKind::Compare { pred, .. } => out.push(format!("cmp.{}", pred.name())),
            OpKind::Load { index, mask, .. } => {
                out.extend(index_forms(index));
                if mask.is_some() {
                    out.push("load.masked".into());
                }
            }
            OpKind::Store { index, mask, .. } => {
                out.extend(index_forms(index));
                if mask.is_some() {
                    out.push("store.masked".into());
                }
            }
            _ => {}
        }
        out
    }

    /// Everything the IR has. The match is exhaustive on purpose: a new `OpKind` variant
    /// does not compile here until it is listed (and then must appear in `op_zoo`).
    fn every_feature() -> BTreeSet<String> {
        fn _listed(kind: &OpKind) {
            match kind {
                OpKind::ProgramId { .. }
                | OpKind::NumPrograms { .. }
                | OpKind::Constant { .. }
                | OpKind::Iota { .. }
                | OpKind::Load { .. }
                | OpKind::Store { .. }
                | OpKind::Broadcast { .. }
                | OpKind::Reshape { .. }
                | OpKind::Transpose { .. }
                | OpKind::Gather { .. }
                | OpKind::Unary { .. }
                | OpKind::Binary { .. }
                | OpKind::Compare { .. }
                | OpKind::Select { .. }
                | OpKind::Cast { .. }
                | OpKind::Reduce { .. }
                | OpKind::Dot { .. }
                | OpKind::For { .. }
                | OpKind::If { .. }
                | OpKind::Yield { .. }
                | OpKind::DebugPrint { .. }
                | OpKind::Check { .. } => {}
            }
        }
        let structural = [
            "program_id",
            "num_programs",
            "const",
            "iota",
            "load",
            "store",
            "broadcast",
            "reshape",
            "transpose",
            "gather",
            "cmp",
            "select",
            "cast",
            "dot",
            "for",
            "if",
            "yield",
            "debug_print",
            "check",
            "check_index",
            "index.full",
            "index.at",
            "index.slice.static",
            "index.slice.dynamic",
            "load.masked",
            "store.masked",
        ];
        let operators = UnaryOp::ALL
            .iter()
            .map(|o| o.name())
            .chain(BinaryOp::ALL.iter().map(|o| o.name()))
            .chain(ReduceOp::ALL.iter().map(|o| o.name()));
        let predicates = CmpPred::ALL.iter().map(|p| format!("cmp.{}", p.name()));
        structural
            .iter()
            .copied()
            .chain(operators)
            .map(String::from)
            .chain(predicates)
            .collect()
    }

    #[test]
    fn op_zoo_uses_every_op() {
        let mut used = BTreeSet::new();
        super::op_zoo()
            .body
            .walk(&mut |op| used.extend(features(&op.kind)));
        let missing: Vec<_> = every_feature().difference(&used).cloned().collect();
        assert!(missing.is_empty(), "op_zoo does not use: {missing:?}");
    }
}
