//! Arrays laid out as the native code reads and writes them: f32, i32 and bool arrays as
//! they are, bf16 and f16 as 2-byte elements (an [`Array`] holds those as f32 values;
//! PyTorch's tensors, and so the compiled kernels, hold them in 2 bytes).

use std::ffi::c_void;
use std::sync::Arc;

use kernel_ir::{AllocError, Array, ArrayData, DType, TensorType};

/// An array in the native code's element layout (see the module doc). Clones share the
/// storage, as [`Array`]'s do.
#[derive(Clone, Debug)]
pub struct NativeArray(Storage);

#[derive(Clone, Debug)]
enum Storage {
    /// f32, i32 and bool: the array's own storage.
    Array(Array),
    /// bf16 and f16: their 2-byte encodings.
    Half(TensorType, Arc<Vec<u16>>),
}

/// Whether the native code holds `dtype` in 2 bytes.
fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
}

impl NativeArray {
    /// `a` in the native layout: shared with `a` (no copy) unless it is bf16/f16, whose
    /// values are encoded into 2-byte elements.
    pub fn from_array(a: &Array) -> Result<NativeArray, AllocError> {
        let (ArrayData::Float(values), true) = (a.data(), is_half(a.dtype())) else {
            return Ok(NativeArray(Storage::Array(a.clone())));
        };
        let what = || format!("the 2-byte copy of a {} array", a.ty());
        let mut bits = kernel_ir::try_with_capacity(what, values.len() as u64)?;
        bits.extend(
            values
                .iter()
                .map(|&x| kernel_ir::to_half_bits(a.dtype(), x)),
        );
        Ok(NativeArray(Storage::Half(a.ty().clone(), Arc::new(bits))))
    }

    /// A zeroed array of `ty`; `what` names it if memory runs out.
    pub fn zeros(ty: TensorType, what: &str) -> Result<NativeArray, AllocError> {
        Ok(NativeArray(if is_half(ty.dtype) {
            let bits = kernel_ir::try_vec(|| format!("{what} ({ty})"), ty.num_elements(), 0)?;
            Storage::Half(ty, Arc::new(bits))
        } else {
            Storage::Array(Array::try_zeros(ty, what)?)
        }))
    }

    /// The array's type.
    pub fn ty(&self) -> &TensorType {
        match &self.0 {
            Storage::Array(a) => a.ty(),
            Storage::Half(ty, _) => ty,
        }
    }

    /// The address of the first element.
    pub fn as_ptr(&self) -> *const c_void {
        match &self.0 {
            Storage::Array(a) => a.data().as_ptr().cast(),
            Storage::Half(_, bits) => bits.as_ptr().cast(),
        }
    }

    /// The address of the first element, for writing (the storage is copied first if a
    /// clone of the array shares it).
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        match &mut self.0 {
            Storage::Array(a) => a.data_mut().as_ptr().cast_mut().cast(),
            Storage::Half(_, bits) => Arc::make_mut(bits).as_mut_ptr().cast(),
        }
    }

    /// The values as an [`Array`] (bf16/f16 decoded to f32 values).
    pub fn into_array(self) -> Result<Array, AllocError> {
        match self.0 {
            Storage::Array(a) => Ok(a),
            Storage::Half(ty, bits) => {
                let bits = Arc::try_unwrap(bits).unwrap_or_else(|shared| (*shared).clone());
                let what = || format!("the values of a {ty} array");
                let mut values = kernel_ir::try_with_capacity(what, bits.len() as u64)?;
                values.extend(bits.iter().map(|&b| kernel_ir::from_half_bits(ty.dtype, b)));
                Ok(Array::new(ty, ArrayData::Float(values)).expect("one value per element"))
            }
        }
    }
}
