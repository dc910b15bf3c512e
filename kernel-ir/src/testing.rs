//! Kernels for testing backends: [`op_zoo`] uses every op of the IR, so a backend that
//! matches the interpreter on it implements the whole op set. [`check_text_input`] is
//! what the parser fuzzer asserts of every input.

use crate::dsl::prelude::*;
use crate::dsl::{branch, for_range};
use crate::Array;

fn spec(shape: [u64; 2]) -> BlockSpecFn {
    block_spec(shape, |i| vec![i[0].clone(), 0.into()])
}

/// A kernel over `f32[16, 8]` and `i32[16, 8]` inputs (two programs of 8 rows) that
/// uses every op: unary/binary float and integer math (floor division and remainder of
/// negatives), transposes, min/max reductions, an `if` with a result, a `for` with a
/// carried value, `select`, casts between bool, i32, bf16 and f32, `iota`,
/// `num_programs`. Outputs: `f32[16, 8]`, `i32[16, 8]`.
pub fn op_zoo() -> Kernel {
    let f = TensorType::new(DType::F32, [16, 8]);
    let i = TensorType::new(DType::I32, [16, 8]);
    pallas_call(|x: Ref, n: Ref, of: Ref, oi: Ref| {
        let v = x.read();
        let a = v.abs() + 0.5;
        let t = v.tanh() + a.sqrt() + a.pow(1.5) + (v % 0.3) + a.log() + a.rsqrt();
        let tt = t.t().t() + t.transpose(vec![1, 0]).t();
        let mins = tt.min_keepdims(1) + tt.max_keepdims(0);
        let k = n.read();
        let q = k / 3 + k % 3 + (-k) / 4 + (-k) % 4 + k.maximum(2).minimum(5) - k.abs();
        let q = q + (!k) + (k.ge(0) & k.lt(4)).cast(DType::I32) + iota([8, 8], 1) * num_programs(0);
        let flag = q.cast(DType::F32).sum(1).sum(0).gt(0.0);
        let ((), picked) = branch(flag, (), |vars| (vars, mins * 2.0), |vars| (vars, -mins));
        let looped = for_range(0, 3, 1, picked, |j, acc| {
            acc + j.cast(DType::F32) + k.cast(DType::F32) * 0.25
        });
        let sel = select(v.lt(0.0), looped, -(-v.exp()));
        of.write(sel + q.cast(DType::F32).cast(DType::BF16).cast(DType::F32));
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
