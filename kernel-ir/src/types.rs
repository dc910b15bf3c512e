//! Element types and static tensor types.

use std::fmt;

/// Element type of a tensor or array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// bfloat16: f32 range, 8 bits of mantissa.
    BF16,
    /// IEEE 754 half precision.
    F16,
    /// 32-bit signed integer (also used for scalar index math).
    I32,
    /// Boolean (`i1` in MLIR); results of comparisons and masks.
    Bool,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::Bool];

    /// True for f32, bf16 and f16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// Size of one element in bytes (bool counts as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::Bool => 1,
        }
    }

    /// The name used in the text form (`f32`, `bf16`, `f16`, `i32`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Parses a dtype name as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A statically shaped tensor type; an empty shape is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
}

impl TensorType {
    /// A tensor type of the given dtype and shape.
    pub fn new(dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A rank-0 type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType::new(dtype, Vec::new())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// True when the type has no dimensions.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Number of elements. The verifier guarantees it does not overflow for the types
    /// of a verified kernel; use [`TensorType::byte_size`] on unchecked types.
    pub fn num_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Size in bytes, or `None` when it overflows or exceeds what one allocation can
    /// hold (`isize::MAX` bytes).
    pub fn byte_size(&self) -> Option<u64> {
        let bytes = self
            .shape
            .iter()
            .try_fold(self.dtype.size_bytes() as u64, |a, &d| a.checked_mul(d))?;
        (bytes <= isize::MAX as u64).then_some(bytes)
    }

    /// The same shape with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType::new(dtype, self.shape.clone())
    }
}

/// Parses the printed form: `f32`, `bf16[4, 8]`.
impl std::str::FromStr for TensorType {
    type Err = String;

    fn from_str(s: &str) -> Result<TensorType, String> {
        let s = s.trim();
        let (name, dims) = match s.split_once('[') {
            Some((name, rest)) => {
                let dims = rest
                    .strip_suffix(']')
                    .ok_or_else(|| format!("tensor type `{s}` does not end with `]`"))?;
                (name, Some(dims))
            }
            None => (s, None),
        };
        let dtype = DType::from_name(name.trim())
            .ok_or_else(|| format!("unknown dtype `{name}` in `{s}`"))?;
        let shape = dims
            .filter(|d| !d.trim().is_empty())
            .map(|d| {
                d.split(',')
                    .map(|x| {
                        x.trim()
                            .parse::<u64>()
                            .map_err(|e| format!("dimension `{x}` of `{s}`: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(TensorType::new(dtype, shape))
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shape.is_empty() {
            return write!(f, "{}", self.dtype);
        }
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Row-major strides (in elements) of a shape.
pub fn row_major_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_names() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(
            TensorType::new(DType::BF16, [2, 3]).to_string(),
            "bf16[2, 3]"
        );
        assert_eq!(TensorType::scalar(DType::I32).to_string(), "i32");
    }

    #[test]
    fn strides() {
        assert_eq!(row_major_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(row_major_strides(&[]), Vec::<u64>::new());
    }
}
