//! Host arrays: what kernels take and return, and what the interpreter computes on.
//! bf16 and f16 elements are stored as f32 values already rounded to their precision,
//! so every float op computes in f32 and rounds its result.

use std::fmt;
use std::sync::Arc;

use crate::types::{DType, TensorType};

/// Element storage.
#[derive(Clone, Debug, PartialEq)]
pub enum ArrayData {
    /// f32, bf16 and f16 elements (the latter two rounded to their precision).
    Float(Vec<f32>),
    /// i32 elements.
    Int(Vec<i32>),
    /// bool elements.
    Bool(Vec<bool>),
}

impl ArrayData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ArrayData::Float(v) => v.len(),
            ArrayData::Int(v) => v.len(),
            ArrayData::Bool(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of the first element, for code that reads the storage in place (a
    /// `bool` is one byte holding 0 or 1).
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            ArrayData::Float(v) => v.as_ptr().cast(),
            ArrayData::Int(v) => v.as_ptr().cast(),
            ArrayData::Bool(v) => v.as_ptr().cast(),
        }
    }
}

/// A dense row-major array with a dtype and a static shape. Clones share the elements
/// (copy on write: [`Array::data_mut`] copies them only while they are shared).
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    ty: TensorType,
    data: Arc<ArrayData>,
}

/// Rounds an f32 to the precision of `dtype` (identity for f32 and non-floats).
#[inline]
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The 2-byte encoding of `x` as a `dtype` element (bf16, else f16; rounded to nearest
/// even): how tensors and the native backend's memory hold those dtypes.
#[inline]
pub fn to_half_bits(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(x).to_bits(),
        _ => half::f16::from_f32(x).to_bits(),
    }
}

/// The value of a 2-byte `dtype` element (bf16, else f16) as f32 (exact).
#[inline]
pub fn from_half_bits(dtype: DType, bits: u16) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_bits(bits).to_f32(),
        _ => half::f16::from_bits(bits).to_f32(),
    }
}

/// Why an array could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayError(pub String);

impl fmt::Display for ArrayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArrayError {}

impl From<AllocError> for ArrayError {
    fn from(e: AllocError) -> Self {
        ArrayError(e.to_string())
    }
}

/// An array that could not be allocated: what it is and how many bytes it needs
/// (`None` when the size overflows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocError {
    /// The array, e.g. "output %o (f32[3000000, 3000000])".
    pub what: String,
    /// Bytes requested, if representable.
    pub bytes: Option<u64>,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes {
            Some(b) => write!(
                f,
                "cannot allocate {}: {b} bytes ({}) are not available",
                self.what,
                human_bytes(b)
            ),
            None => write!(
                f,
                "cannot allocate {}: its size in bytes overflows",
                self.what
            ),
        }
    }
}

impl std::error::Error for AllocError {}

impl AllocError {
    /// True when `e` or one of its sources is an [`AllocError`].
    pub fn in_chain(e: &(dyn std::error::Error + 'static)) -> bool {
        std::iter::successors(Some(e), |e| e.source()).any(|e| e.is::<AllocError>())
    }
}

/// `bytes` in the largest binary unit that keeps it >= 1 (e.g. "32.7 TiB").
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// An empty vector with room for `len` elements, allocated fallibly (the memory is
/// reserved, not touched): the error names `what` and the byte size instead of
/// aborting the process.
pub fn try_with_capacity<T>(what: impl FnOnce() -> String, len: u64) -> Result<Vec<T>, AllocError> {
    let bytes = len.checked_mul(std::mem::size_of::<T>() as u64);
    let mut v = Vec::new();
    match (usize::try_from(len), bytes) {
        (Ok(n), Some(b)) if b <= isize::MAX as u64 && v.try_reserve_exact(n).is_ok() => Ok(v),
        _ => Err(AllocError {
            what: what(),
            bytes,
        }),
    }
}

/// A vector of `len` copies of `value`, allocated fallibly (see [`try_with_capacity`]).
pub fn try_vec<T: Clone>(
    what: impl FnOnce() -> String,
    len: u64,
    value: T,
) -> Result<Vec<T>, AllocError> {
    let mut v = try_with_capacity(what, len)?;
    v.resize(len as usize, value);
    Ok(v)
}

impl Array {
    /// An array of `ty` whose elements are all zero (false).
    pub fn zeros(ty: TensorType) -> Array {
        Array::filled(ty, 0.0)
    }

    /// An array of `ty` filled with `value` (converted to the dtype; NaN becomes
    /// `i32::MIN` for integers and `false` for bools). Aborts if it cannot be
    /// allocated: for sizes that come from input, use [`Array::try_filled`].
    pub fn filled(ty: TensorType, value: f64) -> Array {
        Array::try_filled(ty, value, "an array").unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Array::filled`], allocated fallibly; the error names the array as `what`.
    pub fn try_filled(ty: TensorType, value: f64, what: &str) -> Result<Array, AllocError> {
        let what = || format!("{what} ({ty})");
        let n = ty
            .byte_size()
            .map(|_| ty.num_elements())
            .ok_or_else(|| AllocError {
                what: what(),
                bytes: None,
            })?;
        let data = match ty.dtype {
            d if d.is_float() => ArrayData::Float(try_vec(what, n, round_to(d, value as f32))?),
            DType::I32 => {
                let v = if value.is_nan() {
                    i32::MIN
                } else {
                    value as i32
                };
                ArrayData::Int(try_vec(what, n, v)?)
            }
            _ => ArrayData::Bool(try_vec(what, n, value != 0.0 && !value.is_nan())?),
        };
        Ok(Array {
            ty,
            data: Arc::new(data),
        })
    }

    /// [`Array::zeros`], allocated fallibly; the error names the array as `what`.
    pub fn try_zeros(ty: TensorType, what: &str) -> Result<Array, AllocError> {
        Array::try_filled(ty, 0.0, what)
    }

    /// A float array (f32, bf16 or f16); values are rounded to the dtype.
    pub fn from_f32(
        dtype: DType,
        shape: impl Into<Vec<u64>>,
        mut data: Vec<f32>,
    ) -> Result<Array, ArrayError> {
        if !dtype.is_float() {
            return Err(ArrayError(format!(
                "from_f32 needs a float dtype, got {dtype}"
            )));
        }
        if dtype != DType::F32 {
            data.iter_mut().for_each(|x| *x = round_to(dtype, *x));
        }
        Array::new(TensorType::new(dtype, shape), ArrayData::Float(data))
    }

    /// An i32 array.
    pub fn from_i32(shape: impl Into<Vec<u64>>, data: Vec<i32>) -> Result<Array, ArrayError> {
        Array::new(TensorType::new(DType::I32, shape), ArrayData::Int(data))
    }

    /// An array from storage matching `ty` (float data must already be rounded).
    pub fn new(ty: TensorType, data: ArrayData) -> Result<Array, ArrayError> {
        let kind_ok = matches!(
            (&data, ty.dtype),
            (ArrayData::Float(_), DType::F32 | DType::BF16 | DType::F16)
                | (ArrayData::Int(_), DType::I32)
                | (ArrayData::Bool(_), DType::Bool)
        );
        if !kind_ok {
            return Err(ArrayError(format!(
                "storage does not hold {} elements",
                ty.dtype
            )));
        }
        if data.len() as u64 != ty.num_elements() {
            return Err(ArrayError(format!(
                "type {ty} has {} elements but {} were given",
                ty.num_elements(),
                data.len()
            )));
        }
        Ok(Array {
            ty,
            data: Arc::new(data),
        })
    }

    /// The array's type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[u64] {
        &self.ty.shape
    }

    /// Element storage.
    pub fn data(&self) -> &ArrayData {
        &self.data
    }

    /// Mutable element storage (copied first if a clone shares it).
    pub fn data_mut(&mut self) -> &mut ArrayData {
        Arc::make_mut(&mut self.data)
    }

    /// The element storage, taken out (copied if a clone shares it).
    pub fn into_data(self) -> ArrayData {
        Arc::try_unwrap(self.data).unwrap_or_else(|shared| (*shared).clone())
    }

    /// Float elements, or `None` for i32/bool arrays.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &*self.data {
            ArrayData::Float(v) => Some(v),
            _ => None,
        }
    }

    /// Every element widened to f64 (bools as 0/1).
    pub fn to_f64(&self) -> Vec<f64> {
        self.try_to_f64("an array")
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Array::to_f64`], allocated fallibly; the error names the copy as `what`.
    pub fn try_to_f64(&self, what: &str) -> Result<Vec<f64>, AllocError> {
        let mut out = try_with_capacity(
            || format!("{what} as f64 ({})", self.ty),
            self.data.len() as u64,
        )?;
        out.extend(self.iter_f64());
        Ok(out)
    }

    /// Every element widened to f64 (bools as 0/1), without allocating.
    pub fn iter_f64(&self) -> Box<dyn Iterator<Item = f64> + '_> {
        match &*self.data {
            ArrayData::Float(v) => Box::new(v.iter().map(|&x| f64::from(x))),
            ArrayData::Int(v) => Box::new(v.iter().map(|&x| f64::from(x))),
            ArrayData::Bool(v) => Box::new(v.iter().map(|&x| f64::from(u8::from(x)))),
        }
    }

    pub(crate) fn from_parts(ty: TensorType, data: ArrayData) -> Array {
        debug_assert_eq!(data.len() as u64, ty.num_elements());
        Array {
            ty,
            data: Arc::new(data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone shares the elements until one side writes: the write copies them, so the
    /// other side keeps its values.
    #[test]
    fn clones_share_elements_until_one_writes() {
        let a = Array::from_f32(DType::F32, vec![3], vec![1.0, 2.0, 3.0]).unwrap();
        let mut b = a.clone();
        assert!(
            std::ptr::eq(a.data(), b.data()),
            "a clone shares the elements"
        );
        if let ArrayData::Float(v) = b.data_mut() {
            v[0] = 9.0;
        }
        assert_eq!(a.as_f32().unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(b.as_f32().unwrap(), [9.0, 2.0, 3.0]);
        let unique = b.data() as *const ArrayData;
        assert!(
            std::ptr::eq(b.data_mut(), unique),
            "an unshared array writes in place"
        );
        assert_eq!(a.clone().into_data(), ArrayData::Float(vec![1.0, 2.0, 3.0]));
    }
}
