//! Traced block values: [`Tensor`] handles with operators and math methods that append
//! ops to the kernel being traced. Shapes broadcast like NumPy; Rust scalars take the
//! dtype of the tensor they meet.

use std::ops;
use std::panic::Location;

use super::context::with_builder;
use crate::ir::{BinaryOp, CheckKind, CmpPred, Literal, ReduceOp, UnaryOp, Value};
use crate::types::{DType, TensorType};

/// The `Tensor` methods kernel code may call: the `#[kernel]` macro accepts these and
/// points at them for anything else. A test keeps the list equal to this file's methods.
pub const TENSOR_METHODS: &[&str] = &[
    "ty",
    "shape",
    "dtype",
    "value",
    "apply",
    "exp",
    "log",
    "tanh",
    "sqrt",
    "rsqrt",
    "recip",
    "erf",
    "sin",
    "cos",
    "abs",
    "sigmoid",
    "maximum",
    "minimum",
    "pow",
    "sum",
    "max",
    "min",
    "sum_keepdims",
    "max_keepdims",
    "min_keepdims",
    "dot",
    "cast",
    "reshape",
    "expand_dims",
    "broadcast_to",
    "transpose",
    "t",
    "take_along_axis",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
];

/// A value of the kernel being traced (a block, a row, a scalar index...).
#[derive(Clone, Copy, Debug)]
pub struct Tensor {
    value: Value,
}

impl Tensor {
    pub(crate) fn from_value(value: Value) -> Tensor {
        Tensor { value }
    }

    /// The underlying SSA value.
    pub fn value(self) -> Value {
        self.value
    }

    /// The static type.
    #[track_caller]
    pub fn ty(self) -> TensorType {
        with_builder(Location::caller(), |b| b.type_of(self.value).clone())
    }

    /// The static shape.
    #[track_caller]
    pub fn shape(self) -> Vec<u64> {
        self.ty().shape
    }

    /// The element type.
    #[track_caller]
    pub fn dtype(self) -> DType {
        self.ty().dtype
    }

    /// Applies any element-wise unary op: `x.exp()` is `x.apply(UnaryOp::Exp)`.
    #[track_caller]
    pub fn apply(self, op: UnaryOp) -> Tensor {
        let v = with_builder(Location::caller(), |b| b.unary(op, self.value));
        Tensor::from_value(v)
    }

    /// `e^x`, element-wise.
    #[track_caller]
    pub fn exp(self) -> Tensor {
        self.apply(UnaryOp::Exp)
    }

    /// Natural logarithm, element-wise.
    #[track_caller]
    pub fn log(self) -> Tensor {
        self.apply(UnaryOp::Log)
    }

    /// Hyperbolic tangent, element-wise.
    #[track_caller]
    pub fn tanh(self) -> Tensor {
        self.apply(UnaryOp::Tanh)
    }

    /// Square root, element-wise.
    #[track_caller]
    pub fn sqrt(self) -> Tensor {
        self.apply(UnaryOp::Sqrt)
    }

    /// The Gauss error function, element-wise.
    #[track_caller]
    pub fn erf(self) -> Tensor {
        self.apply(UnaryOp::Erf)
    }

    /// Sine (radians), element-wise.
    #[track_caller]
    pub fn sin(self) -> Tensor {
        self.apply(UnaryOp::Sin)
    }

    /// Cosine (radians), element-wise.
    #[track_caller]
    pub fn cos(self) -> Tensor {
        self.apply(UnaryOp::Cos)
    }

    /// `1 / sqrt(x)`, element-wise.
    #[track_caller]
    pub fn rsqrt(self) -> Tensor {
        self.apply(UnaryOp::Rsqrt)
    }

    /// `1 / x`, element-wise (where `1.0 / x` cannot tell which float width the
    /// literal has).
    #[track_caller]
    pub fn recip(self) -> Tensor {
        binary_rev(BinaryOp::Div, 1.0f64, self, Location::caller())
    }

    /// Absolute value, element-wise.
    #[track_caller]
    pub fn abs(self) -> Tensor {
        self.apply(UnaryOp::Abs)
    }

    /// Logistic sigmoid `1 / (1 + e^-x)`, element-wise.
    #[track_caller]
    pub fn sigmoid(self) -> Tensor {
        1.0 / ((-self).exp() + 1.0)
    }

    /// Element-wise maximum (NaN-propagating).
    #[track_caller]
    pub fn maximum(self, other: impl Operand) -> Tensor {
        binary(BinaryOp::Max, self, other, Location::caller())
    }

    /// Element-wise minimum (NaN-propagating).
    #[track_caller]
    pub fn minimum(self, other: impl Operand) -> Tensor {
        binary(BinaryOp::Min, self, other, Location::caller())
    }

    /// Element-wise power.
    #[track_caller]
    pub fn pow(self, other: impl Operand) -> Tensor {
        binary(BinaryOp::Pow, self, other, Location::caller())
    }

    #[track_caller]
    fn reduce(self, op: ReduceOp, axis: usize, keepdims: bool) -> Tensor {
        let loc = Location::caller();
        let v = with_builder(loc, |b| {
            let r = b.reduce(op, self.value, vec![axis]);
            if keepdims {
                let mut shape = b.type_of(r).shape.clone();
                shape.insert(axis.min(shape.len()), 1);
                b.reshape(r, shape)
            } else {
                r
            }
        });
        Tensor::from_value(v)
    }

    /// Sum over `axis`, which is removed.
    #[track_caller]
    pub fn sum(self, axis: usize) -> Tensor {
        self.reduce(ReduceOp::Sum, axis, false)
    }

    /// Maximum over `axis`, which is removed.
    #[track_caller]
    pub fn max(self, axis: usize) -> Tensor {
        self.reduce(ReduceOp::Max, axis, false)
    }

    /// Minimum over `axis`, which is removed.
    #[track_caller]
    pub fn min(self, axis: usize) -> Tensor {
        self.reduce(ReduceOp::Min, axis, false)
    }

    /// Sum over `axis`, kept with size 1.
    #[track_caller]
    pub fn sum_keepdims(self, axis: usize) -> Tensor {
        self.reduce(ReduceOp::Sum, axis, true)
    }

    /// Maximum over `axis`, kept with size 1.
    #[track_caller]
    pub fn max_keepdims(self, axis: usize) -> Tensor {
        self.reduce(ReduceOp::Max, axis, true)
    }

    /// Minimum over `axis`, kept with size 1.
    #[track_caller]
    pub fn min_keepdims(self, axis: usize) -> Tensor {
        self.reduce(ReduceOp::Min, axis, true)
    }

    /// Matrix product `self @ rhs` (2-D), accumulated in f32 (i32 for integers).
    #[track_caller]
    pub fn dot(self, rhs: Tensor) -> Tensor {
        dot_general(self, rhs, false, false)
    }

    /// Converts to `dtype` (no op when it already has that dtype).
    #[track_caller]
    pub fn cast(self, dtype: DType) -> Tensor {
        let v = with_builder(Location::caller(), |b| {
            if b.type_of(self.value).dtype == dtype {
                self.value
            } else {
                b.cast(self.value, dtype)
            }
        });
        Tensor::from_value(v)
    }

    /// Same elements in a new shape.
    #[track_caller]
    pub fn reshape(self, shape: impl Into<Vec<u64>>) -> Tensor {
        let shape = shape.into();
        Tensor::from_value(with_builder(Location::caller(), |b| {
            b.reshape(self.value, shape)
        }))
    }

    /// Inserts a dimension of size 1 at `axis`.
    #[track_caller]
    pub fn expand_dims(self, axis: usize) -> Tensor {
        let loc = Location::caller();
        let v = with_builder(loc, |b| {
            let mut shape = b.type_of(self.value).shape.clone();
            shape.insert(axis.min(shape.len()), 1);
            b.reshape(self.value, shape)
        });
        Tensor::from_value(v)
    }

    /// Broadcasts to `shape` with NumPy rules (trailing dims align; size 1 stretches).
    #[track_caller]
    pub fn broadcast_to(self, shape: impl Into<Vec<u64>>) -> Tensor {
        let shape = shape.into();
        let loc = Location::caller();
        Tensor::from_value(with_builder(loc, |b| {
            broadcast_value(b, self.value, &shape)
        }))
    }

    /// Permutes dimensions: result dim `i` is dim `perm[i]`.
    #[track_caller]
    pub fn transpose(self, perm: impl Into<Vec<usize>>) -> Tensor {
        let perm = perm.into();
        Tensor::from_value(with_builder(Location::caller(), |b| {
            b.transpose(self.value, perm)
        }))
    }

    /// Swaps the two dims of a matrix.
    #[track_caller]
    pub fn t(self) -> Tensor {
        self.transpose(vec![1, 0])
    }

    /// The elements at `indices` (an i32 tensor of this rank, the same size on every
    /// other dim) along `axis`, as NumPy's `take_along_axis`: `logits.take_along_axis(
    /// target.expand_dims(1), 1)` picks one element per row. Indices outside the axis are
    /// clamped into it (guard them with `check_index!` where they are a user error).
    #[track_caller]
    pub fn take_along_axis(self, indices: Tensor, axis: usize) -> Tensor {
        Tensor::from_value(with_builder(Location::caller(), |b| {
            b.gather(self.value, indices.value, axis)
        }))
    }

    #[track_caller]
    fn compare(self, pred: CmpPred, other: impl Operand) -> Tensor {
        let loc = Location::caller();
        let (a, b) = coerce_pair(self, other, loc);
        Tensor::from_value(with_builder(loc, |bld| bld.compare(pred, a.value, b.value)))
    }

    /// Element-wise `self < other`.
    #[track_caller]
    pub fn lt(self, other: impl Operand) -> Tensor {
        self.compare(CmpPred::Lt, other)
    }

    /// Element-wise `self <= other`.
    #[track_caller]
    pub fn le(self, other: impl Operand) -> Tensor {
        self.compare(CmpPred::Le, other)
    }

    /// Element-wise `self > other`.
    #[track_caller]
    pub fn gt(self, other: impl Operand) -> Tensor {
        self.compare(CmpPred::Gt, other)
    }

    /// Element-wise `self >= other`.
    #[track_caller]
    pub fn ge(self, other: impl Operand) -> Tensor {
        self.compare(CmpPred::Ge, other)
    }

    /// Element-wise `self == other`.
    #[track_caller]
    pub fn eq(self, other: impl Operand) -> Tensor {
        self.compare(CmpPred::Eq, other)
    }

    /// Element-wise `self != other`.
    #[track_caller]
    pub fn ne(self, other: impl Operand) -> Tensor {
        self.compare(CmpPred::Ne, other)
    }
}

/// Something that can meet a [`Tensor`] in an element-wise op: another tensor, or a
/// Rust scalar that becomes a constant of the tensor's dtype and shape.
pub trait Operand: Copy {
    /// This operand as a tensor shaped and typed like `like`.
    fn to_tensor(self, like: Tensor, location: &'static Location<'static>) -> Tensor;
    /// Whether this operand is already a tensor (no conversion needed).
    fn as_tensor(self) -> Option<Tensor> {
        None
    }
}

impl Operand for Tensor {
    fn to_tensor(self, _like: Tensor, _location: &'static Location<'static>) -> Tensor {
        self
    }
    fn as_tensor(self) -> Option<Tensor> {
        Some(self)
    }
}

fn splat(like: Tensor, literal: Literal, location: &'static Location<'static>) -> Tensor {
    let v = with_builder(location, |b| {
        let ty = b.type_of(like.value).clone();
        if matches!(literal, Literal::Float(_)) && !ty.dtype.is_float() {
            b.report(
                "const",
                format!(
                    "a float literal cannot meet a {} value; cast one side",
                    ty.dtype
                ),
            );
        }
        b.constant(literal, ty)
    });
    Tensor::from_value(v)
}

macro_rules! int_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn to_tensor(self, like: Tensor, location: &'static Location<'static>) -> Tensor {
                splat(like, Literal::Int(self as i64), location)
            }
        }
    )*};
}
int_operand!(i32, i64, u32, u64, usize);

macro_rules! float_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn to_tensor(self, like: Tensor, location: &'static Location<'static>) -> Tensor {
                splat(like, Literal::Float(self as f64), location)
            }
        }
    )*};
}
float_operand!(f32, f64);

impl Operand for bool {
    fn to_tensor(self, like: Tensor, location: &'static Location<'static>) -> Tensor {
        splat(like, Literal::Bool(self), location)
    }
}

/// NumPy broadcast shape of two shapes, or `None` if they are incompatible.
fn broadcast_shapes(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[u64], i: usize| {
        let pad = rank - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Broadcasts a value to `shape` (trailing dims aligned); identity if already there.
pub(crate) fn broadcast_value(
    b: &mut crate::builder::KernelBuilder,
    v: Value,
    shape: &[u64],
) -> Value {
    let from = b.type_of(v).shape.clone();
    if from == shape {
        return v;
    }
    if from.len() > shape.len() {
        b.report(
            "broadcast",
            format!("cannot broadcast shape {from:?} to the smaller rank of {shape:?}"),
        );
        return v;
    }
    let offset = shape.len() - from.len();
    let dims = (offset..shape.len()).collect();
    b.broadcast(v, dims, shape.to_vec())
}

/// Brings two operands to a common shape (NumPy rules) and converts scalars.
fn coerce_pair(
    a: Tensor,
    other: impl Operand,
    location: &'static Location<'static>,
) -> (Tensor, Tensor) {
    let Some(bt) = other.as_tensor() else {
        return (a, other.to_tensor(a, location));
    };
    let (av, bv) = with_builder(location, |b| {
        let (sa, sb) = (
            b.type_of(a.value).shape.clone(),
            b.type_of(bt.value).shape.clone(),
        );
        if sa == sb {
            return (a.value, bt.value);
        }
        match broadcast_shapes(&sa, &sb) {
            Some(shape) => (
                broadcast_value(b, a.value, &shape),
                broadcast_value(b, bt.value, &shape),
            ),
            None => {
                b.report(
                    "broadcast",
                    format!("shapes {sa:?} and {sb:?} do not broadcast together"),
                );
                (a.value, bt.value)
            }
        }
    });
    (Tensor::from_value(av), Tensor::from_value(bv))
}

fn binary(
    op: BinaryOp,
    a: Tensor,
    other: impl Operand,
    location: &'static Location<'static>,
) -> Tensor {
    let (a, b) = coerce_pair(a, other, location);
    Tensor::from_value(with_builder(location, |bld| {
        bld.binary(op, a.value, b.value)
    }))
}

fn binary_rev(
    op: BinaryOp,
    lhs: impl Operand,
    b: Tensor,
    location: &'static Location<'static>,
) -> Tensor {
    let a = lhs.to_tensor(b, location);
    binary(op, a, b, location)
}

macro_rules! binary_ops {
    ($($trait:ident $method:ident $assign_trait:ident $assign_method:ident => $op:expr;)*) => {$(
        impl<R: Operand> ops::$trait<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                binary($op, self, rhs, Location::caller())
            }
        }
        impl<R: Operand> ops::$assign_trait<R> for Tensor {
            #[track_caller]
            fn $assign_method(&mut self, rhs: R) {
                *self = binary($op, *self, rhs, Location::caller());
            }
        }
        binary_ops!(@rev $trait $method $op; i32 i64 u32 u64 usize f32 f64);
    )*};
    (@rev $trait:ident $method:ident $op:expr; $($t:ty)*) => {$(
        impl ops::$trait<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                binary_rev($op, self, rhs, Location::caller())
            }
        }
    )*};
}

binary_ops! {
    Add add AddAssign add_assign => BinaryOp::Add;
    Sub sub SubAssign sub_assign => BinaryOp::Sub;
    Mul mul MulAssign mul_assign => BinaryOp::Mul;
    Div div DivAssign div_assign => BinaryOp::Div;
    Rem rem RemAssign rem_assign => BinaryOp::Rem;
    BitAnd bitand BitAndAssign bitand_assign => BinaryOp::And;
    BitOr bitor BitOrAssign bitor_assign => BinaryOp::Or;
}

impl ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.apply(UnaryOp::Neg)
    }
}

impl ops::Not for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        self.apply(UnaryOp::Not)
    }
}

/// This program's index along grid `axis` (an i32 scalar).
#[track_caller]
pub fn program_id(axis: usize) -> Tensor {
    Tensor::from_value(with_builder(Location::caller(), |b| b.program_id(axis)))
}

/// The number of programs along grid `axis` (an i32 scalar).
#[track_caller]
pub fn num_programs(axis: usize) -> Tensor {
    Tensor::from_value(with_builder(Location::caller(), |b| b.num_programs(axis)))
}

/// An i32 tensor of `shape` counting along `dim`.
#[track_caller]
pub fn iota(shape: impl Into<Vec<u64>>, dim: usize) -> Tensor {
    let ty = TensorType::new(DType::I32, shape);
    Tensor::from_value(with_builder(Location::caller(), |b| b.iota(ty, dim)))
}

/// A tensor of `shape` and `dtype` filled with `value`.
#[track_caller]
pub fn full(shape: impl Into<Vec<u64>>, value: f64, dtype: DType) -> Tensor {
    let ty = TensorType::new(dtype, shape);
    let literal = match dtype {
        DType::I32 => Literal::Int(value as i64),
        DType::Bool => Literal::Bool(value != 0.0),
        _ => Literal::Float(value),
    };
    Tensor::from_value(with_builder(Location::caller(), |b| {
        b.constant(literal, ty)
    }))
}

/// A tensor of `shape` and `dtype` filled with zeros.
#[track_caller]
pub fn zeros(shape: impl Into<Vec<u64>>, dtype: DType) -> Tensor {
    full(shape, 0.0, dtype)
}

/// Prints `message` and `values` with the program id when the kernel runs on the
/// interpreter or the native backend; the XLA and Mosaic lowerings drop it (with a
/// warning). Kernels write [`debug_print!`](crate::debug_print).
#[track_caller]
pub fn debug_print(message: &str, values: &[Tensor]) {
    let values = values.iter().map(|t| t.value()).collect();
    with_builder(Location::caller(), |b| b.debug_print(message, values));
}

/// Fails the run, as `kind`, when an element of the bool tensor `cond` is false: the
/// interpreter, the native backend and XLA report the first failing program with
/// `message` and `values` (torch ops raise `ValueError` or `IndexError`); the Mosaic
/// lowering drops the check. Kernels write [`check!`](crate::check) or
/// [`check_index!`](crate::check_index).
#[track_caller]
pub fn check(kind: CheckKind, cond: Tensor, message: &str, values: &[Tensor]) {
    let values = values.iter().map(|t| t.value()).collect();
    with_builder(Location::caller(), |b| {
        b.check(kind, cond.value(), message, values)
    });
}

/// An i32 scalar constant (for loop bounds and index math).
#[track_caller]
pub fn index(value: i64) -> Tensor {
    Tensor::from_value(with_builder(Location::caller(), |b| b.index_const(value)))
}

/// Element-wise `cond ? on_true : on_false` (`jnp.where`); operands broadcast.
#[track_caller]
pub fn select(cond: Tensor, on_true: impl Operand, on_false: impl Operand) -> Tensor {
    let loc = Location::caller();
    let (t, f) = match (on_true.as_tensor(), on_false.as_tensor()) {
        (Some(t), _) => {
            let (t, f) = coerce_pair(t, on_false, loc);
            (t, f)
        }
        (None, Some(f)) => {
            let (f, t) = coerce_pair(f, on_true, loc);
            (t, f)
        }
        (None, None) => {
            with_builder(loc, |b| {
                b.report("select", "at least one branch of `select` must be a tensor")
            });
            return cond;
        }
    };
    let (c, t) = {
        let shape = t.shape();
        let c = cond.broadcast_to(shape.clone());
        (c, t)
    };
    let f = f.broadcast_to(t.shape());
    Tensor::from_value(with_builder(loc, |b| b.select(c.value, t.value, f.value)))
}

/// Matrix product with optional transposes (Pallas `pl.dot(a, b, trans_a, trans_b)`).
#[track_caller]
pub fn dot_general(lhs: Tensor, rhs: Tensor, trans_lhs: bool, trans_rhs: bool) -> Tensor {
    let v = with_builder(Location::caller(), |b| {
        b.dot(lhs.value, rhs.value, trans_lhs, trans_rhs)
    });
    Tensor::from_value(v)
}
