//! Shared pieces: random inputs, dtype tolerances, kernels built once per configuration,
//! and kernel helpers for masking the ragged last block of an array.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kernel_ir::dsl::prelude::*;
use kernel_ir::{try_vec, try_with_capacity, AllocError, Array, Kernel};
use kernel_macros::kernel_fn;
use rand::{Rng, SeedableRng};

use crate::{BoxError, Tolerance};

/// Uniform random values in `[-scale, scale)`, rounded to `dtype`.
pub fn random_array(dtype: DType, shape: &[u64], seed: u64, scale: f32) -> Result<Array, BoxError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ty = kernel_ir::TensorType::new(dtype, shape);
    let what = || format!("a random input ({ty})");
    // An overflowing element count is reported as such by the allocation.
    let n = ty.byte_size().map_or(u64::MAX, |_| ty.num_elements());
    let mut data = try_with_capacity(what, n)?;
    data.extend((0..n).map(|_| rng.gen_range(-scale..scale)));
    Ok(Array::from_f32(dtype, shape.to_vec(), data)?)
}

/// Kernels [`built`] so far, by builder and configuration.
static BUILT: Mutex<Option<HashMap<String, Arc<Kernel>>>> = Mutex::new(None);

/// How many kernels [`BUILT`] keeps before it starts over.
const BUILT_LIMIT: usize = 64;

/// `build(c)`, or the kernel the same builder made before for an equal configuration:
/// tracing a kernel (~0.3 ms for attention's) costs more than launching a small one, and
/// ops that compute on the host between kernels run their builders on every call.
/// `build` is a named function (its type names it; the closures of one function would
/// share a name).
pub(crate) fn built<C, F>(build: F, c: C) -> Result<Arc<Kernel>, BoxError>
where
    C: std::fmt::Debug,
    F: FnOnce(C) -> Result<Kernel, BoxError>,
{
    let builder = std::any::type_name::<F>();
    debug_assert!(!builder.contains("{{closure}}"), "{builder} is a closure");
    let key = format!("{builder} {c:?}");
    let memo = || BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(kernel) = memo().as_ref().and_then(|m| m.get(&key)) {
        return Ok(kernel.clone());
    }
    let kernel = Arc::new(build(c)?);
    let mut memo = memo();
    let map = memo.get_or_insert_with(HashMap::new);
    if map.len() >= BUILT_LIMIT {
        map.clear();
    }
    map.insert(key, kernel.clone());
    Ok(kernel)
}

/// A zeroed f64 vector for a reference result, allocated fallibly.
pub fn zeros_f64(what: &str, len: usize) -> Result<Vec<f64>, AllocError> {
    try_vec(|| format!("the reference's {what}"), len as u64, 0.0)
}

/// An empty f64 vector with room for a reference result of `len` elements.
pub fn room_f64(what: &str, len: usize) -> Result<Vec<f64>, AllocError> {
    try_with_capacity(|| format!("the reference's {what}"), len as u64)
}

/// Tolerance for results computed from `dtype` inputs with f32 accumulation over
/// `reduction` terms: f32 rounding grows with the reduction; bf16/f16 results are
/// rounded to 8/11 mantissa bits.
pub fn tolerance_for(dtype: DType, reduction: u64) -> Tolerance {
    let r = (reduction.max(1) as f64).sqrt();
    match dtype {
        DType::BF16 => Tolerance {
            abs: 2e-2 * r.clamp(1.0, 4.0),
            rel: 1.6e-2,
        },
        DType::F16 => Tolerance {
            abs: 4e-3 * r.clamp(1.0, 4.0),
            rel: 2e-3,
        },
        _ => Tolerance {
            abs: 2e-5 * r,
            rel: 1e-5,
        },
    }
}

/// Block size along a dim of `n`: `preferred`, or the whole dim if it is smaller.
pub fn block(n: u64, preferred: u64) -> u64 {
    preferred.min(n)
}

/// `index_map` helpers.
pub fn pid(i: &[IndexExpr], axis: usize) -> IndexExpr {
    i[axis].clone()
}

/// A zero block index.
pub fn zero() -> IndexExpr {
    IndexExpr::Const(0)
}

/// Mask of a `[rows, cols]` block whose first row is `row0`: true where the row is
/// below `limit` (the array's row count).
#[kernel_fn]
pub fn rows_below(rows: u64, cols: u64, row0: Tensor, limit: u64) -> Tensor {
    (iota([rows, cols], 0) + row0).lt(limit)
}

/// Mask of a `[rows, cols]` block whose first column is `col0`: true where the column
/// is below `limit`.
#[kernel_fn]
pub fn cols_below(rows: u64, cols: u64, col0: Tensor, limit: u64) -> Tensor {
    (iota([rows, cols], 1) + col0).lt(limit)
}

/// Whether tiling an `[nrows, ncols]` array with `[rows, cols]` tiles leaves ragged
/// edge tiles (which then need masks).
pub fn ragged(rows: u64, cols: u64, nrows: u64, ncols: u64) -> bool {
    !nrows.is_multiple_of(rows) || !ncols.is_multiple_of(cols)
}

/// True for the lanes of the `[rows, cols]` tile at `(row0, col0)` that lie inside an
/// `[nrows, ncols]` array.
#[kernel_fn]
pub fn inside(rows: u64, cols: u64, row0: Tensor, col0: Tensor, nrows: u64, ncols: u64) -> Tensor {
    rows_below(rows, cols, row0, nrows) & cols_below(rows, cols, col0, ncols)
}

/// Loads a `[rows, cols]` tile whose top-left element is `(row0, col0)` of an
/// `[nrows, ncols]` array; lanes past the array's edge read zero.
#[kernel_fn]
pub fn load_tile(
    r: Ref,
    rows: u64,
    cols: u64,
    row0: Tensor,
    col0: Tensor,
    nrows: u64,
    ncols: u64,
) -> Tensor {
    if ragged(rows, cols, nrows, ncols) {
        let mask = inside(rows, cols, row0, col0, nrows, ncols);
        r.load_masked(s![.., ..], mask, 0.0)
    } else {
        r.read()
    }
}

/// Stores a tile, leaving lanes past the array's edge untouched.
#[kernel_fn]
pub fn store_tile(
    r: Ref,
    value: Tensor,
    rows: u64,
    cols: u64,
    row0: Tensor,
    col0: Tensor,
    nrows: u64,
    ncols: u64,
) {
    if ragged(rows, cols, nrows, ncols) {
        let mask = inside(rows, cols, row0, col0, nrows, ncols);
        r.store_masked(s![.., ..], value, mask);
    } else {
        r.write(value);
    }
}

#[cfg(test)]
mod tests {
    use super::built;
    use crate::attention::AttentionConfig;
    use crate::{Op, Params};

    /// A builder runs once per configuration: an equal configuration gets the same
    /// kernel back, another configuration or builder its own.
    #[test]
    fn kernels_are_built_once_per_builder_and_configuration() {
        let config = |causal: &str| {
            let p = Params::with(
                crate::attention::FlashAttention::PARAMS,
                &[("q_len", "40"), ("kv_len", "40"), ("causal", causal)],
            )
            .unwrap();
            crate::attention::FlashAttention::config(&p).unwrap()
        };
        let (causal, full) = (config("true"), config("false"));
        let first = built(AttentionConfig::forward, causal).unwrap();
        let again = built(AttentionConfig::forward, causal).unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        assert_eq!(*first, causal.forward().unwrap());
        let other = built(AttentionConfig::forward, full).unwrap();
        assert_ne!(*other, *first);
        let delta = built(AttentionConfig::backward_delta, causal).unwrap();
        assert_ne!(*delta, *first);
    }
}
