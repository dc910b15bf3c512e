//! User op libraries: `cdylib`s that export kernels with `tessera::export_ops!`
//! (`kernel_ir::op_library` describes the protocol). A library is loaded once and never
//! unloaded (its functions stay callable); each op is built once per argument set (the
//! IR text it returns is parsed and verified here) and run like a library kernel.

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use kernel_ir::op_library::{read_answer, Built, IR_VERSION, PROTOCOL_VERSION};
use kernel_ir::{DType, Kernel, TensorType};
use pyo3::exceptions::{PyFileNotFoundError, PyValueError};
use pyo3::prelude::*;

use crate::{Buffer, HostCall, OpError};

type BuildSymbol = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut c_char;
type ManifestSymbol = unsafe extern "C" fn() -> *mut c_char;
type FreeSymbol = unsafe extern "C" fn(*mut c_char);

/// Namespaces a library may not use: PyTorch's and Tessera's own.
const RESERVED_NAMESPACES: &[&str] = &["aten", "prim", "prims", "quantized", "tessera"];

/// Kernels built per library, op and request, at most this many (then the memo restarts).
const BUILD_MEMO_LIMIT: usize = 1024;

/// A loaded library: its path, its entry points, and the kernels built so far.
struct Loaded {
    path: String,
    namespace: String,
    schemas: Vec<String>,
    build: BuildSymbol,
    free: FreeSymbol,
    built: HashMap<(String, String), UserBuild>,
    /// Keeps the code mapped.
    _lib: libloading::Library,
}

fn libraries() -> &'static Mutex<Vec<Loaded>> {
    static LIBS: OnceLock<Mutex<Vec<Loaded>>> = OnceLock::new();
    LIBS.get_or_init(Default::default)
}

/// Takes a string a library returned, freeing it with the library's `free`.
///
/// # Safety
/// `p` must be null or a string the library made, not yet freed.
unsafe fn take(p: *mut c_char, free: FreeSymbol) -> Option<String> {
    if p.is_null() {
        return None;
    }
    let text = CStr::from_ptr(p).to_string_lossy().into_owned();
    free(p);
    Some(text)
}

/// Checks a manifest's header; returns the namespace and the op schemas.
fn parse_manifest(path: &str, text: &str) -> Result<(String, Vec<String>), String> {
    let mut lines = text.lines();
    let mut field = |key: &str| -> Result<String, String> {
        let line = lines.next().unwrap_or_default();
        line.strip_prefix(key)
            .map(|v| v.trim().to_string())
            .ok_or_else(|| {
                format!("{path}: malformed manifest: expected `{key} ...`, found `{line}`")
            })
    };
    let protocol = field("tessera-op-library ")?;
    let ir = field("ir ")?;
    if protocol != PROTOCOL_VERSION.to_string() || ir != IR_VERSION.to_string() {
        return Err(format!(
            "{path} speaks op-library protocol {protocol} with IR version {ir}; this Tessera \
             speaks protocol {PROTOCOL_VERSION}, IR version {IR_VERSION}: rebuild the library \
             against this Tessera"
        ));
    }
    let namespace = field("namespace ")?;
    if namespace.is_empty()
        || !namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!(
            "{path}: namespace `{namespace}` is not an identifier"
        ));
    }
    let schemas = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.strip_prefix("op ").map(str::to_string).ok_or_else(|| {
                format!("{path}: malformed manifest line `{l}` (expected `op <schema>`)")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((namespace, schemas))
}

/// Loads the op library at `path` (once per path); returns its id, namespace and op
/// schemas. A reserved namespace, or one another loaded library has, is refused (so a
/// namespace names one library, as graph mode's custom calls rely on).
#[pyfunction]
fn load_library(path: &str) -> PyResult<(usize, String, Vec<String>)> {
    let mut libs = libraries().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = libs.iter().position(|l| l.path == path) {
        return Ok((i, libs[i].namespace.clone(), libs[i].schemas.clone()));
    }
    if !std::path::Path::new(path).exists() {
        return Err(PyFileNotFoundError::new_err(format!(
            "{path}: no such file"
        )));
    }
    // SAFETY: loading runs the library's initializers; a Tessera op library has none
    // beyond Rust's.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| PyValueError::new_err(format!("{path}: cannot load: {e}")))?;
    let symbol = |name: &str| -> PyResult<usize> {
        // SAFETY: only the address is read here; its type is the protocol's.
        unsafe { lib.get::<*const ()>(name.as_bytes()) }
            .map(|s| *s as usize)
            .map_err(|_| {
                PyValueError::new_err(format!(
                    "{path} is not a Tessera op library (it has no `{name}`; export ops with \
                     `tessera::export_ops!`)"
                ))
            })
    };
    let (manifest, build, free) = (
        symbol("tessera_op_library_v1")?,
        symbol("tessera_build_v1")?,
        symbol("tessera_free_v1")?,
    );
    // SAFETY: the symbols have the protocol's signatures (`export_ops!` defines them).
    let (manifest, build, free): (ManifestSymbol, BuildSymbol, FreeSymbol) = unsafe {
        (
            std::mem::transmute::<usize, ManifestSymbol>(manifest),
            std::mem::transmute::<usize, BuildSymbol>(build),
            std::mem::transmute::<usize, FreeSymbol>(free),
        )
    };
    // SAFETY: the manifest function takes nothing and returns a string to free.
    let text = unsafe { take(manifest(), free) }
        .ok_or_else(|| PyValueError::new_err(format!("{path}: the manifest is empty")))?;
    let (namespace, schemas) = parse_manifest(path, &text).map_err(PyValueError::new_err)?;
    if RESERVED_NAMESPACES.contains(&namespace.as_str()) {
        return Err(PyValueError::new_err(format!(
            "{path}: namespace `{namespace}` is reserved; choose another in export_ops!"
        )));
    }
    if let Some(other) = libs.iter().find(|l| l.namespace == namespace) {
        return Err(PyValueError::new_err(format!(
            "{path}: namespace `{namespace}` is already registered by {}",
            other.path
        )));
    }
    libs.push(Loaded {
        path: path.to_string(),
        namespace: namespace.clone(),
        schemas: schemas.clone(),
        build,
        free,
        built: HashMap::new(),
        _lib: lib,
    });
    Ok((libs.len() - 1, namespace, schemas))
}

/// What a user op's build answered for one request.
#[derive(Clone)]
pub(crate) enum UserBuild {
    /// Its kernel, verified.
    Kernel(Arc<Kernel>),
    /// The output types of a call with nothing to compute (an empty batch).
    Outputs(Arc<[TensorType]>),
}

impl UserBuild {
    /// The types of the call's results.
    pub(crate) fn output_types(&self) -> Vec<TensorType> {
        match self {
            UserBuild::Kernel(k) => k.output_types(),
            UserBuild::Outputs(types) => types.to_vec(),
        }
    }

    /// Runs the call on buffers, on `backend`; a call with nothing to compute zero-fills
    /// its outputs without a launch (`None`: no backend ran).
    pub(crate) fn run(
        &self,
        context: &str,
        backend: runtime::Backend,
        inputs: &[Buffer],
        outputs: &[Buffer],
    ) -> Result<Option<&'static str>, OpError> {
        match self {
            UserBuild::Kernel(k) => HostCall::new(context.to_string(), backend, inputs, outputs)?
                .run_kernel(k)
                .map(Some),
            UserBuild::Outputs(_) => {
                zero_fill(outputs);
                Ok(None)
            }
        }
    }
}

/// Writes zeros over each buffer.
fn zero_fill(buffers: &[Buffer]) {
    for (data, shape, dtype) in buffers {
        let elements: u64 = shape.iter().product();
        let size = DType::from_name(dtype).map_or(0, DType::size_bytes);
        // SAFETY: each buffer is the caller's storage of `shape` elements of `dtype`.
        unsafe { std::ptr::write_bytes(*data as *mut u8, 0, elements as usize * size) };
    }
}

/// What op `op` of library `lib` builds for `request`, built and verified once.
pub(crate) fn build(lib: usize, op: &str, request: &str) -> Result<UserBuild, OpError> {
    let (build, free, path) = {
        let libs = libraries().lock().unwrap_or_else(|e| e.into_inner());
        let l = libs
            .get(lib)
            .ok_or_else(|| OpError::Bad(format!("no op library #{lib} is loaded")))?;
        let key = (op.to_string(), request.to_string());
        if let Some(k) = l.built.get(&key) {
            return Ok(k.clone());
        }
        (l.build, l.free, l.path.clone())
    };
    let bad = |m: String| OpError::Bad(format!("{path}: op `{op}`: {m}"));
    let (c_op, c_request) = (
        CString::new(op).map_err(|e| bad(e.to_string()))?,
        CString::new(request).map_err(|e| bad(e.to_string()))?,
    );
    // SAFETY: both arguments are NUL-terminated; the answer is freed by `take`.
    let answer = unsafe { take(build(c_op.as_ptr(), c_request.as_ptr()), free) }
        .ok_or_else(|| bad("the build returned nothing".into()))?;
    let built = match read_answer(&answer).map_err(bad)? {
        Built::Kernel(k) => UserBuild::Kernel(Arc::new(k)),
        Built::Outputs(types) => UserBuild::Outputs(types.into()),
    };
    let mut libs = libraries().lock().unwrap_or_else(|e| e.into_inner());
    let memo = &mut libs[lib].built;
    if memo.len() >= BUILD_MEMO_LIMIT {
        memo.clear();
    }
    memo.insert((op.to_string(), request.to_string()), built.clone());
    Ok(built)
}

/// The output types of op `op` of library `lib` for `request`: `[(dtype, shape)]`.
#[pyfunction]
fn user_output_types(
    py: Python<'_>,
    lib: usize,
    op: &str,
    request: &str,
) -> PyResult<Vec<(String, Vec<u64>)>> {
    let built = py.detach(|| build(lib, op, request))?;
    Ok(built
        .output_types()
        .into_iter()
        .map(|t| (t.dtype.name().to_string(), t.shape))
        .collect())
}

/// Runs op `op` of library `lib` for `request` on `inputs` (its tensor arguments, in
/// order) into `outputs`; returns the backend that ran it (`none` for a call with
/// nothing to compute).
#[pyfunction]
#[pyo3(signature = (lib, op, request, inputs, outputs, backend = "auto"))]
fn run_user(
    py: Python<'_>,
    lib: usize,
    op: &str,
    request: &str,
    inputs: Vec<Buffer>,
    outputs: Vec<Buffer>,
    backend: &str,
) -> PyResult<&'static str> {
    Ok(py.detach(|| -> Result<&'static str, OpError> {
        let built = build(lib, op, request)?;
        if matches!(built, UserBuild::Kernel(_)) {
            crate::launches::record(|| format!("user op {op} {request}"));
        }
        let requested = backend
            .parse()
            .map_err(|e: runtime::Error| OpError::Bad(e.to_string()))?;
        let ran = built.run(&format!("op `{op}`"), requested, &inputs, &outputs)?;
        Ok(ran.unwrap_or("none"))
    })?)
}

/// Registers native CPU kernels (`user_kernels`) for ops `[(name, [(argument, type)])]`
/// of library `lib`, already defined in `namespace`.
#[pyfunction]
fn register_user_kernels(
    lib: usize,
    namespace: &str,
    ops: Vec<(String, Vec<(String, String)>)>,
) -> PyResult<()> {
    crate::user_kernels::register(lib, namespace, ops).map_err(PyValueError::new_err)
}

/// Adds the library functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(load_library, m)?)?;
    m.add_function(wrap_pyfunction!(register_user_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(user_output_types, m)?)?;
    m.add_function(wrap_pyfunction!(run_user, m)?)?;
    Ok(())
}

/// A user op inside an XLA program (graph mode): the custom call's `params` are
/// `namespace=<ns>`, `op=<name>`, `request=<hex of the request text>`, which name the
/// kernel in any process that loaded the library.
pub(crate) struct UserCall {
    lib: usize,
    op: String,
    request: String,
}

impl UserCall {
    /// Parses the custom call's `name=value` params.
    pub(crate) fn parse(params: &[String]) -> Result<UserCall, String> {
        let get = |key: &str| {
            params
                .iter()
                .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| format!("user op call without `{key}=` (params: {params:?})"))
        };
        let namespace = get("namespace")?;
        let lib = libraries()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .position(|l| l.namespace == namespace)
            .ok_or_else(|| {
                format!(
                    "op library `{namespace}` is not loaded in this process: call \
                     tessera.load_library first"
                )
            })?;
        let hex = get("request")?;
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| format!("malformed request `{hex}`"))?;
        Ok(UserCall {
            lib,
            op: get("op")?.to_string(),
            request: String::from_utf8(bytes).map_err(|e| e.to_string())?,
        })
    }

    /// What the call's op builds for it.
    pub(crate) fn build(&self) -> Result<UserBuild, String> {
        build(self.lib, &self.op, &self.request).map_err(OpError::message)
    }

    /// Runs the call on XLA's buffers: natively, or in the interpreter when the native
    /// backend declines the kernel.
    pub(crate) fn run(&self, inputs: &[Buffer], outputs: &[Buffer]) -> Result<(), String> {
        let built = self.build()?;
        let context = format!("op `{}`", self.op);
        let run = |backend| built.run(&context, backend, inputs, outputs);
        run(runtime::Backend::Native)
            .or_else(|_| run(runtime::Backend::Interp))
            .map(|_| ())
            .map_err(OpError::message)
    }
}
