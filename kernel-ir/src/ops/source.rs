//! Ops with no operands: `program_id`, `num_programs` (i32 scalars from the grid),
//! `const` (a literal splatted over its declared type) and `iota` (positions along a dim).

use super::{not_in_family, EvalCx, TypeCx};
use crate::array::{Array, ArrayData};
use crate::ir::{Literal, OpKind};
use crate::types::{row_major_strides, DType, TensorType};

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
            if *axis >= cx.grid_rank {
                return Err(format!(
                    "axis {axis} is out of range for a grid of rank {}",
                    cx.grid_rank
                ));
            }
            Ok(vec![TensorType::scalar(DType::I32)])
        }
        OpKind::Constant { value } => {
            let t = cx.declared_one()?;
            let ok = match value {
                Literal::Float(_) => t.dtype.is_float(),
                Literal::Int(i) => {
                    t.dtype == DType::I32 && i32::try_from(*i).is_ok() || t.dtype.is_float()
                }
                Literal::Bool(_) => t.dtype == DType::Bool,
            };
            if !ok {
                return Err(format!("literal {value:?} does not fit type {t}"));
            }
            Ok(vec![t])
        }
        OpKind::Iota { dim } => {
            let t = cx.declared_one()?;
            if t.dtype != DType::I32 || *dim >= t.rank() {
                return Err(format!(
                    "dimension {dim} must be < the rank of an i32 result, found {t}"
                ));
            }
            Ok(vec![t])
        }
        _ => not_in_family(op, "source"),
    }
}

pub(super) fn eval(op: &OpKind, cx: &EvalCx) -> Array {
    let ty = cx.result.clone();
    match op {
        OpKind::ProgramId { axis } => Array::filled(ty, cx.pids[*axis] as f64),
        OpKind::NumPrograms { axis } => Array::filled(ty, cx.grid[*axis] as f64),
        OpKind::Constant { value } => Array::filled(ty, value.as_f64()),
        OpKind::Iota { dim } => {
            let strides = row_major_strides(&ty.shape);
            let n = ty.num_elements() as usize;
            let (stride, extent) = (strides[*dim] as usize, ty.shape[*dim] as usize);
            let data = (0..n).map(|i| ((i / stride) % extent) as i32).collect();
            Array::from_parts(ty, ArrayData::Int(data))
        }
        _ => not_in_family(op, "source"),
    }
}
