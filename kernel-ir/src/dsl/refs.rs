//! Refs (the kernel's view of its inputs, outputs and scratch) and the slices that
//! address them: `x.load(s![.., ds(k * bk, bk)])`.

use std::panic::Location;

use super::context::with_builder;
use super::tensor::Tensor;
use crate::ir::{Index, RefId, Start};
use crate::types::{DType, TensorType};

/// The `Ref` methods kernel code may call (besides the [`Tensor`] ones a ref forwards):
/// the `#[kernel]` macro accepts these. A test keeps the list equal to this file's methods.
pub const REF_METHODS: &[&str] = &[
    "id",
    "load",
    "read",
    "load_masked",
    "store",
    "write",
    "store_masked",
];

/// A ref: one block of an input or output, or a scratch buffer.
#[derive(Clone, Copy, Debug)]
pub struct Ref {
    id: RefId,
}

/// `size` elements from `start` (Pallas `pl.ds`); `start` may be traced.
#[derive(Clone, Copy, Debug)]
pub struct Ds {
    start: DsStart,
    size: u64,
}

#[derive(Clone, Copy, Debug)]
enum DsStart {
    Static(i64),
    Traced(Tensor),
}

/// A dynamic slice of `size` elements starting at `start` (a traced i32 scalar or a
/// Rust integer).
pub fn ds(start: impl Into<SliceStart>, size: u64) -> Ds {
    Ds {
        start: start.into().0,
        size,
    }
}

/// The start of a [`ds`] slice.
#[derive(Clone, Copy, Debug)]
pub struct SliceStart(DsStart);

impl From<Tensor> for SliceStart {
    fn from(t: Tensor) -> Self {
        SliceStart(DsStart::Traced(t))
    }
}

macro_rules! int_start {
    ($($t:ty),*) => {$(
        impl From<$t> for SliceStart {
            fn from(i: $t) -> Self {
                SliceStart(DsStart::Static(i as i64))
            }
        }
        impl From<$t> for SliceArg {
            fn from(i: $t) -> Self {
                SliceArg::Static(i as i64)
            }
        }
        impl From<std::ops::Range<$t>> for SliceArg {
            fn from(r: std::ops::Range<$t>) -> Self {
                SliceArg::Range(r.start as i64, r.end as i64)
            }
        }
    )*};
}
int_start!(i32, i64, u32, u64, usize);

/// One entry of an [`s!`](crate::s) slice list.
#[derive(Clone, Copy, Debug)]
pub enum SliceArg {
    /// `..`: the whole dimension.
    Full,
    /// A static position; the dimension is dropped.
    Static(i64),
    /// A traced position; the dimension is dropped.
    At(Tensor),
    /// `a..b` with static bounds.
    Range(i64, i64),
    /// `ds(start, size)`.
    Ds(Ds),
}

impl From<std::ops::RangeFull> for SliceArg {
    fn from(_: std::ops::RangeFull) -> Self {
        SliceArg::Full
    }
}

impl From<Tensor> for SliceArg {
    fn from(t: Tensor) -> Self {
        SliceArg::At(t)
    }
}

impl From<Ds> for SliceArg {
    fn from(d: Ds) -> Self {
        SliceArg::Ds(d)
    }
}

/// Builds a slice list for [`Ref::load`] and [`Ref::store`]: `..` for a whole dim,
/// `a..b` for a static range, `ds(start, size)` for a dynamic one, or a single index.
#[macro_export]
macro_rules! s {
    ($($e:expr),* $(,)?) => {
        ::std::vec![$($crate::dsl::SliceArg::from($e)),*]
    };
}

impl Ref {
    pub(crate) fn from_id(id: RefId) -> Ref {
        Ref { id }
    }

    /// The ref's id in the kernel.
    pub fn id(self) -> RefId {
        self.id
    }

    /// The type the kernel sees (the block shape without squeezed dims).
    #[track_caller]
    pub fn ty(self) -> TensorType {
        with_builder(Location::caller(), |b| b.ref_type(self.id))
    }

    /// The kernel-visible shape.
    #[track_caller]
    pub fn shape(self) -> Vec<u64> {
        self.ty().shape
    }

    /// The element type.
    #[track_caller]
    pub fn dtype(self) -> DType {
        self.ty().dtype
    }

    /// Loads a window (`x.load(s![.., ds(k * bk, bk)])`).
    #[track_caller]
    pub fn load(self, slices: Vec<SliceArg>) -> Tensor {
        self.load_impl(slices, None, None, Location::caller())
    }

    /// Loads the whole block.
    #[track_caller]
    pub fn read(self) -> Tensor {
        let rank = self.shape().len();
        self.load_impl(vec![SliceArg::Full; rank], None, None, Location::caller())
    }

    /// Loads a window; lanes where `mask` is false read `other` instead of memory and
    /// may lie outside the array.
    #[track_caller]
    pub fn load_masked(self, slices: Vec<SliceArg>, mask: Tensor, other: f64) -> Tensor {
        self.load_impl(slices, Some(mask), Some(other), Location::caller())
    }

    /// Stores `value` into a window.
    #[track_caller]
    pub fn store(self, slices: Vec<SliceArg>, value: Tensor) {
        self.store_impl(slices, value, None, Location::caller());
    }

    /// Stores `value` into the whole block.
    #[track_caller]
    pub fn write(self, value: Tensor) {
        let rank = self.shape().len();
        self.store_impl(vec![SliceArg::Full; rank], value, None, Location::caller());
    }

    /// Stores the lanes of `value` where `mask` is true.
    #[track_caller]
    pub fn store_masked(self, slices: Vec<SliceArg>, value: Tensor, mask: Tensor) {
        self.store_impl(slices, value, Some(mask), Location::caller());
    }

    fn index(self, slices: Vec<SliceArg>, location: &'static Location<'static>) -> Vec<Index> {
        with_builder(location, |b| {
            slices
                .into_iter()
                .map(|s| match s {
                    SliceArg::Full => Index::Full,
                    SliceArg::Static(i) => Index::At(b.index_const(i)),
                    SliceArg::At(t) => Index::At(t.value()),
                    SliceArg::Range(lo, hi) => {
                        if lo < 0 || hi <= lo {
                            b.report(
                                "load/store",
                                format!("slice {lo}..{hi} is empty or negative"),
                            );
                        }
                        Index::Slice {
                            start: Start::Static(lo.max(0) as u64),
                            size: (hi - lo).max(1) as u64,
                        }
                    }
                    SliceArg::Ds(Ds { start, size }) => Index::Slice {
                        start: match start {
                            DsStart::Static(s) if s >= 0 => Start::Static(s as u64),
                            DsStart::Static(s) => Start::Dynamic(b.index_const(s)),
                            DsStart::Traced(t) => Start::Dynamic(t.value()),
                        },
                        size,
                    },
                })
                .collect()
        })
    }

    fn load_impl(
        self,
        slices: Vec<SliceArg>,
        mask: Option<Tensor>,
        other: Option<f64>,
        location: &'static Location<'static>,
    ) -> Tensor {
        let index = self.index(slices, location);
        let v = with_builder(location, |b| {
            let dtype = b.ref_type(self.id).dtype;
            let other = other.map(|o| {
                let lit = match dtype {
                    DType::I32 => crate::ir::Literal::Int(o as i64),
                    DType::Bool => crate::ir::Literal::Bool(o != 0.0),
                    _ => crate::ir::Literal::Float(o),
                };
                b.constant(lit, TensorType::scalar(dtype))
            });
            b.load(self.id, index, mask.map(Tensor::value), other)
        });
        Tensor::from_value(v)
    }

    fn store_impl(
        self,
        slices: Vec<SliceArg>,
        value: Tensor,
        mask: Option<Tensor>,
        location: &'static Location<'static>,
    ) {
        let index = self.index(slices, location);
        with_builder(location, |b| {
            b.store(self.id, index, value.value(), mask.map(Tensor::value))
        });
    }
}
