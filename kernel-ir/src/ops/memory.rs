//! `load` and `store` of a window of a ref, and the window plan every backend follows.
//!
//! A window is addressed per dimension of the ref's kernel type ([`Index`]) inside the
//! program's block; [`window_plan`] resolves that into one [`WindowDim`] per *array*
//! dimension (squeezed block dims included), which the interpreter (`interp/window.rs`)
//! and every lowering turn into their own offsets. Semantics (Pallas's): the block may
//! overhang its array at the edge — reads there are unspecified (the interpreter reads
//! NaN poison), writes there are dropped; a dynamic index that leaves the *block* is an
//! error. Masked-off lanes read `other` (zero by default) and are not written.

use super::{not_in_family, OpTraits, TypeCx};
use crate::ir::{BlockDim, Index, OpKind, RefDecl, RefKind, Start, Value};
use crate::types::{DType, TensorType};

pub(super) fn traits(op: &OpKind) -> OpTraits {
    OpTraits {
        pure: matches!(op, OpKind::Load { .. }),
        ..OpTraits::PURE
    }
}

/// Where a window dimension starts, relative to the program's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowStart {
    /// At the block's start.
    Block,
    /// A constant offset into the block.
    Static(u64),
    /// An i32 scalar offset computed by the kernel; must keep the window in the block.
    Dynamic(Value),
}

/// One array dimension of a load/store window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowDim {
    /// Offset of the window's first element from the block's start.
    pub start: WindowStart,
    /// Number of elements.
    pub count: u64,
    /// The block's extent in this dimension (1 when squeezed).
    pub extent: u64,
    /// Position of this dimension in the op's index list (`None` for a squeezed dim).
    pub index_dim: Option<usize>,
    /// Whether the dimension stays in the loaded/stored value (not squeezed, not indexed
    /// by a scalar).
    pub kept: bool,
}

/// Resolves a load/store `index` of ref `decl` into one [`WindowDim`] per array dim.
pub fn window_plan(decl: &RefDecl, index: &[Index]) -> Vec<WindowDim> {
    let mut next_index = 0;
    decl.block_dims()
        .into_iter()
        .map(|bd| {
            let BlockDim::Size(extent) = bd else {
                return WindowDim {
                    start: WindowStart::Block,
                    count: 1,
                    extent: 1,
                    index_dim: None,
                    kept: false,
                };
            };
            let index_dim = next_index;
            next_index += 1;
            let (start, count, kept) = match index[index_dim] {
                Index::Full => (WindowStart::Block, extent, true),
                Index::At(v) => (WindowStart::Dynamic(v), 1, false),
                Index::Slice {
                    start: Start::Static(s),
                    size,
                } => (WindowStart::Static(s), size, true),
                Index::Slice {
                    start: Start::Dynamic(v),
                    size,
                } => (WindowStart::Dynamic(v), size, true),
            };
            WindowDim {
                start,
                count,
                extent,
                index_dim: Some(index_dim),
                kept,
            }
        })
        .collect()
}

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::Load {
            src,
            index,
            mask,
            other,
        } => {
            let decl = ref_decl(cx, *src)?;
            let window = window_type(cx, &decl.kernel_type(), index)
                .map_err(|e| format!("ref %{}: {e}", decl.name))?;
            check_mask(cx, *mask, &window)?;
            if let Some(o) = other {
                let ot = cx.ty(*o);
                if ot != TensorType::scalar(window.dtype) {
                    return Err(format!("other has type {ot}, expected {}", window.dtype));
                }
            }
            Ok(vec![window])
        }
        OpKind::Store {
            dst,
            index,
            value,
            mask,
        } => {
            let decl = ref_decl(cx, *dst)?;
            if decl.kind == RefKind::Input {
                return Err(format!(
                    "ref %{} is an input and cannot be stored to",
                    decl.name
                ));
            }
            let window = window_type(cx, &decl.kernel_type(), index)
                .map_err(|e| format!("ref %{}: {e}", decl.name))?;
            let vt = cx.ty(*value);
            if vt != window {
                return Err(format!("stored value has type {vt}, expected {window}"));
            }
            check_mask(cx, *mask, &window)?;
            Ok(vec![])
        }
        _ => not_in_family(op, "memory"),
    }
}

fn ref_decl<'a>(cx: &TypeCx<'a>, r: crate::ir::RefId) -> Result<&'a RefDecl, String> {
    cx.env
        .ref_decl(r)
        .ok_or_else(|| format!("ref #{} does not exist", r.0))
}

fn check_mask(cx: &TypeCx, mask: Option<Value>, window: &TensorType) -> Result<(), String> {
    if let Some(m) = mask {
        let (mt, want) = (cx.ty(m), window.with_dtype(DType::Bool));
        if mt != want {
            return Err(format!("mask has type {mt}, expected {want}"));
        }
    }
    Ok(())
}

/// Shape of the window that `index` selects from a ref whose kernel type is `ref_ty`.
fn window_type(cx: &TypeCx, ref_ty: &TensorType, index: &[Index]) -> Result<TensorType, String> {
    if index.len() != ref_ty.rank() {
        return Err(format!(
            "has {} indices but the ref has rank {} (type {ref_ty})",
            index.len(),
            ref_ty.rank()
        ));
    }
    let mut shape = Vec::new();
    for (dim, (ix, &extent)) in index.iter().zip(&ref_ty.shape).enumerate() {
        match ix {
            Index::Full => shape.push(extent),
            Index::At(v) => cx.expect_index_scalar(*v, &format!("index of dim {dim}"))?,
            Index::Slice { start, size } => {
                if *size == 0 || *size > extent {
                    return Err(format!(
                        "slice of dim {dim} has size {size}, expected 1..={extent} (the ref's extent)"
                    ));
                }
                match start {
                    Start::Static(s) if s + size > extent => {
                        return Err(format!(
                            "slice of dim {dim} covers [{s}, {}) but the ref's extent is {extent}",
                            s + size
                        ))
                    }
                    Start::Dynamic(v) => {
                        cx.expect_index_scalar(*v, &format!("start of dim {dim}"))?
                    }
                    _ => {}
                }
                shape.push(*size);
            }
        }
    }
    Ok(TensorType::new(ref_ty.dtype, shape))
}
