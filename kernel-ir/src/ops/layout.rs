//! Ops that move elements without computing them: `broadcast` (StableHLO
//! `broadcast_in_dim`), `reshape` (row-major), `transpose`, and `gather` (NumPy
//! `take_along_axis`, indices clamped into range).

use super::{not_in_family, EvalCx, TypeCx};
use crate::array::{Array, ArrayData};
use crate::ir::OpKind;
use crate::types::{row_major_strides, DType, TensorType};

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::Broadcast { x, dims } => {
            let t = cx.declared_one()?;
            let xt = cx.ty(*x);
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
            let t = cx.declared_one()?;
            let xt = cx.ty(*x);
            if t.dtype != xt.dtype || t.num_elements() != xt.num_elements() {
                return Err(format!("cannot reshape {xt} to {t}"));
            }
            Ok(vec![t])
        }
        OpKind::Transpose { x, perm } => {
            let xt = cx.ty(*x);
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
        OpKind::Gather { x, indices, axis } => {
            let (xt, it) = (cx.ty(*x), cx.ty(*indices));
            if it.dtype != DType::I32 {
                return Err(format!("indices have type {it}, expected i32"));
            }
            if *axis >= xt.rank() {
                return Err(format!("axis {axis} is out of range for {xt}"));
            }
            let other_dims_agree = it.rank() == xt.rank()
                && (0..xt.rank()).all(|d| d == *axis || it.shape[d] == xt.shape[d]);
            if !other_dims_agree {
                return Err(format!(
                    "indices {it} must have the rank of the operand {xt} and its size on every dim but {axis}"
                ));
            }
            Ok(vec![TensorType::new(xt.dtype, it.shape.clone())])
        }
        _ => not_in_family(op, "layout"),
    }
}

pub(super) fn eval(op: &OpKind, cx: &EvalCx) -> Array {
    let get = cx.operand;
    match op {
        OpKind::Broadcast { x, dims } => broadcast(&get(*x), dims, cx.result),
        OpKind::Reshape { x } => Array::from_parts(cx.result.clone(), get(*x).data().clone()),
        OpKind::Transpose { x, perm } => transpose(&get(*x), perm),
        OpKind::Gather { x, indices, axis } => gather(&get(*x), &get(*indices), *axis),
        _ => not_in_family(op, "layout"),
    }
}

/// For each element of a `from`-shaped array, the offset of the element it maps to,
/// where `strides[d]` is the step (possibly 0) of dimension `d` in the other array.
pub(super) fn mapped_offsets(from: &[u64], strides: &[u64]) -> Vec<usize> {
    let n: u64 = from.iter().product();
    let mut out = Vec::with_capacity(n as usize);
    if from.is_empty() {
        out.push(0);
        return out;
    }
    let mut idx = vec![0u64; from.len()];
    let mut off = 0u64;
    for _ in 0..n {
        out.push(off as usize);
        let mut d = from.len();
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            off += strides[d];
            if idx[d] < from[d] {
                break;
            }
            off -= strides[d] * idx[d];
            idx[d] = 0;
        }
    }
    out
}

fn permute_data(data: &ArrayData, offsets: &[usize]) -> ArrayData {
    match data {
        ArrayData::Float(v) => ArrayData::Float(offsets.iter().map(|&o| v[o]).collect()),
        ArrayData::Int(v) => ArrayData::Int(offsets.iter().map(|&o| v[o]).collect()),
        ArrayData::Bool(v) => ArrayData::Bool(offsets.iter().map(|&o| v[o]).collect()),
    }
}

fn broadcast(x: &Array, dims: &[usize], ty: &TensorType) -> Array {
    let src_strides = row_major_strides(x.shape());
    let mut strides = vec![0u64; ty.rank()];
    for (i, &d) in dims.iter().enumerate() {
        if x.shape()[i] != 1 {
            strides[d] = src_strides[i];
        }
    }
    let offsets = mapped_offsets(&ty.shape, &strides);
    Array::from_parts(ty.clone(), permute_data(x.data(), &offsets))
}

/// Result dim `i` is `x`'s dim `perm[i]`.
pub(super) fn transpose(x: &Array, perm: &[usize]) -> Array {
    let src_strides = row_major_strides(x.shape());
    let shape: Vec<u64> = perm.iter().map(|&p| x.shape()[p]).collect();
    let strides: Vec<u64> = perm.iter().map(|&p| src_strides[p]).collect();
    let offsets = mapped_offsets(&shape, &strides);
    Array::from_parts(
        TensorType::new(x.dtype(), shape),
        permute_data(x.data(), &offsets),
    )
}

/// `take_along_axis` with each index clamped into `0..x.shape[axis]`.
fn gather(x: &Array, indices: &Array, axis: usize) -> Array {
    let ArrayData::Int(picks) = indices.data() else {
        unreachable!("the type rule admits i32 indices only")
    };
    let strides = row_major_strides(x.shape());
    let last = x.shape()[axis] as i64 - 1;
    // The offset in `x` of each result element with its own index along `axis` at 0.
    let mut base_strides = strides.clone();
    base_strides[axis] = 0;
    let offsets: Vec<usize> = mapped_offsets(indices.shape(), &base_strides)
        .into_iter()
        .zip(picks.iter())
        .map(|(base, &i)| base + (i as i64).clamp(0, last) as usize * strides[axis] as usize)
        .collect();
    Array::from_parts(
        TensorType::new(x.dtype(), indices.shape().to_vec()),
        permute_data(x.data(), &offsets),
    )
}
