//! PyTorch's stable C interface (the `aoti_torch_*` functions `libtorch_cpu` exports),
//! resolved at run time from the copy `import torch` loaded: the extension neither links
//! libtorch nor depends on its C++ ABI. It covers what the dispatcher-registered ops
//! need: reading tensor arguments, allocating results, and registering boxed kernels.

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

/// `AtenTensorHandle`: an owning pointer to an `at::Tensor`.
pub(crate) type Handle = *mut c_void;
/// One value on a boxed kernel's stack (tensors are handles, floats their bits, ...).
pub(crate) type StableIValue = u64;
/// A boxed kernel: the stack holds the arguments on entry and the results on return.
pub(crate) type BoxedKernel = unsafe extern "C-unwind" fn(*mut StableIValue, u64, u64);

type Status = i32;

/// The resolved entry points, and the dtype and device codes of this PyTorch.
pub(crate) struct Torch {
    delete_tensor: unsafe extern "C" fn(Handle) -> Status,
    data_ptr: unsafe extern "C" fn(Handle, *mut *mut c_void) -> Status,
    dim: unsafe extern "C" fn(Handle, *mut i64) -> Status,
    sizes: unsafe extern "C" fn(Handle, *mut *const i64) -> Status,
    dtype: unsafe extern "C" fn(Handle, *mut i32) -> Status,
    device_type: unsafe extern "C" fn(Handle, *mut i32) -> Status,
    is_contiguous: unsafe extern "C" fn(Handle, *mut bool) -> Status,
    is_defined: unsafe extern "C" fn(Handle, *mut bool) -> Status,
    empty_strided:
        unsafe extern "C" fn(i64, *const i64, *const i64, i32, i32, i32, *mut Handle) -> Status,
    copy: unsafe extern "C" fn(Handle, Handle, i32) -> Status,
    delete_stable_ivalue: unsafe extern "C" fn(*mut StableIValue) -> Status,
    library_init_impl: unsafe extern "C" fn(
        *const c_char,
        *const c_char,
        *const c_char,
        u32,
        *mut *mut c_void,
    ) -> Status,
    library_impl: unsafe extern "C" fn(*mut c_void, *const c_char, BoxedKernel) -> Status,
    /// The codes of `torch.float32`, `torch.int32`, `torch.bool` and `torch.int64`
    /// (index tensors, taken as int32), from the stable interface.
    pub(crate) f32: i32,
    pub(crate) i32: i32,
    pub(crate) bool: i32,
    pub(crate) i64: i32,
    cpu: i32,
    /// Keeps libtorch mapped (it is, by `import torch`, for the life of the process).
    _lib: libloading::Library,
}

static TORCH: OnceLock<Torch> = OnceLock::new();

/// The resolved interface; [`load`] has run (the ops are registered only after it).
pub(crate) fn torch() -> &'static Torch {
    TORCH
        .get()
        .expect("the dispatcher ops are registered after libtorch is resolved")
}

/// The resolved interface, if [`load`] has run.
pub(crate) fn loaded() -> Option<&'static Torch> {
    TORCH.get()
}

/// Resolves the interface from `libtorch_cpu` at `path` (already loaded by `import
/// torch`, so this finds the same copy).
pub(crate) fn load(path: &str) -> Result<&'static Torch, String> {
    if let Some(t) = TORCH.get() {
        return Ok(t);
    }
    // SAFETY: loading libtorch runs no initialisers that were not run by `import torch`.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("cannot open PyTorch's library {path}: {e}"))?;
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the declared types are those of PyTorch's C shim (shim.h).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                format!(
                    "{path} has no `{}` (Tessera needs PyTorch >= 2.10): {e}",
                    $name
                )
            })?
        };
    }
    let code = |f: unsafe extern "C" fn() -> i32| unsafe { f() };
    let f32_code = code(symbol!("aoti_torch_dtype_float32"));
    let torch = Torch {
        delete_tensor: symbol!("aoti_torch_delete_tensor_object"),
        data_ptr: symbol!("aoti_torch_get_data_ptr"),
        dim: symbol!("aoti_torch_get_dim"),
        sizes: symbol!("aoti_torch_get_sizes"),
        dtype: symbol!("aoti_torch_get_dtype"),
        device_type: symbol!("aoti_torch_get_device_type"),
        is_contiguous: symbol!("aoti_torch_is_contiguous"),
        is_defined: symbol!("aoti_torch_is_defined"),
        empty_strided: symbol!("aoti_torch_empty_strided"),
        copy: symbol!("aoti_torch_copy_"),
        delete_stable_ivalue: symbol!("torch_delete_stable_ivalue"),
        library_init_impl: symbol!("aoti_torch_library_init_impl"),
        library_impl: symbol!("aoti_torch_library_impl"),
        f32: f32_code,
        i32: code(symbol!("aoti_torch_dtype_int32")),
        bool: code(symbol!("aoti_torch_dtype_bool")),
        i64: code(symbol!("aoti_torch_dtype_int64")),
        cpu: code(symbol!("aoti_torch_device_type_cpu")),
        _lib: lib,
    };
    for (code, name) in [
        (torch.f32, "torch.float32"),
        (torch.i32, "torch.int32"),
        (torch.bool, "torch.bool"),
        (torch.i64, "torch.int64"),
    ] {
        if torch.dtype_name(code) != name {
            return Err(format!(
                "PyTorch's code for {name} is {code}, not its ScalarType number: this \
                 PyTorch's stable interface is not the one Tessera was written for"
            ));
        }
    }
    Ok(TORCH.get_or_init(|| torch))
}

impl Torch {
    /// The OpenMP runtime ATen's intra-op parallelism runs on: libgomp's entry points as
    /// `libtorch_cpu` resolves them (a lookup through its handle searches the libraries
    /// it loaded, so this is the copy PyTorch uses); an error says which is missing (a
    /// PyTorch built without OpenMP).
    pub(crate) fn openmp(&self) -> Result<runtime::native::OpenMp, String> {
        let mut addresses = [std::ptr::null(); 5];
        for (address, name) in addresses.iter_mut().zip(runtime::native::OPENMP_SYMBOLS) {
            // SAFETY: only the address is read; `OpenMp::from_symbols` types it.
            let symbol = unsafe { self._lib.get::<*const c_void>(name.as_bytes()) }
                .map_err(|e| format!("PyTorch's library has no OpenMP `{name}`: {e}"))?;
            *address = *symbol;
        }
        // SAFETY: the addresses are libgomp's functions of those names, loaded with
        // libtorch for the life of the process.
        Ok(unsafe { runtime::native::OpenMp::from_symbols(addresses) })
    }
}

fn check(status: Status, what: &str) -> Result<(), String> {
    if status == 0 {
        Ok(())
    } else {
        Err(format!("PyTorch could not {what}"))
    }
}

impl Torch {
    /// Registers `kernels` (op name, boxed kernel) as the CPU kernels of ops in
    /// `namespace` (defined beforehand). The registrations last for the process.
    pub(crate) fn register_cpu(
        &self,
        namespace: &str,
        kernels: &[(&str, BoxedKernel)],
    ) -> Result<(), String> {
        let c = |s: &str| CString::new(s).map_err(|_| format!("`{s}` contains a NUL byte"));
        let (ns, key, file) = (c(namespace)?, c("CPU")?, c(file!())?);
        let mut lib = std::ptr::null_mut();
        // SAFETY: valid C strings; `lib` receives a new library object, kept forever.
        check(
            unsafe {
                (self.library_init_impl)(ns.as_ptr(), key.as_ptr(), file.as_ptr(), 0, &mut lib)
            },
            &format!("open an implementation library for namespace `{namespace}`"),
        )?;
        for (name, kernel) in kernels {
            let op = c(name)?;
            // SAFETY: `lib` is live and `kernel` follows the boxed calling convention.
            check(
                unsafe { (self.library_impl)(lib, op.as_ptr(), *kernel) },
                &format!("register the CPU kernel of {namespace}::{name}"),
            )?;
        }
        Ok(())
    }

    /// Tessera's name of dtype `code` (`f32`, `bf16`, `f16`, `i32`, `bool`), if its
    /// kernels take it (`kernels::torch_op::DTYPES`).
    pub(crate) fn tessera_dtype(&self, code: i32) -> Option<&'static str> {
        let name = SCALAR_TYPES.get(usize::try_from(code).ok()?)?;
        kernels::torch_op::DTYPES
            .iter()
            .find(|d| d.torch.strip_prefix("torch.") == Some(name))
            .and_then(|d| d.kernel)
            .map(|k| k.name())
    }

    /// The code of the dtype Tessera calls `name` ([`Torch::tessera_dtype`]'s inverse).
    pub(crate) fn dtype_code(&self, name: &str) -> Option<i32> {
        (0..SCALAR_TYPES.len() as i32).find(|&code| self.tessera_dtype(code) == Some(name))
    }

    /// The name PyTorch prints for dtype `code` (`torch.float64`, ...).
    pub(crate) fn dtype_name(&self, code: i32) -> String {
        match SCALAR_TYPES.get(code as usize) {
            Some(n) => format!("torch.{n}"),
            None => format!("dtype #{code}"),
        }
    }
}

/// PyTorch's ScalarType numbering (the dtype codes of the stable interface), by name.
const SCALAR_TYPES: [&str; 16] = [
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "bool",
    "qint8",
    "quint8",
    "qint32",
    "bfloat16",
];

/// An owned tensor handle (deleted on drop).
pub(crate) struct Tensor(Handle);

// SAFETY: an `at::Tensor` handle may move between threads; PyTorch reference-counts
// the storage atomically.
unsafe impl Send for Tensor {}

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: the handle is owned and deleted once.
        unsafe { (torch().delete_tensor)(self.0) };
    }
}

impl Tensor {
    /// Takes ownership of a handle from a boxed kernel's stack.
    ///
    /// # Safety
    /// `handle` must be an owning tensor handle not owned by anything else.
    pub(crate) unsafe fn from_raw(handle: Handle) -> Tensor {
        Tensor(handle)
    }

    /// Gives the handle away (to a boxed kernel's stack).
    pub(crate) fn into_raw(self) -> Handle {
        let h = self.0;
        std::mem::forget(self);
        h
    }

    /// The sizes.
    pub(crate) fn shape(&self) -> Vec<u64> {
        let t = torch();
        let (mut dim, mut sizes) = (0i64, std::ptr::null());
        // SAFETY: a live handle; the sizes are borrowed from the tensor, copied here.
        unsafe {
            (t.dim)(self.0, &mut dim);
            (t.sizes)(self.0, &mut sizes);
            if sizes.is_null() || dim <= 0 {
                return vec![];
            }
            std::slice::from_raw_parts(sizes, dim as usize)
                .iter()
                .map(|&s| s as u64)
                .collect()
        }
    }

    /// The dtype code.
    pub(crate) fn dtype(&self) -> i32 {
        let mut d = -1;
        // SAFETY: a live handle.
        unsafe { (torch().dtype)(self.0, &mut d) };
        d
    }

    /// Whether the handle holds a tensor (`None` passed for a tensor argument does not).
    pub(crate) fn is_defined(&self) -> bool {
        let mut yes = false;
        // SAFETY: a live handle.
        unsafe { (torch().is_defined)(self.0, &mut yes) };
        yes
    }

    /// Whether the tensor is on the CPU.
    pub(crate) fn is_cpu(&self) -> bool {
        let mut d = -1;
        // SAFETY: a live handle.
        unsafe { (torch().device_type)(self.0, &mut d) };
        d == torch().cpu
    }

    /// The address of the first element (the storage offset included).
    pub(crate) fn data(&self) -> usize {
        let mut p = std::ptr::null_mut();
        // SAFETY: a live handle.
        unsafe { (torch().data_ptr)(self.0, &mut p) };
        p as usize
    }

    /// A fresh contiguous CPU tensor.
    pub(crate) fn empty(shape: &[u64], dtype: i32) -> Result<Tensor, String> {
        let t = torch();
        let sizes: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
        let mut strides = vec![1i64; sizes.len()];
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1].max(1);
        }
        let mut h = std::ptr::null_mut();
        // SAFETY: `sizes` and `strides` hold `len` entries; `h` receives a new handle.
        check(
            unsafe {
                (t.empty_strided)(
                    sizes.len() as i64,
                    sizes.as_ptr(),
                    strides.as_ptr(),
                    dtype,
                    t.cpu,
                    0,
                    &mut h,
                )
            },
            &format!(
                "allocate a {} tensor of shape {shape:?}",
                t.dtype_name(dtype)
            ),
        )?;
        Ok(Tensor(h))
    }

    /// This tensor if it is contiguous, else a contiguous copy.
    pub(crate) fn contiguous(self) -> Result<Tensor, String> {
        let mut yes = false;
        // SAFETY: a live handle.
        unsafe { (torch().is_contiguous)(self.0, &mut yes) };
        if yes {
            return Ok(self);
        }
        let copy = Tensor::empty(&self.shape(), self.dtype())?;
        copy.copy_from(&self)?;
        Ok(copy)
    }

    /// Copies `src` (same shape; any layout and dtype) into this tensor.
    pub(crate) fn copy_from(&self, src: &Tensor) -> Result<(), String> {
        // SAFETY: two live handles; PyTorch checks the shapes.
        check(
            unsafe { (torch().copy)(self.0, src.0, 0) },
            "copy a tensor into contiguous memory",
        )
    }
}

/// Reads an optional value's payload off a boxed stack (`None` for null) and frees
/// the box PyTorch allocated for it.
///
/// # Safety
/// `value` must be an optional argument from a boxed kernel's stack, read once.
pub(crate) unsafe fn take_optional(value: StableIValue) -> Option<StableIValue> {
    let boxed = value as *mut StableIValue;
    if boxed.is_null() {
        return None;
    }
    let inner = *boxed;
    (torch().delete_stable_ivalue)(boxed);
    Some(inner)
}

extern "C-unwind" {
    /// Throws a C++ `std::runtime_error` with the message (src/throw.cc).
    fn tessera_throw(message: *const c_char, length: usize) -> !;
}

/// Raises `message` as a C++ exception out of a boxed kernel; PyTorch turns it into a
/// Python `RuntimeError`. Nothing Rust owns may be alive in the caller's frames.
pub(crate) fn throw(message: &str) -> ! {
    // SAFETY: the helper copies the message before throwing.
    unsafe { tessera_throw(message.as_ptr() as *const c_char, message.len()) }
}

/// An int64 tensor (PyTorch's index tensors) as a fresh int32 tensor, or the first
/// value int32 cannot hold.
pub(crate) fn int32_of(t: Tensor) -> Result<Tensor, String> {
    let shape = t.shape();
    let wide = t.contiguous()?;
    let n = shape.iter().product::<u64>() as usize;
    // SAFETY: a fresh contiguous int64 tensor of `n` elements, and one of int32.
    let values = unsafe { std::slice::from_raw_parts(wide.data() as *const i64, n) };
    let narrow = Tensor::empty(&shape, torch().i32)?;
    let out = unsafe { std::slice::from_raw_parts_mut(narrow.data() as *mut i32, n) };
    for (i, (&v, o)) in values.iter().zip(out.iter_mut()).enumerate() {
        *o = i32::try_from(v).map_err(|_| {
            format!(
                "int64 value {v} (element {i}) is out of the int32 range Tessera's kernels \
                 index with"
            )
        })?;
    }
    Ok(narrow)
}
