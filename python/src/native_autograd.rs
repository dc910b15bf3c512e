//! The ops' native autograd kernels (src/autograd.cc): a shared library built against
//! the PyTorch headers found at build time and embedded in the extension, which keeps
//! no link to PyTorch's C++ ABI itself. It is loaded from memory after `import torch`
//! (its libtorch dependencies resolve to the copies already loaded); if it does not
//! load — another PyTorch, or a build that found no headers — the ops keep their Python
//! autograd kernels.

use std::ffi::{c_char, CStr, CString};
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::Mutex;

/// The shared library, when this build found PyTorch's headers.
#[cfg(autograd_shim)]
const SHIM: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/libtessera_autograd.so"
)));
#[cfg(not(autograd_shim))]
const SHIM: Option<&[u8]> = None;

/// Whether this build has the library.
pub(crate) const BUILT: bool = SHIM.is_some();

/// `tessera_register_autograd(namespace, names, count)`: null, or an error message.
type Register = unsafe extern "C" fn(*const c_char, *const *const c_char, usize) -> *const c_char;

/// `tessera_autograd_torch_version()`: the PyTorch version the library was built with.
type TorchVersion = unsafe extern "C" fn() -> *const c_char;

/// Registers the native autograd kernel of `namespace::name` for each of `names` on CPU
/// tensors, if the library was built for PyTorch `torch_version` (`2.13.0`). The
/// library is loaded once and stays loaded (the dispatcher holds its code).
pub(crate) fn register(
    namespace: &str,
    names: &[String],
    torch_version: &str,
) -> Result<(), String> {
    static LOADED: Mutex<Option<libloading::Library>> = Mutex::new(None);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if loaded.is_none() {
        *loaded = Some(load()?);
    }
    let library = loaded.as_ref().expect("loaded above");
    // SAFETY: the symbol has this type and returns a static C string (src/autograd.cc).
    let built_for = unsafe {
        let version = library
            .get::<TorchVersion>(b"tessera_autograd_torch_version\0")
            .map_err(|e| format!("the native autograd library has no version: {e}"))?;
        CStr::from_ptr(version()).to_string_lossy().into_owned()
    };
    if built_for != torch_version {
        return Err(format!(
            "the native autograd kernels were built for PyTorch {built_for}, this is {torch_version} (rebuild the extension)"
        ));
    }
    // SAFETY: the symbol has this type (src/autograd.cc).
    let register = unsafe { library.get::<Register>(b"tessera_register_autograd\0") }
        .map_err(|e| format!("the native autograd library has no entry point: {e}"))?;
    let c = |s: &str| CString::new(s).map_err(|_| format!("`{s}` contains a NUL byte"));
    let namespace = c(namespace)?;
    let names = names.iter().map(|n| c(n)).collect::<Result<Vec<_>, _>>()?;
    let pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    // SAFETY: valid C strings, alive for the call; the function catches C++ exceptions.
    let error = unsafe { register(namespace.as_ptr(), pointers.as_ptr(), pointers.len()) };
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a C string valid until the next call, which the lock excludes.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy();
    Err(format!(
        "registering the native autograd kernels failed: {message}"
    ))
}

/// Loads the embedded library from an anonymous in-memory file.
fn load() -> Result<libloading::Library, String> {
    let bytes = SHIM.ok_or(
        "this build has no native autograd kernels (PyTorch's headers were not found when \
         it was built)",
    )?;
    // SAFETY: a plain system call; the name is a C string.
    let fd = unsafe { libc::memfd_create(c"tessera_autograd".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "memfd_create failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `fd` is a fresh descriptor this function owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes)
        .map_err(|e| format!("cannot write the native autograd library: {e}"))?;
    let path = format!("/proc/self/fd/{fd}");
    // SAFETY: the library's initialisers only set up its statics; its libtorch
    // dependencies are the copies `import torch` loaded.
    unsafe { libloading::Library::new(&path) }.map_err(|e| {
        format!("cannot load the native autograd library (built for another PyTorch?): {e}")
    })
}
