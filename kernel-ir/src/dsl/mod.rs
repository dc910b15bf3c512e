//! The kernel language's runtime: what `#[kernel]` functions call while they are traced
//! into IR, and [`pallas_call`], which sets the grid and BlockSpecs and traces a body.
//!
//! ```
//! use kernel_ir::dsl::prelude::*;
//!
//! // What `#[kernel] fn add_one(x: Ref, o: Ref) { o.write(x.read() + 1.0) }` expands to.
//! fn add_one(x: Ref, o: Ref) {
//!     o.write(x.read() + 1.0);
//! }
//!
//! let ty = TensorType::new(DType::F32, [16, 128]);
//! let kernel = pallas_call(add_one)
//!     .name("add_one")
//!     .grid([2])
//!     .input(ty.clone(), block_spec([8, 128], |i| vec![i[0].clone(), 0.into()]))
//!     .output(ty, block_spec([8, 128], |i| vec![i[0].clone(), 0.into()]))
//!     .build()
//!     .unwrap();
//! assert_eq!(kernel.grid, vec![2]);
//! ```

mod context;
mod control;
mod refs;
mod tensor;

use std::marker::PhantomData;
use std::panic::Location;

pub use control::{
    branch, for_range, Carry, Condition, KernelEq, KernelLogic, KernelOrd, LoopBound,
};
pub use refs::{ds, Ds, Ref, SliceArg, SliceStart, REF_METHODS};
pub use tensor::{
    check, debug_print, dot_general, full, index, iota, num_programs, program_id, select, zeros,
    Operand, Tensor, TENSOR_METHODS,
};

use crate::builder::KernelBuilder;
use crate::ir::{
    BlockDim, BlockSpec, DimSemantics, IndexExpr, IndexMap, Kernel, MemorySpace, RefId,
};
use crate::types::TensorType;
use crate::verify::VerifyError;

/// Everything a kernel author needs in scope.
pub mod prelude {
    pub use super::{
        block_spec, dot_general, ds, full, index, iota, num_programs, pallas_call, prefetched,
        program_id, select, zeros, BlockSpecFn, Ref, Tensor,
    };
    pub use crate as kernel_ir;
    pub use crate::ir::{DimSemantics, IndexExpr, Kernel};
    pub use crate::types::{DType, TensorType};
    pub use crate::{check, check_index, debug_print, print_kernel, s};
}

/// Prints a message and kernel values with the program id while the kernel runs (on the
/// interpreter and the native backend): `debug_print!("m, l =", m, l)`. Each value
/// prints its first 16 elements.
#[macro_export]
macro_rules! debug_print {
    ($message:expr $(, $value:expr)* $(,)?) => {
        $crate::dsl::debug_print($message, &[$($value),*])
    };
}

/// Fails the run with a `ValueError` when an element of a bool kernel tensor is false
/// (on the interpreter, the native backend and XLA; Mosaic drops it):
/// `check!(x.ge(0.0), "x must be non-negative:", x)`. The error names the first failing
/// program, the message and the values (their first 16 elements).
#[macro_export]
macro_rules! check {
    ($cond:expr, $message:expr $(, $value:expr)* $(,)?) => {
        $crate::dsl::check($crate::CheckKind::Value, $cond, $message, &[$($value),*])
    };
}

/// [`check!`] for indices: a failure is an `IndexError` (PyTorch's error for an index
/// out of range): `check_index!(t.lt(n), "target out of bounds:", t)`.
#[macro_export]
macro_rules! check_index {
    ($cond:expr, $message:expr $(, $value:expr)* $(,)?) => {
        $crate::dsl::check($crate::CheckKind::Index, $cond, $message, &[$($value),*])
    };
}

/// Called first by every `#[kernel]` body: names the kernel and its refs after the
/// function and its parameters.
#[track_caller]
pub fn kernel_prologue(name: &str, refs: &[(Ref, &str)]) {
    context::with_builder(Location::caller(), |b| {
        b.set_name(name);
        for (r, n) in refs {
            b.rename_ref(r.id(), *n);
        }
    });
}

/// Records a tracing error at the caller's location (used by generated code).
#[track_caller]
pub fn report_error(op: &str, message: &str) {
    context::with_builder(Location::caller(), |b| b.report(op, message));
}

/// An index map written as a closure over the program-id expressions.
type IndexMapFn = Box<dyn Fn(&[IndexExpr]) -> Vec<IndexExpr>>;

/// A block shape and an index map, before the grid rank is known (Pallas `BlockSpec`).
pub struct BlockSpecFn {
    block_shape: Vec<BlockDim>,
    index_map: IndexMapFn,
    memory_space: MemorySpace,
}

impl BlockSpecFn {
    /// Places the block in another memory space.
    pub fn memory_space(mut self, space: MemorySpace) -> Self {
        self.memory_space = space;
        self
    }

    fn resolve(&self, grid_rank: usize) -> BlockSpec {
        BlockSpec {
            block_shape: self.block_shape.clone(),
            index_map: IndexMap::from_fn(grid_rank, |pids| (self.index_map)(pids)),
            memory_space: self.memory_space,
        }
    }
}

/// A dimension of a block shape: a size, or `None` for a squeezed dimension.
pub trait IntoBlockDim {
    /// The block dimension.
    fn into_block_dim(self) -> BlockDim;
}

impl IntoBlockDim for u64 {
    fn into_block_dim(self) -> BlockDim {
        BlockDim::Size(self)
    }
}

impl IntoBlockDim for Option<u64> {
    fn into_block_dim(self) -> BlockDim {
        self.map_or(BlockDim::Squeezed, BlockDim::Size)
    }
}

/// A BlockSpec: `block_shape` (sizes, or `None` to squeeze a dim) and an index map from
/// program ids to block indices, e.g. `block_spec([bm, bk], |i| vec![i[0].clone(), i[2].clone()])`.
pub fn block_spec<D: IntoBlockDim>(
    block_shape: impl IntoIterator<Item = D>,
    index_map: impl Fn(&[IndexExpr]) -> Vec<IndexExpr> + 'static,
) -> BlockSpecFn {
    BlockSpecFn {
        block_shape: block_shape
            .into_iter()
            .map(IntoBlockDim::into_block_dim)
            .collect(),
        index_map: Box::new(index_map),
        memory_space: MemorySpace::Vmem,
    }
}

/// In an index map, element `index` of scalar-prefetch operand `operand` (the kernel's
/// `operand`-th input, added with [`PallasCall::scalar_prefetch`]): Pallas's
/// `lambda i, table: (table[i], 0)` is `|i| vec![prefetched(0, [i[0].clone()]), 0.into()]`.
pub fn prefetched(operand: usize, index: impl IntoIterator<Item = IndexExpr>) -> IndexExpr {
    IndexExpr::Scalar(RefId(operand as u32), index.into_iter().collect())
}

macro_rules! index_expr_ops {
    ($($trait:ident $method:ident => $op:ident;)*) => {$(
        impl<R: Into<IndexExpr>> std::ops::$trait<R> for IndexExpr {
            type Output = IndexExpr;
            fn $method(self, rhs: R) -> IndexExpr {
                self.bin(crate::ir::IndexBinOp::$op, rhs)
            }
        }
    )*};
}
index_expr_ops! {
    Add add => Add;
    Sub sub => Sub;
    Mul mul => Mul;
    Div div => FloorDiv;
    Rem rem => Rem;
}

/// A kernel body taking one [`Ref`] per input, output and scratch buffer, in order.
pub trait KernelBody<Args> {
    /// Number of refs the body takes.
    const ARITY: usize;
    /// Traces the body.
    fn trace(self, refs: &[Ref]);
}

macro_rules! kernel_body {
    ($n:literal; $($i:tt)*) => {
        impl<F: FnOnce($(kernel_body!(@ref $i)),*)> KernelBody<[Ref; $n]> for F {
            const ARITY: usize = $n;
            fn trace(self, refs: &[Ref]) {
                self($(refs[$i]),*)
            }
        }
    };
    (@ref $i:tt) => { Ref };
}
kernel_body!(1; 0);
kernel_body!(2; 0 1);
kernel_body!(3; 0 1 2);
kernel_body!(4; 0 1 2 3);
kernel_body!(5; 0 1 2 3 4);
kernel_body!(6; 0 1 2 3 4 5);
kernel_body!(7; 0 1 2 3 4 5 6);
kernel_body!(8; 0 1 2 3 4 5 6 7);
kernel_body!(9; 0 1 2 3 4 5 6 7 8);
kernel_body!(10; 0 1 2 3 4 5 6 7 8 9);
kernel_body!(11; 0 1 2 3 4 5 6 7 8 9 10);
kernel_body!(12; 0 1 2 3 4 5 6 7 8 9 10 11);
kernel_body!(13; 0 1 2 3 4 5 6 7 8 9 10 11 12);
kernel_body!(14; 0 1 2 3 4 5 6 7 8 9 10 11 12 13);
kernel_body!(15; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14);
kernel_body!(16; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);

/// Sets up a kernel launch: grid, BlockSpecs, scratch; [`PallasCall::build`] traces
/// the body into a verified [`Kernel`].
pub fn pallas_call<A, F: KernelBody<A>>(body: F) -> PallasCall<A, F> {
    PallasCall {
        body,
        name: None,
        grid: Vec::new(),
        semantics: None,
        inputs: Vec::new(),
        outputs: Vec::new(),
        scratch: Vec::new(),
        _args: PhantomData,
    }
}

/// A kernel launch being configured (Pallas `pallas_call`).
pub struct PallasCall<A, F> {
    body: F,
    name: Option<String>,
    grid: Vec<u64>,
    semantics: Option<Vec<DimSemantics>>,
    inputs: Vec<(TensorType, BlockSpecFn)>,
    outputs: Vec<(TensorType, BlockSpecFn)>,
    scratch: Vec<TensorType>,
    _args: PhantomData<A>,
}

impl<A, F: KernelBody<A>> PallasCall<A, F> {
    /// Overrides the kernel name (by default the `#[kernel]` function's name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The number of programs along each grid axis.
    pub fn grid(mut self, grid: impl Into<Vec<u64>>) -> Self {
        self.grid = grid.into();
        self
    }

    /// Semantics of each grid axis (default: all parallel).
    pub fn dimension_semantics(mut self, semantics: impl Into<Vec<DimSemantics>>) -> Self {
        self.semantics = Some(semantics.into());
        self
    }

    /// Adds a scalar-prefetch operand (Pallas's `PrefetchScalarGridSpec`): an i32 input
    /// held whole in SMEM, which index maps read with [`prefetched`] and the body with
    /// scalar loads. Scalar-prefetch operands come before the other inputs.
    pub fn scalar_prefetch(self, ty: TensorType) -> Self {
        let rank = ty.rank();
        let whole = block_spec(ty.shape.clone(), move |_| vec![IndexExpr::Const(0); rank]);
        self.input(ty, whole.memory_space(MemorySpace::Smem))
    }

    /// Adds an input array of type `ty`, blocked by `spec`.
    pub fn input(mut self, ty: TensorType, spec: BlockSpecFn) -> Self {
        self.inputs.push((ty, spec));
        self
    }

    /// Adds an output array of type `ty`, blocked by `spec`.
    pub fn output(mut self, ty: TensorType, spec: BlockSpecFn) -> Self {
        self.outputs.push((ty, spec));
        self
    }

    /// Adds a VMEM scratch buffer.
    pub fn scratch(mut self, ty: TensorType) -> Self {
        self.scratch.push(ty);
        self
    }

    /// Traces the body and verifies the kernel.
    pub fn build(self) -> Result<Kernel, VerifyError> {
        let rank = self.grid.len();
        let mut b = KernelBuilder::new(
            self.name.clone().unwrap_or_else(|| "kernel".into()),
            self.grid,
        );
        if let Some(s) = self.semantics {
            b.dimension_semantics(s);
        }
        let mut refs: Vec<RefId> = Vec::new();
        for (i, (ty, spec)) in self.inputs.iter().enumerate() {
            refs.push(b.input(format!("in{i}"), ty.clone(), spec.resolve(rank)));
        }
        for (i, (ty, spec)) in self.outputs.iter().enumerate() {
            refs.push(b.output(format!("out{i}"), ty.clone(), spec.resolve(rank)));
        }
        for (i, ty) in self.scratch.iter().enumerate() {
            refs.push(b.scratch(format!("scratch{i}"), ty.clone()));
        }
        if refs.len() != F::ARITY {
            return Err(VerifyError {
                op: "pallas_call".into(),
                message: format!(
                    "the kernel body takes {} refs but {} inputs, {} outputs and {} scratch \
                     buffers were declared",
                    F::ARITY,
                    self.inputs.len(),
                    self.outputs.len(),
                    self.scratch.len()
                ),
            });
        }
        if !context::install(b) {
            return Err(VerifyError {
                op: "pallas_call".into(),
                message: "pallas_call cannot be built inside another kernel body".into(),
            });
        }
        let guard = context::InstallGuard;
        let handles: Vec<Ref> = refs.into_iter().map(Ref::from_id).collect();
        self.body.trace(&handles);
        let mut b = context::take().expect("installed above and only removed by the guard");
        drop(guard);
        if let Some(name) = self.name {
            b.set_name(name);
        }
        b.set_location(None);
        b.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{REF_METHODS, TENSOR_METHODS};

    /// The `pub fn name(self` methods a DSL source file defines.
    fn methods(source: &str) -> Vec<&str> {
        source
            .split("pub fn ")
            .skip(1)
            .filter_map(|rest| rest.split_once("(self").map(|(name, _)| name))
            .filter(|name| name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .collect()
    }

    /// The lists the `#[kernel]` macro accepts are the DSL's API: this keeps them from
    /// drifting when a method is added.
    #[test]
    fn the_accepted_methods_are_the_dsls() {
        let tensor = include_str!("tensor.rs");
        let refs = include_str!("refs.rs");
        for m in methods(tensor) {
            assert!(
                TENSOR_METHODS.contains(&m),
                "Tensor::{m} is missing from TENSOR_METHODS"
            );
        }
        for m in methods(refs) {
            let known = REF_METHODS.contains(&m) || TENSOR_METHODS.contains(&m);
            assert!(known, "Ref::{m} is missing from REF_METHODS");
        }
        let all = [methods(tensor), methods(refs)].concat();
        for m in TENSOR_METHODS.iter().chain(REF_METHODS) {
            assert!(
                all.contains(m),
                "`{m}` is accepted but the DSL has no such method"
            );
        }
    }
}
