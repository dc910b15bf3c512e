//! Element-wise ops: unary and binary math, comparisons, `select`, `cast`. Every operand
//! and the result share one shape. Integer division and remainder round toward negative
//! infinity ([`floor_div`], [`floor_rem`]: Python's `//` and `%`), everywhere: in these
//! ops, in index maps, and in every lowering.

use super::{not_in_family, EvalCx, OpTraits, TypeCx};
use crate::array::{round_to, Array, ArrayData};
use crate::ir::{BinaryOp, CmpPred, OpKind, UnaryOp};
use crate::types::{DType, TensorType};

pub(super) const TRAITS: OpTraits = OpTraits {
    pure: true,
    elementwise: true,
    has_regions: false,
};

/// Integer division rounded toward negative infinity; `None` when `b` is 0 or the
/// quotient overflows.
pub fn floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    Some(if a % b != 0 && (a < 0) != (b < 0) {
        q - 1
    } else {
        q
    })
}

/// The remainder of [`floor_div`]: it has the sign of `b`; `None` when `b` is 0.
pub fn floor_rem(a: i64, b: i64) -> Option<i64> {
    let r = a.checked_rem(b)?;
    Some(if r != 0 && (r < 0) != (b < 0) {
        r + b
    } else {
        r
    })
}

impl UnaryOp {
    /// Whether the op is defined on elements of `dtype` (its type rule).
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs => dtype != DType::Bool,
            UnaryOp::Not => matches!(dtype, DType::Bool | DType::I32),
            _ => dtype.is_float(),
        }
    }
}

impl BinaryOp {
    /// Whether the op is defined on operands of `dtype` (its type rule).
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            BinaryOp::And | BinaryOp::Or => matches!(dtype, DType::Bool | DType::I32),
            BinaryOp::Pow => dtype.is_float(),
            _ => dtype != DType::Bool,
        }
    }
}

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::Unary { op, x } => {
            let xt = cx.ty(*x);
            if !op.accepts(xt.dtype) {
                return Err(format!("`{}` does not accept {}", op.name(), xt.dtype));
            }
            Ok(vec![xt])
        }
        OpKind::Binary { op, lhs, rhs } => {
            let lt = same_types(cx, *lhs, *rhs)?;
            if !op.accepts(lt.dtype) {
                return Err(format!("`{}` does not accept {}", op.name(), lt.dtype));
            }
            Ok(vec![lt])
        }
        OpKind::Compare { lhs, rhs, .. } => {
            Ok(vec![same_types(cx, *lhs, *rhs)?.with_dtype(DType::Bool)])
        }
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => {
            let (ct, tt, ft) = (cx.ty(*cond), cx.ty(*on_true), cx.ty(*on_false));
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
            let t = cx.declared_one()?;
            let xt = cx.ty(*x);
            if t.shape != xt.shape {
                return Err(format!("cannot cast {xt} to {t}: shapes differ"));
            }
            Ok(vec![t])
        }
        _ => not_in_family(op, "element-wise"),
    }
}

/// The type of both operands of a binary op, which must agree.
fn same_types(
    cx: &TypeCx,
    lhs: crate::ir::Value,
    rhs: crate::ir::Value,
) -> Result<TensorType, String> {
    let (lt, rt) = (cx.ty(lhs), cx.ty(rhs));
    if lt != rt {
        return Err(format!(
            "operand 1 has type {rt}, expected {lt} (the type of operand 0)"
        ));
    }
    Ok(lt)
}

pub(super) fn eval(op: &OpKind, cx: &EvalCx) -> Result<Array, String> {
    let get = cx.operand;
    Ok(match op {
        OpKind::Unary { op, x } => unary(*op, &get(*x)),
        OpKind::Binary { op, lhs, rhs } => binary(*op, &get(*lhs), &get(*rhs))?,
        OpKind::Compare { pred, lhs, rhs } => compare(*pred, &get(*lhs), &get(*rhs)),
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => select(&get(*cond), &get(*on_true), &get(*on_false)),
        OpKind::Cast { x } => cast(&get(*x), cx.result.dtype),
        _ => not_in_family(op, "element-wise"),
    })
}

/// Rounds every element to the dtype's precision when it is narrower than f32.
pub(super) fn rounded(dtype: DType, mut v: Vec<f32>) -> ArrayData {
    if matches!(dtype, DType::BF16 | DType::F16) {
        v.iter_mut().for_each(|x| *x = round_to(dtype, *x));
    }
    ArrayData::Float(v)
}

/// NaN-propagating maximum (so poisoned values are never hidden).
#[inline]
pub(super) fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum.
#[inline]
pub(super) fn nan_min(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

fn unary(op: UnaryOp, x: &Array) -> Array {
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
                UnaryOp::Sin => f32::sin,
                UnaryOp::Cos => f32::cos,
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

/// i32 floor division or remainder (wrapping like the other i32 ops; the divisor is
/// known to be nonzero).
fn i32_floor(a: i32, b: i32, rem: bool) -> i32 {
    let f = if rem { floor_rem } else { floor_div };
    f(i64::from(a), i64::from(b)).expect("divisor checked nonzero") as i32
}

fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Array, String> {
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
                BinaryOp::Div => zip(x, y, |p, q| i32_floor(p, q, false)),
                BinaryOp::Rem => zip(x, y, |p, q| i32_floor(p, q, true)),
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

fn compare(pred: CmpPred, a: &Array, b: &Array) -> Array {
    let data = match (a.data(), b.data()) {
        (ArrayData::Float(x), ArrayData::Float(y)) => zip(x, y, |p, q| cmp(pred, p, q)),
        (ArrayData::Int(x), ArrayData::Int(y)) => zip(x, y, |p, q| cmp(pred, p, q)),
        (ArrayData::Bool(x), ArrayData::Bool(y)) => zip(x, y, |p, q| cmp(pred, p, q)),
        _ => unreachable!("verifier checks operand types"),
    };
    Array::from_parts(a.ty().with_dtype(DType::Bool), ArrayData::Bool(data))
}

fn select(cond: &Array, t: &Array, f: &Array) -> Array {
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

fn cast(x: &Array, to: DType) -> Array {
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

#[cfg(test)]
mod tests {
    use super::{floor_div, floor_rem};

    #[test]
    fn floor_division_rounds_toward_negative_infinity() {
        let cases = [
            (7, 2, 3, 1),
            (-7, 2, -4, 1),
            (7, -2, -4, -1),
            (-7, -2, 3, -1),
            (6, 3, 2, 0),
            (-6, 3, -2, 0),
        ];
        for (a, b, q, r) in cases {
            assert_eq!(floor_div(a, b), Some(q), "{a} // {b}");
            assert_eq!(floor_rem(a, b), Some(r), "{a} % {b}");
            assert_eq!(q * b + r, a);
        }
        assert_eq!(floor_div(1, 0), None);
        assert_eq!(floor_rem(1, 0), None);
        assert_eq!(floor_div(i64::MIN, -1), None);
    }
}
