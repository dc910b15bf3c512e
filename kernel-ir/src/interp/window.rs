//! Addressing a window of a ref: which array elements a load or store touches. Indices
//! are checked against the block extent; an edge block may overhang its array (Pallas's
//! semantics: reads there are unspecified, writes are dropped).

use crate::array::ArrayData;
use crate::ir::{Index, RefDecl};
use crate::ops::{window_plan, WindowStart};
use crate::types::{row_major_strides, TensorType};

/// The part of one array dimension a window covers.
#[derive(Clone, Copy, Debug)]
pub(super) struct DimAccess {
    /// Array coordinate of the first element.
    pub start: u64,
    /// Number of elements.
    pub count: u64,
    /// Whether the dimension stays in the loaded value (not squeezed or indexed).
    pub keep: bool,
}

/// Resolves a load/store index into per-array-dim accesses by the shared window plan.
/// `block_start` is where the program's block begins (all zeros for scratch); `scalar`
/// reads an i32 index value. A dynamic start that leaves the block is an error.
pub(super) fn resolve(
    decl: &RefDecl,
    block_start: &[u64],
    index: &[Index],
    mut scalar: impl FnMut(crate::ir::Value) -> i64,
) -> Result<Vec<DimAccess>, String> {
    window_plan(decl, index)
        .iter()
        .zip(block_start)
        .map(|(w, &base)| {
            let offset = match w.start {
                WindowStart::Block => 0,
                WindowStart::Static(s) => s as i64,
                WindowStart::Dynamic(v) => scalar(v),
            };
            if offset < 0 || offset as u64 + w.count > w.extent {
                let dim = w.index_dim.unwrap_or_default();
                return Err(if w.kept {
                    format!(
                        "slice [{offset}, {}) of dim {dim} is outside the block extent {}",
                        offset + w.count as i64,
                        w.extent
                    )
                } else {
                    format!(
                        "index {offset} of dim {dim} is outside the block extent {}",
                        w.extent
                    )
                });
            }
            Ok(DimAccess {
                start: base + offset as u64,
                count: w.count,
                keep: w.kept,
            })
        })
        .collect()
}

/// The type of the value a window loads or stores.
pub(super) fn value_type(decl: &RefDecl, dims: &[DimAccess]) -> TensorType {
    TensorType::new(
        decl.ty.dtype,
        dims.iter()
            .filter(|d| d.keep)
            .map(|d| d.count)
            .collect::<Vec<_>>(),
    )
}

/// Calls `f(window_offset, array_offset, in_bounds, count)` for each contiguous run of
/// the window along the last array dim; the first `in_bounds` elements of the run exist
/// in the array (the rest overhang it: an edge block). Returns the number of window
/// elements.
fn for_each_run(
    dims: &[DimAccess],
    shape: &[u64],
    mut f: impl FnMut(usize, usize, usize, usize),
) -> usize {
    if dims.is_empty() {
        f(0, 0, 1, 1);
        return 1;
    }
    let strides = row_major_strides(shape);
    let last = dims.len() - 1;
    let count = dims[last].count as usize;
    let in_bounds_last = shape[last]
        .saturating_sub(dims[last].start)
        .min(dims[last].count) as usize;
    let mut idx = vec![0u64; last];
    let mut window_off = 0;
    loop {
        let mut array_off = dims[last].start as usize;
        let mut outer_ok = true;
        for d in 0..last {
            let c = dims[d].start + idx[d];
            outer_ok &= c < shape[d];
            array_off += (c * strides[d]) as usize;
        }
        let in_bounds = if outer_ok { in_bounds_last } else { 0 };
        f(window_off, array_off, in_bounds, count);
        window_off += count;
        let mut d = last;
        loop {
            if d == 0 {
                return window_off;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < dims[d].count {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Reads the window: masked-off lanes read `other`, lanes past the array `poison`.
fn gather<T: Copy>(
    src: &[T],
    dims: &[DimAccess],
    shape: &[u64],
    len: usize,
    mask: Option<&[bool]>,
    (other, poison): (T, T),
) -> Vec<T> {
    let mut out = Vec::with_capacity(len);
    for_each_run(dims, shape, |w, a, in_bounds, count| match mask {
        None => {
            if in_bounds > 0 {
                out.extend_from_slice(&src[a..a + in_bounds]);
            }
            out.resize(out.len() + count - in_bounds, poison);
        }
        Some(m) => out.extend((0..count).map(|j| match (m[w + j], j < in_bounds) {
            (false, _) => other,
            (true, true) => src[a + j],
            (true, false) => poison,
        })),
    });
    out
}

/// Writes the window: masked-off lanes and lanes past the array are left alone.
fn scatter<T: Copy>(
    dst: &mut [T],
    dims: &[DimAccess],
    shape: &[u64],
    values: &[T],
    mask: Option<&[bool]>,
) {
    // Runs wholly past the array (in_bounds == 0) may start past its end: skip them.
    for_each_run(dims, shape, |w, a, in_bounds, _| match mask {
        _ if in_bounds == 0 => {}
        None => dst[a..a + in_bounds].copy_from_slice(&values[w..w + in_bounds]),
        Some(m) => {
            for j in (0..in_bounds).filter(|&j| m[w + j]) {
                dst[a + j] = values[w + j];
            }
        }
    });
}

/// Reads a window; masked-off lanes read `other` (a one-element storage, or zero).
/// Lanes of an edge block that lie past the array read poison (NaN, `i32::MIN`,
/// `false`): their values are unspecified, as in Pallas, and a kernel that lets them
/// reach its outputs shows NaN.
pub(super) fn load(
    src: &ArrayData,
    shape: &[u64],
    dims: &[DimAccess],
    mask: Option<&[bool]>,
    other: Option<&ArrayData>,
) -> ArrayData {
    let len: usize = dims.iter().map(|d| d.count as usize).product();
    match src {
        ArrayData::Float(v) => {
            let o = match other {
                Some(ArrayData::Float(o)) => o[0],
                _ => 0.0,
            };
            ArrayData::Float(gather(v, dims, shape, len, mask, (o, f32::NAN)))
        }
        ArrayData::Int(v) => {
            let o = match other {
                Some(ArrayData::Int(o)) => o[0],
                _ => 0,
            };
            ArrayData::Int(gather(v, dims, shape, len, mask, (o, i32::MIN)))
        }
        ArrayData::Bool(v) => {
            let o = matches!(other, Some(ArrayData::Bool(o)) if o[0]);
            ArrayData::Bool(gather(v, dims, shape, len, mask, (o, false)))
        }
    }
}

/// Writes a window; masked-off lanes, and lanes of an edge block past the array (as in
/// Pallas), are left untouched.
pub(super) fn store(
    dst: &mut ArrayData,
    shape: &[u64],
    dims: &[DimAccess],
    values: &ArrayData,
    mask: Option<&[bool]>,
) {
    match (dst, values) {
        (ArrayData::Float(d), ArrayData::Float(v)) => scatter(d, dims, shape, v, mask),
        (ArrayData::Int(d), ArrayData::Int(v)) => scatter(d, dims, shape, v, mask),
        (ArrayData::Bool(d), ArrayData::Bool(v)) => scatter(d, dims, shape, v, mask),
        _ => unreachable!("the verifier checks that stored values match the ref dtype"),
    }
}
