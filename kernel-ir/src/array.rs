//! Host arrays: what kernels take and return, and what the interpreter computes on.
//! bf16 and f16 elements are stored as f32 values already rounded to their precision,
//! so every float op computes in f32 and rounds its result.

use std::fmt;

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
}

/// A dense row-major array with a dtype and a static shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    ty: TensorType,
    data: ArrayData,
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

/// Why an array could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayError(pub String);

impl fmt::Display for ArrayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ArrayError {}

impl Array {
    /// An array of `ty` whose elements are all zero (false).
    pub fn zeros(ty: TensorType) -> Array {
        Array::filled(ty, 0.0)
    }

    /// An array of `ty` filled with `value` (converted to the dtype; NaN becomes
    /// `i32::MIN` for integers and `false` for bools).
    pub fn filled(ty: TensorType, value: f64) -> Array {
        let n = ty.num_elements() as usize;
        let data = match ty.dtype {
            d if d.is_float() => ArrayData::Float(vec![round_to(d, value as f32); n]),
            DType::I32 => ArrayData::Int(vec![
                if value.is_nan() {
                    i32::MIN
                } else {
                    value as i32
                };
                n
            ]),
            _ => ArrayData::Bool(vec![value != 0.0 && !value.is_nan(); n]),
        };
        Array { ty, data }
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
        Ok(Array { ty, data })
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

    /// Mutable element storage.
    pub fn data_mut(&mut self) -> &mut ArrayData {
        &mut self.data
    }

    /// Float elements, or `None` for i32/bool arrays.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            ArrayData::Float(v) => Some(v),
            _ => None,
        }
    }

    /// Every element widened to f64 (bools as 0/1).
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            ArrayData::Float(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::Int(v) => v.iter().map(|&x| f64::from(x)).collect(),
            ArrayData::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        }
    }

    pub(crate) fn from_parts(ty: TensorType, data: ArrayData) -> Array {
        debug_assert_eq!(data.len() as u64, ty.num_elements());
        Array { ty, data }
    }
}
