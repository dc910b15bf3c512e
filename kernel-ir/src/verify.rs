//! The verifier: structural rules of the kernel (grid, refs, BlockSpecs) and the type
//! rules of every op. Errors name the op as printed, the operand, and what was expected.

use std::collections::HashSet;
use std::fmt;

use crate::ir::{BlockDim, IndexExpr, Kernel, MemorySpace, Op, OpKind, RefKind, Region, Value};
use crate::ops::infer;
use crate::print::Namer;
use crate::types::DType;

/// Why a kernel is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The offending op (as printed) or declaration.
    pub op: String,
    /// What is wrong, with the expected and found types.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid kernel at `{}`: {}", self.op, self.message)
    }
}

impl std::error::Error for VerifyError {}

/// Grids with more programs than this have their index maps spot-checked (corners and
/// a stride) instead of checked at every program.
const FULL_INDEX_MAP_CHECK_LIMIT: u64 = 1 << 16;

/// Checks every rule of the IR.
pub fn verify(kernel: &Kernel) -> Result<(), VerifyError> {
    verify_header(kernel)?;
    let namer = Namer::new(kernel);
    let mut v = BodyVerifier {
        kernel,
        namer: &namer,
        defined: HashSet::new(),
    };
    v.region(&kernel.body, false).map(|_| ())
}

fn header_error(what: impl Into<String>, message: impl Into<String>) -> VerifyError {
    VerifyError {
        op: what.into(),
        message: message.into(),
    }
}

fn verify_header(kernel: &Kernel) -> Result<(), VerifyError> {
    let kname = format!("kernel @{}", kernel.name);
    if kernel.name.is_empty() {
        return Err(header_error(kname, "the kernel needs a name"));
    }
    if kernel.dimension_semantics.len() != kernel.grid.len() {
        return Err(header_error(
            kname,
            format!(
                "grid has rank {} but {} dimension semantics are given",
                kernel.grid.len(),
                kernel.dimension_semantics.len()
            ),
        ));
    }
    if let Some(axis) = kernel.grid.iter().position(|&g| g == 0) {
        return Err(header_error(kname, format!("grid axis {axis} has size 0")));
    }
    if kernel
        .grid
        .iter()
        .try_fold(1u64, |a, &g| a.checked_mul(g))
        .is_none()
    {
        return Err(header_error(kname, "the grid has more than 2^64 programs"));
    }
    if !kernel.refs.iter().any(|r| r.kind == RefKind::Output) {
        return Err(header_error(kname, "the kernel has no output"));
    }
    let mut names = HashSet::new();
    let mut last_kind = RefKind::Input;
    for r in &kernel.refs {
        let what = format!("{} %{}", r.kind.keyword(), r.name);
        if !names.insert(r.name.as_str()) {
            return Err(header_error(what, "the name is declared twice"));
        }
        if kind_order(r.kind) < kind_order(last_kind) {
            return Err(header_error(
                what,
                "refs must be declared inputs first, then outputs, then scratch",
            ));
        }
        last_kind = r.kind;
        if r.ty.shape.contains(&0) {
            return Err(header_error(
                what,
                format!("type {} has a zero dimension", r.ty),
            ));
        }
        if r.ty.byte_size().is_none() {
            return Err(header_error(what, too_large(&r.ty)));
        }
        match (&r.block, r.kind) {
            (None, RefKind::Scratch) => {}
            (Some(_), RefKind::Scratch) => {
                return Err(header_error(what, "scratch buffers take no block spec"))
            }
            (None, _) => return Err(header_error(what, "inputs and outputs need a block spec")),
            (Some(spec), _) => verify_block_spec(kernel, &what, &r.ty.shape, spec)?,
        }
    }
    verify_scalar_prefetch(kernel)
}

/// The operands index maps read are the kernel's leading inputs, each an i32 array whole
/// in SMEM at a fixed block (as Pallas's scalar prefetch), read at their rank.
fn verify_scalar_prefetch(kernel: &Kernel) -> Result<(), VerifyError> {
    for r in &kernel.refs {
        let Some(spec) = &r.block else { continue };
        let what = format!("{} %{}", r.kind.keyword(), r.name);
        for (read, rank) in spec.index_map.exprs.iter().flat_map(|e| e.scalar_reads()) {
            let Some(target) = kernel.refs.get(read.0 as usize) else {
                return Err(header_error(
                    what,
                    format!("index map reads ref {} of {}", read.0, kernel.refs.len()),
                ));
            };
            if rank != target.ty.rank() {
                return Err(header_error(
                    what,
                    format!(
                        "index map reads %{} with {rank} indices, but it has rank {}",
                        target.name,
                        target.ty.rank()
                    ),
                ));
            }
        }
    }
    for r in &kernel.refs[..kernel.scalar_prefetch()] {
        let whole = r.block.as_ref().is_some_and(|b| {
            b.memory_space == MemorySpace::Smem
                && b.block_shape
                    .iter()
                    .zip(&r.ty.shape)
                    .all(|(d, &n)| *d == BlockDim::Size(n))
                && b.index_map.exprs.iter().all(|e| *e == IndexExpr::Const(0))
        });
        if r.kind != RefKind::Input || r.ty.dtype != DType::I32 || !whole {
            return Err(header_error(
                format!("{} %{}", r.kind.keyword(), r.name),
                format!(
                    "a scalar-prefetch operand (index maps read the first {} inputs): it must \
                     be an i32 input whose block is the whole array in smem, at block 0",
                    kernel.scalar_prefetch()
                ),
            ));
        }
    }
    Ok(())
}

/// The message for a type whose byte size overflows.
fn too_large(ty: &crate::types::TensorType) -> String {
    format!("type {ty} is larger than any allocation can be (its byte size exceeds 2^63)")
}

fn kind_order(kind: RefKind) -> u8 {
    match kind {
        RefKind::Input => 0,
        RefKind::Output => 1,
        RefKind::Scratch => 2,
    }
}

fn verify_block_spec(
    kernel: &Kernel,
    what: &str,
    shape: &[u64],
    spec: &crate::ir::BlockSpec,
) -> Result<(), VerifyError> {
    let err = |m: String| Err(header_error(what, m));
    if spec.block_shape.len() != shape.len() {
        return err(format!(
            "block shape has rank {} but the array has rank {} (shape {shape:?})",
            spec.block_shape.len(),
            shape.len()
        ));
    }
    for (dim, (b, &n)) in spec.block_shape.iter().zip(shape).enumerate() {
        if let BlockDim::Size(size) = b {
            if *size == 0 || *size > n {
                return err(format!(
                    "block dim {dim} is {size}, which does not tile the array dim of {n}: \
                     use a block size in 1..={n}"
                ));
            }
        }
    }
    if spec.index_map.exprs.len() != shape.len() {
        return err(format!(
            "index map returns {} block indices but the array has rank {}",
            spec.index_map.exprs.len(),
            shape.len()
        ));
    }
    for e in &spec.index_map.exprs {
        if let Some(axis) = e.max_axis().filter(|&a| a >= kernel.grid.len()) {
            return err(format!(
                "index map uses program id {axis} but the grid has rank {}",
                kernel.grid.len()
            ));
        }
    }
    for pids in sample_programs(&kernel.grid) {
        block_starts(what, shape, spec, &pids, None)?;
    }
    Ok(())
}

/// Where the block that program `pids` maps to starts, per array dim, checked to lie
/// inside the array. Scalar-prefetch operands are read through `read`; without one (the
/// verifier, before any data exists) the dims that read them are not checked (start 0).
pub(crate) fn block_starts(
    what: &str,
    shape: &[u64],
    spec: &crate::ir::BlockSpec,
    pids: &[u64],
    mut read: Option<&mut crate::ir::ScalarRead>,
) -> Result<Vec<u64>, VerifyError> {
    let err = |m: String| Err(header_error(what, m));
    let mut starts = Vec::with_capacity(shape.len());
    for (dim, ((e, bd), &n)) in spec
        .index_map
        .exprs
        .iter()
        .zip(&spec.block_shape)
        .zip(shape)
        .enumerate()
    {
        let b = match read.as_deref_mut() {
            Some(read) => e.eval_with(pids, read),
            None => match e.eval_with(pids, &mut |_, _| Err(String::new())) {
                // Reads scalar-prefetch data, which does not exist yet.
                Err(why) if why.is_empty() => {
                    starts.push(0);
                    continue;
                }
                other => other,
            },
        };
        let b = match b {
            Ok(b) => b,
            Err(why) => {
                return err(format!(
                    "index map cannot be evaluated at program {pids:?} ({why})"
                ))
            }
        };
        let start = i128::from(b) * i128::from(bd.extent());
        if b < 0 || start >= i128::from(n) {
            return err(format!(
                "at program {pids:?} the index map gives block index {b} for dim {dim}, \
                 which starts at element {start}, outside the array dim of {n}"
            ));
        }
        starts.push(start as u64);
    }
    Ok(starts)
}

/// Every program of small grids; corners and a stride through large ones.
fn sample_programs(grid: &[u64]) -> Vec<Vec<u64>> {
    let total: u64 = grid.iter().product();
    if total <= FULL_INDEX_MAP_CHECK_LIMIT {
        return (0..total).map(|i| unflatten(i, grid)).collect();
    }
    let step = total / FULL_INDEX_MAP_CHECK_LIMIT + 1;
    let mut out: Vec<Vec<u64>> = (0..total)
        .step_by(step as usize)
        .map(|i| unflatten(i, grid))
        .collect();
    out.push(grid.iter().map(|g| g - 1).collect());
    out
}

/// Row-major program ids of the `i`-th program.
pub fn unflatten(mut i: u64, grid: &[u64]) -> Vec<u64> {
    let mut pids = vec![0; grid.len()];
    for axis in (0..grid.len()).rev() {
        pids[axis] = i % grid[axis];
        i /= grid[axis];
    }
    pids
}

struct BodyVerifier<'a> {
    kernel: &'a Kernel,
    namer: &'a Namer,
    defined: HashSet<Value>,
}

impl BodyVerifier<'_> {
    fn err(&self, op: &Op, message: impl Into<String>) -> VerifyError {
        VerifyError {
            op: self.namer.op_header(self.kernel, op),
            message: message.into(),
        }
    }

    fn define(&mut self, op: Option<&Op>, v: Value) -> Result<(), VerifyError> {
        if v.0 as usize >= self.kernel.value_types.len() {
            return Err(header_error(
                op.map_or("region".into(), |op| self.namer.op_header(self.kernel, op)),
                format!("value #{} has no type", v.0),
            ));
        }
        if !self.defined.insert(v) {
            return Err(header_error(
                op.map_or("region".into(), |op| self.namer.op_header(self.kernel, op)),
                format!("value {} is defined twice", self.namer.name(v)),
            ));
        }
        Ok(())
    }

    /// Verifies a region; nested regions must end with exactly one `yield`.
    fn region(&mut self, region: &Region, nested: bool) -> Result<Vec<Value>, VerifyError> {
        let scope_start: Vec<Value> = region.args.clone();
        for &a in &region.args {
            self.define(None, a)?;
        }
        let mut yielded = None;
        let mut local = Vec::new();
        for (i, op) in region.ops.iter().enumerate() {
            for (n, v) in op.kind.operands().into_iter().enumerate() {
                if !self.defined.contains(&v) {
                    return Err(self.err(
                        op,
                        format!("operand {n} (value #{}) is not defined before this op", v.0),
                    ));
                }
            }
            if let OpKind::Yield { values } = &op.kind {
                if !nested {
                    return Err(self.err(op, "`yield` is only allowed at the end of a region"));
                }
                if i + 1 != region.ops.len() {
                    return Err(self.err(op, "`yield` must be the last op of its region"));
                }
                yielded = Some(values.clone());
                continue;
            }
            self.op(op)?;
            for &r in &op.results {
                self.define(Some(op), r)?;
                local.push(r);
            }
        }
        // Values of this region go out of scope with it.
        for v in scope_start.iter().chain(&local) {
            self.defined.remove(v);
        }
        match (nested, yielded) {
            (true, None) => Err(header_error(
                "region",
                "a `for` body or `if` branch must end with `yield`",
            )),
            (_, y) => Ok(y.unwrap_or_default()),
        }
    }

    fn op(&mut self, op: &Op) -> Result<(), VerifyError> {
        let declared: Vec<_> = op
            .results
            .iter()
            .map(|&r| self.kernel.type_of(r).clone())
            .collect();
        if let Some((i, d)) = declared
            .iter()
            .enumerate()
            .find(|(_, d)| d.byte_size().is_none())
        {
            return Err(self.err(op, format!("result {i}: {}", too_large(d))));
        }
        let expected = infer(self.kernel, &op.kind, &declared, self.kernel.grid.len())
            .map_err(|m| self.err(op, m))?;
        if expected.len() != declared.len() {
            return Err(self.err(
                op,
                format!(
                    "has {} results, expected {}",
                    declared.len(),
                    expected.len()
                ),
            ));
        }
        for (i, (e, d)) in expected.iter().zip(&declared).enumerate() {
            if e != d {
                return Err(self.err(op, format!("result {i} has type {d}, expected {e}")));
            }
        }
        match &op.kind {
            OpKind::For { inits, body, .. } => {
                let carried_types: Vec<_> = inits.iter().map(|&v| self.kernel.type_of(v)).collect();
                if body.args.len() != inits.len() + 1 {
                    return Err(self.err(
                        op,
                        format!(
                            "body has {} arguments, expected the induction variable and {} carried values",
                            body.args.len(),
                            inits.len()
                        ),
                    ));
                }
                let iv_ty = self.kernel.type_of(body.args[0]);
                if *iv_ty != crate::types::TensorType::scalar(crate::types::DType::I32) {
                    return Err(self.err(
                        op,
                        format!("induction variable has type {iv_ty}, expected i32"),
                    ));
                }
                for (i, (&arg, t)) in body.args[1..].iter().zip(&carried_types).enumerate() {
                    let at = self.kernel.type_of(arg);
                    if at != *t {
                        return Err(self.err(
                            op,
                            format!("carried value {i} has type {at} in the body, expected {t}"),
                        ));
                    }
                }
                let yielded = self.region(body, true)?;
                self.check_yield(
                    op,
                    "the loop body",
                    &yielded,
                    &carried_types.into_iter().cloned().collect::<Vec<_>>(),
                )
            }
            OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                for (name, region) in [("then", then_region), ("else", else_region)] {
                    if !region.args.is_empty() {
                        return Err(self.err(op, format!("the {name} region takes no arguments")));
                    }
                    let yielded = self.region(region, true)?;
                    self.check_yield(op, &format!("the {name} branch"), &yielded, &declared)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn check_yield(
        &self,
        op: &Op,
        what: &str,
        yielded: &[Value],
        expected: &[crate::types::TensorType],
    ) -> Result<(), VerifyError> {
        if yielded.len() != expected.len() {
            return Err(self.err(
                op,
                format!(
                    "{what} yields {} values, expected {}",
                    yielded.len(),
                    expected.len()
                ),
            ));
        }
        for (i, (&v, t)) in yielded.iter().zip(expected).enumerate() {
            let vt = self.kernel.type_of(v);
            if vt != t {
                return Err(self.err(op, format!("{what} yields {vt} as value {i}, expected {t}")));
            }
        }
        Ok(())
    }
}
