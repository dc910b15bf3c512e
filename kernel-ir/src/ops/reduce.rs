//! Reductions over axes (`reduce_sum`, `reduce_max`, `reduce_min`); the reduced axes
//! leave the shape. Floats accumulate in f32 whatever their dtype; max/min propagate NaN.

use super::elementwise::{nan_max, nan_min, rounded};
use super::layout::mapped_offsets;
use super::{not_in_family, EvalCx, TypeCx};
use crate::array::{Array, ArrayData};
use crate::ir::{OpKind, ReduceOp};
use crate::types::{row_major_strides, DType, TensorType};

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    let OpKind::Reduce { op, x, axes } = op else {
        not_in_family(op, "reduce")
    };
    let xt = cx.ty(*x);
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
    Ok(vec![TensorType::new(xt.dtype, kept_shape(&xt.shape, axes))])
}

/// The shape without the reduced axes.
fn kept_shape(shape: &[u64], axes: &[usize]) -> Vec<u64> {
    shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect()
}

pub(super) fn eval(op: &OpKind, cx: &EvalCx) -> Array {
    let OpKind::Reduce { op, x, axes } = op else {
        not_in_family(op, "reduce")
    };
    reduce(*op, &(cx.operand)(*x), axes)
}

fn reduce_into<T: Copy>(
    v: &[T],
    shape: &[u64],
    axes: &[usize],
    init: T,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let kept: Vec<u64> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let out_len: u64 = kept.iter().product();
    let mut out = vec![init; out_len as usize];
    // Fast path: reducing the trailing axes of a row-major array.
    let trailing = axes
        .iter()
        .rev()
        .enumerate()
        .all(|(i, &a)| a == shape.len() - 1 - i);
    if trailing {
        let row = (v.len() as u64 / out_len.max(1)) as usize;
        for (o, chunk) in out.iter_mut().zip(v.chunks_exact(row.max(1))) {
            *o = chunk.iter().fold(init, |acc, &x| f(acc, x));
        }
        return out;
    }
    let out_strides = row_major_strides(&kept);
    let strides: Vec<u64> = (0..shape.len())
        .map(|d| if axes.contains(&d) { 0 } else { out_strides[d] })
        .collect();
    for (x, o) in v.iter().zip(mapped_offsets(shape, &strides)) {
        out[o] = f(out[o], *x);
    }
    out
}

fn reduce(op: ReduceOp, x: &Array, axes: &[usize]) -> Array {
    let ty = TensorType::new(x.dtype(), kept_shape(x.shape(), axes));
    let data = match x.data() {
        ArrayData::Float(v) => rounded(
            ty.dtype,
            match op {
                ReduceOp::Sum => reduce_into(v, x.shape(), axes, 0.0, |a, b| a + b),
                ReduceOp::Max => reduce_into(v, x.shape(), axes, f32::NEG_INFINITY, nan_max),
                ReduceOp::Min => reduce_into(v, x.shape(), axes, f32::INFINITY, nan_min),
            },
        ),
        ArrayData::Int(v) => ArrayData::Int(match op {
            ReduceOp::Sum => reduce_into(v, x.shape(), axes, 0, i32::wrapping_add),
            ReduceOp::Max => reduce_into(v, x.shape(), axes, i32::MIN, i32::max),
            ReduceOp::Min => reduce_into(v, x.shape(), axes, i32::MAX, i32::min),
        }),
        ArrayData::Bool(_) => unreachable!("verifier rejects reductions of bool"),
    };
    Array::from_parts(ty, data)
}

impl ReduceOp {
    /// The reduction's identity in accumulator dtype `acc` (what an empty reduction
    /// gives, and every lowering's initial value).
    pub fn identity(self, acc: DType) -> f64 {
        match (self, acc) {
            (ReduceOp::Sum, _) => 0.0,
            (ReduceOp::Max, DType::I32) => f64::from(i32::MIN),
            (ReduceOp::Min, DType::I32) => f64::from(i32::MAX),
            (ReduceOp::Max, _) => f64::NEG_INFINITY,
            (ReduceOp::Min, _) => f64::INFINITY,
        }
    }
}
