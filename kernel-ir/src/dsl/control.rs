//! Control flow for traced kernels. The `#[kernel]` macro rewrites `for`, `if`,
//! comparisons and `&&`/`||` into these functions; they emit IR loops and branches for
//! traced values and fall back to plain Rust for compile-time (Rust) values.

use std::panic::Location;

use super::context::with_builder;
use super::tensor::{Operand, Tensor};
use crate::ir::Value;

/// Values that can be carried through a traced `for` loop or out of a traced `if`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be carried through a traced `for` loop or `if`",
    label = "assigned inside a traced loop or branch",
    note = "only kernel values (`Tensor`) can be updated inside a traced loop or branch: \
            compute Rust values before it, or unroll the loop with `#[unroll]`"
)]
pub trait Carry: Copy {
    /// Appends the carried values.
    fn flatten(self, out: &mut Vec<Value>);
    /// Rebuilds from values in the order `flatten` produced them.
    fn rebuild(values: &mut dyn Iterator<Item = Value>) -> Option<Self>;
}

impl Carry for Tensor {
    fn flatten(self, out: &mut Vec<Value>) {
        out.push(self.value());
    }
    fn rebuild(values: &mut dyn Iterator<Item = Value>) -> Option<Self> {
        values.next().map(Tensor::from_value)
    }
}

impl Carry for () {
    fn flatten(self, _out: &mut Vec<Value>) {}
    fn rebuild(_values: &mut dyn Iterator<Item = Value>) -> Option<Self> {
        Some(())
    }
}

macro_rules! carry_tuple {
    ($($name:ident)+) => {
        impl<$($name: Carry),+> Carry for ($($name,)+) {
            #[allow(non_snake_case)]
            fn flatten(self, out: &mut Vec<Value>) {
                let ($($name,)+) = self;
                $($name.flatten(out);)+
            }
            fn rebuild(values: &mut dyn Iterator<Item = Value>) -> Option<Self> {
                Some(($($name::rebuild(values)?,)+))
            }
        }
    };
}
carry_tuple!(A);
carry_tuple!(A B);
carry_tuple!(A B C);
carry_tuple!(A B C D);
carry_tuple!(A B C D E);
carry_tuple!(A B C D E F);
carry_tuple!(A B C D E F G);
carry_tuple!(A B C D E F G H);
carry_tuple!(A B C D E F G H I);
carry_tuple!(A B C D E F G H I J);
carry_tuple!(A B C D E F G H I J K);
carry_tuple!(A B C D E F G H I J K L);

fn rebuild_or<T: Carry>(values: Vec<Value>, fallback: T) -> T {
    T::rebuild(&mut values.into_iter()).unwrap_or(fallback)
}

/// A loop bound: a traced i32 scalar or a Rust integer.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a kernel loop bound",
    note = "loop bounds are traced i32 scalars (`Tensor`) or Rust integers"
)]
pub trait LoopBound: Copy {
    /// The bound as an i32 scalar of the kernel being traced.
    fn to_index(self, location: &'static Location<'static>) -> Value;
}

impl LoopBound for Tensor {
    fn to_index(self, _location: &'static Location<'static>) -> Value {
        self.value()
    }
}

macro_rules! int_bound {
    ($($t:ty),*) => {$(
        impl LoopBound for $t {
            fn to_index(self, location: &'static Location<'static>) -> Value {
                with_builder(location, |b| b.index_const(self as i64))
            }
        }
    )*};
}
int_bound!(i32, i64, u32, u64, usize);

/// A traced `for i in (lower..upper).step_by(step)`; `body` gets the induction
/// variable and the carried values and returns their next values.
#[track_caller]
pub fn for_range<T: Carry>(
    lower: impl LoopBound,
    upper: impl LoopBound,
    step: impl LoopBound,
    init: T,
    body: impl FnOnce(Tensor, T) -> T,
) -> T {
    let loc = Location::caller();
    let (lo, hi, st) = (lower.to_index(loc), upper.to_index(loc), step.to_index(loc));
    let mut inits = Vec::new();
    init.flatten(&mut inits);
    let (iv, carried) = with_builder(loc, |b| b.begin_for(lo, hi, st, &inits));
    let next = body(Tensor::from_value(iv), rebuild_or(carried, init));
    let mut next_values = Vec::new();
    next.flatten(&mut next_values);
    let results = with_builder(loc, |b| b.end_for(next_values));
    rebuild_or(results, init)
}

/// The condition of an `if` in a kernel: a Rust `bool` picks a branch while tracing; a
/// traced bool scalar emits an IR `if` whose results are the carried variables `T`
/// and the branch value `R`.
pub trait Condition<T, R> {
    /// Runs or traces the branches.
    fn branch(
        self,
        vars: T,
        then_branch: impl FnOnce(T) -> (T, R),
        else_branch: impl FnOnce(T) -> (T, R),
    ) -> (T, R);
}

impl<T, R> Condition<T, R> for bool {
    fn branch(
        self,
        vars: T,
        then_branch: impl FnOnce(T) -> (T, R),
        else_branch: impl FnOnce(T) -> (T, R),
    ) -> (T, R) {
        if self {
            then_branch(vars)
        } else {
            else_branch(vars)
        }
    }
}

impl<T: Carry, R: Carry> Condition<T, R> for Tensor {
    #[track_caller]
    fn branch(
        self,
        vars: T,
        then_branch: impl FnOnce(T) -> (T, R),
        else_branch: impl FnOnce(T) -> (T, R),
    ) -> (T, R) {
        let loc = Location::caller();
        with_builder(loc, |b| b.begin_if(self.value()));
        let then_out = then_branch(vars);
        let mut values = Vec::new();
        then_out.flatten(&mut values);
        with_builder(loc, |b| b.begin_else(values));
        let else_out = else_branch(vars);
        let mut values = Vec::new();
        else_out.flatten(&mut values);
        let results = with_builder(loc, |b| b.end_if(values));
        rebuild_or(results, then_out)
    }
}

/// `if` in a kernel (the macro's target): see [`Condition`].
#[track_caller]
pub fn branch<C: Condition<T, R>, T, R>(
    cond: C,
    vars: T,
    then_branch: impl FnOnce(T) -> (T, R),
    else_branch: impl FnOnce(T) -> (T, R),
) -> (T, R) {
    cond.branch(vars, then_branch, else_branch)
}

/// `==` and `!=` in kernels: traced operands give a bool tensor, Rust values a `bool`.
pub trait KernelEq<Rhs> {
    /// The result: `Tensor` or `bool`.
    type Output;
    /// `self == rhs`
    fn k_eq(self, rhs: Rhs) -> Self::Output;
    /// `self != rhs`
    fn k_ne(self, rhs: Rhs) -> Self::Output;
}

/// `<`, `<=`, `>`, `>=` in kernels: traced operands give a bool tensor, Rust values a
/// `bool`.
pub trait KernelOrd<Rhs> {
    /// The result: `Tensor` or `bool`.
    type Output;
    /// `self < rhs`
    fn k_lt(self, rhs: Rhs) -> Self::Output;
    /// `self <= rhs`
    fn k_le(self, rhs: Rhs) -> Self::Output;
    /// `self > rhs`
    fn k_gt(self, rhs: Rhs) -> Self::Output;
    /// `self >= rhs`
    fn k_ge(self, rhs: Rhs) -> Self::Output;
}

impl<R: Operand> KernelEq<R> for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn k_eq(self, rhs: R) -> Tensor {
        self.eq(rhs)
    }
    #[track_caller]
    fn k_ne(self, rhs: R) -> Tensor {
        self.ne(rhs)
    }
}

impl<R: Operand> KernelOrd<R> for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn k_lt(self, rhs: R) -> Tensor {
        self.lt(rhs)
    }
    #[track_caller]
    fn k_le(self, rhs: R) -> Tensor {
        self.le(rhs)
    }
    #[track_caller]
    fn k_gt(self, rhs: R) -> Tensor {
        self.gt(rhs)
    }
    #[track_caller]
    fn k_ge(self, rhs: R) -> Tensor {
        self.ge(rhs)
    }
}

impl<T: PartialEq> KernelEq<T> for T {
    type Output = bool;
    fn k_eq(self, rhs: T) -> bool {
        self == rhs
    }
    fn k_ne(self, rhs: T) -> bool {
        self != rhs
    }
}

impl<T: PartialOrd> KernelOrd<T> for T {
    type Output = bool;
    fn k_lt(self, rhs: T) -> bool {
        self < rhs
    }
    fn k_le(self, rhs: T) -> bool {
        self <= rhs
    }
    fn k_gt(self, rhs: T) -> bool {
        self > rhs
    }
    fn k_ge(self, rhs: T) -> bool {
        self >= rhs
    }
}

macro_rules! scalar_vs_tensor {
    ($($t:ty),*) => {$(
        impl KernelEq<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn k_eq(self, rhs: Tensor) -> Tensor { rhs.eq(self) }
            #[track_caller]
            fn k_ne(self, rhs: Tensor) -> Tensor { rhs.ne(self) }
        }
        impl KernelOrd<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn k_lt(self, rhs: Tensor) -> Tensor { rhs.gt(self) }
            #[track_caller]
            fn k_le(self, rhs: Tensor) -> Tensor { rhs.ge(self) }
            #[track_caller]
            fn k_gt(self, rhs: Tensor) -> Tensor { rhs.lt(self) }
            #[track_caller]
            fn k_ge(self, rhs: Tensor) -> Tensor { rhs.le(self) }
        }
    )*};
}
scalar_vs_tensor!(i32, i64, u32, u64, usize, f32, f64);

/// `&&` and `||` in kernels: traced bools combine element-wise (both sides are always
/// evaluated), Rust bools short-circuit as usual.
pub trait KernelLogic<Rhs> {
    /// The result: `Tensor` or `bool`.
    type Output;
    /// `self && rhs`
    fn k_and(self, rhs: impl FnOnce() -> Rhs) -> Self::Output;
    /// `self || rhs`
    fn k_or(self, rhs: impl FnOnce() -> Rhs) -> Self::Output;
}

impl KernelLogic<bool> for bool {
    type Output = bool;
    fn k_and(self, rhs: impl FnOnce() -> bool) -> bool {
        self && rhs()
    }
    fn k_or(self, rhs: impl FnOnce() -> bool) -> bool {
        self || rhs()
    }
}

impl<R: Operand> KernelLogic<R> for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn k_and(self, rhs: impl FnOnce() -> R) -> Tensor {
        self & rhs()
    }
    #[track_caller]
    fn k_or(self, rhs: impl FnOnce() -> R) -> Tensor {
        self | rhs()
    }
}

impl KernelLogic<Tensor> for bool {
    type Output = Tensor;
    #[track_caller]
    fn k_and(self, rhs: impl FnOnce() -> Tensor) -> Tensor {
        rhs() & self
    }
    #[track_caller]
    fn k_or(self, rhs: impl FnOnce() -> Tensor) -> Tensor {
        rhs() | self
    }
}
