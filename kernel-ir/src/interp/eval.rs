//! Semantics of the value ops (everything but memory and control flow) on whole arrays.

use crate::array::{round_to, Array, ArrayData};
use crate::ir::{BinaryOp, CmpPred, Literal, ReduceOp, UnaryOp};
use crate::types::{row_major_strides, DType, TensorType};

/// Rounds every element to the dtype's precision when it is narrower than f32.
fn rounded(dtype: DType, mut v: Vec<f32>) -> ArrayData {
    if matches!(dtype, DType::BF16 | DType::F16) {
        v.iter_mut().for_each(|x| *x = round_to(dtype, *x));
    }
    ArrayData::Float(v)
}

/// NaN-propagating maximum (so poisoned values are never hidden).
#[inline]
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum.
#[inline]
fn nan_min(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

pub(super) fn constant(value: Literal, ty: &TensorType) -> Array {
    let f = match value {
        Literal::Float(f) => f,
        Literal::Int(i) => i as f64,
        Literal::Bool(b) => f64::from(u8::from(b)),
    };
    Array::filled(ty.clone(), f)
}

pub(super) fn iota(ty: &TensorType, dim: usize) -> Array {
    let strides = row_major_strides(&ty.shape);
    let n = ty.num_elements() as usize;
    let (stride, extent) = (strides[dim] as usize, ty.shape[dim] as usize);
    let data = (0..n).map(|i| ((i / stride) % extent) as i32).collect();
    Array::from_parts(ty.clone(), ArrayData::Int(data))
}

pub(super) fn unary(op: UnaryOp, x: &Array) -> Array {
    let ty = x.ty().clone();
    let data = match x.data() {
        ArrayData::Float(v) => {
            let f: fn(f32) -> f32 = match op {
                UnaryOp::Neg => |a| -a,
                UnaryOp::Abs => f32::abs,
                UnaryOp::Exp => f32::exp,
                UnaryOp::Log => f32::ln,
                UnaryOp::Tanh => f32::tanh,
                UnaryOp::Rsqrt => |a| 1.0 / a.sqrt(),
                UnaryOp::Sqrt => f32::sqrt,
                UnaryOp::Erf => libm::erff,
                UnaryOp::Not => unreachable!("verifier rejects `not` on floats"),
            };
            rounded(ty.dtype, v.iter().map(|&a| f(a)).collect())
        }
        ArrayData::Int(v) => ArrayData::Int(match op {
            UnaryOp::Neg => v.iter().map(|a| a.wrapping_neg()).collect(),
            UnaryOp::Abs => v.iter().map(|a| a.wrapping_abs()).collect(),
            _ => v.iter().map(|a| !a).collect(),
        }),
        ArrayData::Bool(v) => ArrayData::Bool(v.iter().map(|a| !a).collect()),
    };
    Array::from_parts(ty, data)
}

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// Integer division and remainder round toward negative infinity (Python semantics).
pub(super) fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Array, String> {
    let ty = a.ty().clone();
    let data = match (a.data(), b.data()) {
        (ArrayData::Float(x), ArrayData::Float(y)) => rounded(
            ty.dtype,
            match op {
                BinaryOp::Add => zip(x, y, |p, q| p + q),
                BinaryOp::Sub => zip(x, y, |p, q| p - q),
                BinaryOp::Mul => zip(x, y, |p, q| p * q),
                BinaryOp::Div => zip(x, y, |p, q| p / q),
                BinaryOp::Rem => zip(x, y, |p, q| p - q * (p / q).floor()),
                BinaryOp::Max => zip(x, y, nan_max),
                BinaryOp::Min => zip(x, y, nan_min),
                BinaryOp::Pow => zip(x, y, f32::powf),
                BinaryOp::And | BinaryOp::Or => unreachable!("verifier rejects and/or on floats"),
            },
        ),
        (ArrayData::Int(x), ArrayData::Int(y)) => {
            if matches!(op, BinaryOp::Div | BinaryOp::Rem) && y.contains(&0) {
                return Err("integer division by zero".into());
            }
            ArrayData::Int(match op {
                BinaryOp::Add => zip(x, y, i32::wrapping_add),
                BinaryOp::Sub => zip(x, y, i32::wrapping_sub),
                BinaryOp::Mul => zip(x, y, i32::wrapping_mul),
                BinaryOp::Div => zip(x, y, |p, q| {
                    let d = p.wrapping_div(q);
                    if p.wrapping_rem(q) != 0 && ((p < 0) != (q < 0)) {
                        d - 1
                    } else {
                        d
                    }
                }),
                BinaryOp::Rem => zip(x, y, |p, q| {
                    let r = p.wrapping_rem(q);
                    if r != 0 && ((r < 0) != (q < 0)) {
                        r + q
                    } else {
                        r
                    }
                }),
                BinaryOp::Max => zip(x, y, i32::max),
                BinaryOp::Min => zip(x, y, i32::min),
                BinaryOp::And => zip(x, y, |p, q| p & q),
                BinaryOp::Or => zip(x, y, |p, q| p | q),
                BinaryOp::Pow => unreachable!("verifier rejects pow on integers"),
            })
        }
        (ArrayData::Bool(x), ArrayData::Bool(y)) => ArrayData::Bool(match op {
            BinaryOp::And => zip(x, y, |p, q| p & q),
            _ => zip(x, y, |p, q| p | q),
        }),
        _ => unreachable!("verifier checks operand types"),
    };
    Ok(Array::from_parts(ty, data))
}

fn cmp<T: PartialOrd>(pred: CmpPred, a: T, b: T) -> bool {
    match pred {
        CmpPred::Eq => a == b,
        CmpPred::Ne => a != b,
        CmpPred::Lt => a < b,
        CmpPred::Le => a <= b,
        CmpPred::Gt => a > b,
        CmpPred::Ge => a >= b,
    }
}

pub(super) fn compare(pred: CmpPred, a: &Array, b: &Array) -> Array {
    let data = match (a.data(), b.data()) {
        (ArrayData::Float(x), ArrayData::Float(y)) => zip(x, y, |p, q| cmp(pred, p, q)),
        (ArrayData::Int(x), ArrayData::Int(y)) => zip(x, y, |p, q| cmp(pred, p, q)),
        (ArrayData::Bool(x), ArrayData::Bool(y)) => zip(x, y, |p, q| cmp(pred, p, q)),
        _ => unreachable!("verifier checks operand types"),
    };
    Array::from_parts(a.ty().with_dtype(DType::Bool), ArrayData::Bool(data))
}

pub(super) fn select(cond: &Array, t: &Array, f: &Array) -> Array {
    let ArrayData::Bool(c) = cond.data() else {
        unreachable!("verifier checks the condition is bool")
    };
    fn pick<T: Copy>(c: &[bool], t: &[T], f: &[T]) -> Vec<T> {
        c.iter()
            .zip(t.iter().zip(f))
            .map(|(&c, (&t, &f))| if c { t } else { f })
            .collect()
    }
    let data = match (t.data(), f.data()) {
        (ArrayData::Float(x), ArrayData::Float(y)) => ArrayData::Float(pick(c, x, y)),
        (ArrayData::Int(x), ArrayData::Int(y)) => ArrayData::Int(pick(c, x, y)),
        (ArrayData::Bool(x), ArrayData::Bool(y)) => ArrayData::Bool(pick(c, x, y)),
        _ => unreachable!("verifier checks operand types"),
    };
    Array::from_parts(t.ty().clone(), data)
}

pub(super) fn cast(x: &Array, to: DType) -> Array {
    let ty = x.ty().with_dtype(to);
    let data = match (x.data(), to) {
        (ArrayData::Float(v), d) if d.is_float() => rounded(d, v.clone()),
        (ArrayData::Float(v), DType::I32) => ArrayData::Int(v.iter().map(|&a| a as i32).collect()),
        (ArrayData::Float(v), _) => ArrayData::Bool(v.iter().map(|&a| a != 0.0).collect()),
        (ArrayData::Int(v), d) if d.is_float() => rounded(d, v.iter().map(|&a| a as f32).collect()),
        (ArrayData::Int(v), DType::I32) => ArrayData::Int(v.clone()),
        (ArrayData::Int(v), _) => ArrayData::Bool(v.iter().map(|&a| a != 0).collect()),
        (ArrayData::Bool(v), d) if d.is_float() => {
            ArrayData::Float(v.iter().map(|&a| f32::from(u8::from(a))).collect())
        }
        (ArrayData::Bool(v), DType::I32) => {
            ArrayData::Int(v.iter().map(|&a| i32::from(a)).collect())
        }
        (ArrayData::Bool(v), _) => ArrayData::Bool(v.clone()),
    };
    Array::from_parts(ty, data)
}

/// For each element of a `from`-shaped array, the offset of the element it maps to,
/// where `strides[d]` is the step (possibly 0) of dimension `d` in the other array.
fn mapped_offsets(from: &[u64], strides: &[u64]) -> Vec<usize> {
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

pub(super) fn broadcast(x: &Array, dims: &[usize], ty: &TensorType) -> Array {
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

pub(super) fn reshape(x: &Array, ty: &TensorType) -> Array {
    Array::from_parts(ty.clone(), x.data().clone())
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

pub(super) fn reduce(op: ReduceOp, x: &Array, axes: &[usize]) -> Array {
    let shape: Vec<u64> = x
        .shape()
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect();
    let ty = TensorType::new(x.dtype(), shape);
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

pub(super) fn dot(lhs: &Array, rhs: &Array, transpose_lhs: bool, transpose_rhs: bool) -> Array {
    let a = if transpose_lhs {
        transpose(lhs, &[1, 0])
    } else {
        lhs.clone()
    };
    let b = if transpose_rhs {
        transpose(rhs, &[1, 0])
    } else {
        rhs.clone()
    };
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
