//! `dot`: the matrix product of 2-D operands, optionally contracting over the other dim
//! of either, accumulated in f32 (floats) or i32.

use super::layout::transpose;
use super::{not_in_family, EvalCx, TypeCx};
use crate::array::{Array, ArrayData};
use crate::ir::OpKind;
use crate::types::{DType, TensorType};

/// The dtype reductions and dots accumulate (and dots return) in: f32 for every float
/// dtype, the dtype itself otherwise.
pub fn accumulator_dtype(dtype: DType) -> DType {
    if dtype.is_float() {
        DType::F32
    } else {
        dtype
    }
}

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    let OpKind::Dot {
        lhs,
        rhs,
        transpose_lhs,
        transpose_rhs,
    } = op
    else {
        not_in_family(op, "dot")
    };
    let (lt, rt) = (cx.ty(*lhs), cx.ty(*rhs));
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
    Ok(vec![TensorType::new(accumulator_dtype(lt.dtype), [m, n])])
}

pub(super) fn eval(op: &OpKind, cx: &EvalCx) -> Array {
    let OpKind::Dot {
        lhs,
        rhs,
        transpose_lhs,
        transpose_rhs,
    } = op
    else {
        not_in_family(op, "dot")
    };
    let oriented = |v, transposed: bool| {
        let a = (cx.operand)(v);
        if transposed {
            transpose(&a, &[1, 0])
        } else {
            (*a).clone()
        }
    };
    dot(
        &oriented(*lhs, *transpose_lhs),
        &oriented(*rhs, *transpose_rhs),
    )
}

/// `[M, K] x [K, N]` into `c` (row-major, zeroed), i-k-j order so the inner loop vectorises.
fn matmul<T: Copy + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    (m, k, n): (usize, usize, usize),
) {
    for i in 0..m {
        let crow = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let aip = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for (cj, &bj) in crow.iter_mut().zip(brow) {
                *cj = *cj + aip * bj;
            }
        }
    }
}

fn dot(a: &Array, b: &Array) -> Array {
    let (m, k, n) = (
        a.shape()[0] as usize,
        a.shape()[1] as usize,
        b.shape()[1] as usize,
    );
    let result_ty = |d| TensorType::new(d, [m as u64, n as u64]);
    match (a.data(), b.data()) {
        (ArrayData::Float(x), ArrayData::Float(y)) => {
            let mut c = vec![0.0f32; m * n];
            matmul(x, y, &mut c, (m, k, n));
            Array::from_parts(result_ty(DType::F32), ArrayData::Float(c))
        }
        (ArrayData::Int(x), ArrayData::Int(y)) => {
            let mut c = vec![std::num::Wrapping(0i32); m * n];
            let wx: Vec<_> = x.iter().map(|&v| std::num::Wrapping(v)).collect();
            let wy: Vec<_> = y.iter().map(|&v| std::num::Wrapping(v)).collect();
            matmul(&wx, &wy, &mut c, (m, k, n));
            Array::from_parts(
                result_ty(DType::I32),
                ArrayData::Int(c.into_iter().map(|w| w.0).collect()),
            )
        }
        _ => unreachable!("verifier rejects dot of bool"),
    }
}
