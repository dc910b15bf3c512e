//! Result-type rules of every op, shared by the builder (to type new values) and the
//! verifier (to check recorded types). Each rule explains a violation in one sentence.

use crate::ir::{dot_result_dtype, BinaryOp, Index, Kernel, OpKind, RefDecl, Start, UnaryOp};
use crate::types::{DType, TensorType};

/// What an op's type rule needs to see: the types of values and the ref declarations.
pub(crate) trait TypeEnv {
    fn value_type(&self, v: crate::ir::Value) -> &TensorType;
    fn ref_decl(&self, r: crate::ir::RefId) -> Option<&RefDecl>;
}

impl TypeEnv for Kernel {
    fn value_type(&self, v: crate::ir::Value) -> &TensorType {
        self.type_of(v)
    }
    fn ref_decl(&self, r: crate::ir::RefId) -> Option<&RefDecl> {
        self.refs.get(r.0 as usize)
    }
}

/// Shape of the window that `index` selects from a ref whose kernel type is `ref_ty`.
pub(crate) fn window_type(
    env: &impl TypeEnv,
    ref_ty: &TensorType,
    index: &[Index],
) -> Result<TensorType, String> {
    if index.len() != ref_ty.rank() {
        return Err(format!(
            "has {} indices but the ref has rank {} (type {ref_ty})",
            index.len(),
            ref_ty.rank()
        ));
    }
    let mut shape = Vec::new();
    for (dim, (ix, &extent)) in index.iter().zip(&ref_ty.shape).enumerate() {
        match ix {
            Index::Full => shape.push(extent),
            Index::At(v) => {
                expect_index_scalar(env, *v, &format!("index of dim {dim}"))?;
            }
            Index::Slice { start, size } => {
                if *size == 0 || *size > extent {
                    return Err(format!(
                        "slice of dim {dim} has size {size}, expected 1..={extent} (the ref's extent)"
                    ));
                }
                match start {
                    Start::Static(s) if s + size > extent => {
                        return Err(format!(
                            "slice of dim {dim} covers [{s}, {}) but the ref's extent is {extent}",
                            s + size
                        ))
                    }
                    Start::Dynamic(v) => {
                        expect_index_scalar(env, *v, &format!("start of dim {dim}"))?
                    }
                    _ => {}
                }
                shape.push(*size);
            }
        }
    }
    Ok(TensorType::new(ref_ty.dtype, shape))
}

fn expect_index_scalar(env: &impl TypeEnv, v: crate::ir::Value, what: &str) -> Result<(), String> {
    let ty = env.value_type(v);
    if *ty != TensorType::scalar(DType::I32) {
        return Err(format!("{what} has type {ty}, expected i32"));
    }
    Ok(())
}

/// The result types of `op`, or why its operands are ill-typed. Ops whose result type is
/// an attribute (`const`, `iota`, `broadcast`, `reshape`, `cast`, `if`) are checked
/// against `declared`, the types recorded for their results.
pub(crate) fn infer(
    env: &impl TypeEnv,
    op: &OpKind,
    declared: &[TensorType],
    grid_rank: usize,
) -> Result<Vec<TensorType>, String> {
    let ty = |v| env.value_type(v).clone();
    let declared_one = || -> Result<TensorType, String> {
        match declared {
            [t] => Ok(t.clone()),
            _ => Err(format!(
                "must have exactly one result, found {}",
                declared.len()
            )),
        }
    };
    match op {
        OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
            if *axis >= grid_rank {
                return Err(format!(
                    "axis {axis} is out of range for a grid of rank {grid_rank}"
                ));
            }
            Ok(vec![TensorType::scalar(DType::I32)])
        }
        OpKind::Constant { value } => {
            let t = declared_one()?;
            let ok = match value {
                crate::ir::Literal::Float(_) => t.dtype.is_float(),
                crate::ir::Literal::Int(i) => {
                    t.dtype == DType::I32 && i32::try_from(*i).is_ok() || t.dtype.is_float()
                }
                crate::ir::Literal::Bool(_) => t.dtype == DType::Bool,
            };
            if !ok {
                return Err(format!("literal {value:?} does not fit type {t}"));
            }
            Ok(vec![t])
        }
        OpKind::Iota { dim } => {
            let t = declared_one()?;
            if t.dtype != DType::I32 || *dim >= t.rank() {
                return Err(format!(
                    "dimension {dim} must be < the rank of an i32 result, found {t}"
                ));
            }
            Ok(vec![t])
        }
        OpKind::Load {
            src,
            index,
            mask,
            other,
        } => {
            let decl = env
                .ref_decl(*src)
                .ok_or_else(|| format!("ref #{} does not exist", src.0))?;
            let window = window_type(env, &decl.kernel_type(), index)
                .map_err(|e| format!("ref %{}: {e}", decl.name))?;
            if let Some(m) = mask {
                let mt = ty(*m);
                if mt != window.with_dtype(DType::Bool) {
                    return Err(format!(
                        "mask has type {mt}, expected {}",
                        window.with_dtype(DType::Bool)
                    ));
                }
            }
            if let Some(o) = other {
                let ot = ty(*o);
                if ot != TensorType::scalar(window.dtype) {
                    return Err(format!("other has type {ot}, expected {}", window.dtype));
                }
            }
            Ok(vec![window])
        }
        OpKind::Store {
            dst,
            index,
            value,
            mask,
        } => {
            let decl = env
                .ref_decl(*dst)
                .ok_or_else(|| format!("ref #{} does not exist", dst.0))?;
            if decl.kind == crate::ir::RefKind::Input {
                return Err(format!(
                    "ref %{} is an input and cannot be stored to",
                    decl.name
                ));
            }
            let window = window_type(env, &decl.kernel_type(), index)
                .map_err(|e| format!("ref %{}: {e}", decl.name))?;
            let vt = ty(*value);
            if vt != window {
                return Err(format!("stored value has type {vt}, expected {window}"));
            }
            if let Some(m) = mask {
                let mt = ty(*m);
                if mt != window.with_dtype(DType::Bool) {
                    return Err(format!(
                        "mask has type {mt}, expected {}",
                        window.with_dtype(DType::Bool)
                    ));
                }
            }
            Ok(vec![])
        }
        OpKind::Broadcast { x, dims } => {
            let t = declared_one()?;
            let xt = ty(*x);
            if t.dtype != xt.dtype {
                return Err(format!(
                    "result dtype {} differs from operand {xt}",
                    t.dtype
                ));
            }
            if dims.len() != xt.rank() {
                return Err(format!(
                    "has {} dims but the operand {xt} has rank {}",
                    dims.len(),
                    xt.rank()
                ));
            }
            if dims
                .iter()
                .enumerate()
                .any(|(i, &d)| d >= t.rank() || (i > 0 && d <= dims[i - 1]))
            {
                return Err(format!(
                    "dims {dims:?} must be increasing and < the result rank {}",
                    t.rank()
                ));
            }
            for (i, &d) in dims.iter().enumerate() {
                let (from, to) = (xt.shape[i], t.shape[d]);
                if from != 1 && from != to {
                    return Err(format!(
                        "operand dim {i} has size {from}, cannot broadcast to {to} (result {t})"
                    ));
                }
            }
            Ok(vec![t])
        }
        OpKind::Reshape { x } => {
            let t = declared_one()?;
            let xt = ty(*x);
            if t.dtype != xt.dtype || t.num_elements() != xt.num_elements() {
                return Err(format!("cannot reshape {xt} to {t}"));
            }
            Ok(vec![t])
        }
        OpKind::Transpose { x, perm } => {
            let xt = ty(*x);
            let mut seen = vec![false; xt.rank()];
            if perm.len() != xt.rank()
                || perm
                    .iter()
                    .any(|&p| p >= xt.rank() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!(
                    "perm {perm:?} is not a permutation of the dims of {xt}"
                ));
            }
            Ok(vec![TensorType::new(
                xt.dtype,
                perm.iter().map(|&p| xt.shape[p]).collect::<Vec<_>>(),
            )])
        }
        OpKind::Unary { op, x } => {
            let xt = ty(*x);
            let ok = match op {
                UnaryOp::Neg | UnaryOp::Abs => xt.dtype != DType::Bool,
                UnaryOp::Not => matches!(xt.dtype, DType::Bool | DType::I32),
                _ => xt.dtype.is_float(),
            };
            if !ok {
                return Err(format!("`{}` does not accept {}", op.name(), xt.dtype));
            }
            Ok(vec![xt])
        }
        OpKind::Binary { op, lhs, rhs } => {
            let (lt, rt) = (ty(*lhs), ty(*rhs));
            if lt != rt {
                return Err(format!(
                    "operand 1 has type {rt}, expected {lt} (the type of operand 0)"
                ));
            }
            let ok = match op {
                BinaryOp::And | BinaryOp::Or => matches!(lt.dtype, DType::Bool | DType::I32),
                BinaryOp::Pow => lt.dtype.is_float(),
                _ => lt.dtype != DType::Bool,
            };
            if !ok {
                return Err(format!("`{}` does not accept {}", op.name(), lt.dtype));
            }
            Ok(vec![lt])
        }
        OpKind::Compare { lhs, rhs, .. } => {
            let (lt, rt) = (ty(*lhs), ty(*rhs));
            if lt != rt {
                return Err(format!(
                    "operand 1 has type {rt}, expected {lt} (the type of operand 0)"
                ));
            }
            Ok(vec![lt.with_dtype(DType::Bool)])
        }
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => {
            let (ct, tt, ft) = (ty(*cond), ty(*on_true), ty(*on_false));
            if tt != ft {
                return Err(format!(
                    "operand 2 has type {ft}, expected {tt} (the type of operand 1)"
                ));
            }
            if ct != tt.with_dtype(DType::Bool) {
                return Err(format!(
                    "condition has type {ct}, expected {}",
                    tt.with_dtype(DType::Bool)
                ));
            }
            Ok(vec![tt])
        }
        OpKind::Cast { x } => {
            let t = declared_one()?;
            let xt = ty(*x);
            if t.shape != xt.shape {
                return Err(format!("cannot cast {xt} to {t}: shapes differ"));
            }
            Ok(vec![t])
        }
        OpKind::Reduce { op, x, axes } => {
            let xt = ty(*x);
            if xt.dtype == DType::Bool {
                return Err(format!("`{}` does not accept bool", op.name()));
            }
            if axes.is_empty()
                || axes
                    .iter()
                    .enumerate()
                    .any(|(i, &a)| a >= xt.rank() || (i > 0 && a <= axes[i - 1]))
            {
                return Err(format!(
                    "axes {axes:?} must be non-empty, increasing and < the rank of {xt}"
                ));
            }
            let shape: Vec<u64> = xt
                .shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect();
            Ok(vec![TensorType::new(xt.dtype, shape)])
        }
        OpKind::Dot {
            lhs,
            rhs,
            transpose_lhs,
            transpose_rhs,
        } => {
            let (lt, rt) = (ty(*lhs), ty(*rhs));
            if lt.rank() != 2 || rt.rank() != 2 {
                return Err(format!("operands must be 2-D, found {lt} and {rt}"));
            }
            if lt.dtype != rt.dtype || lt.dtype == DType::Bool {
                return Err(format!(
                    "operands must share a numeric dtype, found {lt} and {rt}"
                ));
            }
            let (m, k1) = if *transpose_lhs {
                (lt.shape[1], lt.shape[0])
            } else {
                (lt.shape[0], lt.shape[1])
            };
            let (k2, n) = if *transpose_rhs {
                (rt.shape[1], rt.shape[0])
            } else {
                (rt.shape[0], rt.shape[1])
            };
            if k1 != k2 {
                return Err(format!(
                    "contracting dims differ: lhs {lt} gives K={k1}, rhs {rt} gives K={k2}"
                ));
            }
            Ok(vec![TensorType::new(dot_result_dtype(lt.dtype), [m, n])])
        }
        OpKind::For {
            lower,
            upper,
            step,
            inits,
            ..
        } => {
            for (name, v) in [("lower", lower), ("upper", upper), ("step", step)] {
                expect_index_scalar(env, *v, &format!("{name} bound"))?;
            }
            Ok(inits.iter().map(|&v| ty(v)).collect())
        }
        OpKind::If { cond, .. } => {
            let ct = ty(*cond);
            if ct != TensorType::scalar(DType::Bool) {
                return Err(format!("condition has type {ct}, expected bool"));
            }
            Ok(declared.to_vec())
        }
        OpKind::Yield { .. } => Ok(vec![]),
    }
}
