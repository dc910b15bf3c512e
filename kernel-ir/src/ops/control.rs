//! Structured control flow: `for` (i32 bounds, carried values), `if` (two regions) and
//! the `yield` that ends their regions. Their interpreter rule is the interpreter's own
//! region loop; [`Region::walk`](crate::Region::walk) visits nested ops.

use super::{not_in_family, OpTraits, TypeCx};
use crate::ir::OpKind;
use crate::types::{DType, TensorType};

pub(super) fn traits(op: &OpKind) -> OpTraits {
    OpTraits {
        pure: false,
        elementwise: false,
        has_regions: !matches!(op, OpKind::Yield { .. }),
    }
}

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::For {
            lower,
            upper,
            step,
            inits,
            ..
        } => {
            for (name, v) in [("lower", lower), ("upper", upper), ("step", step)] {
                cx.expect_index_scalar(*v, &format!("{name} bound"))?;
            }
            Ok(inits.iter().map(|&v| cx.ty(v)).collect())
        }
        OpKind::If { cond, .. } => {
            let ct = cx.ty(*cond);
            if ct != TensorType::scalar(DType::Bool) {
                return Err(format!("condition has type {ct}, expected bool"));
            }
            Ok(cx.declared.to_vec())
        }
        OpKind::Yield { .. } => Ok(vec![]),
        _ => not_in_family(op, "control"),
    }
}
