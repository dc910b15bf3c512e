//! Graph mode's XLA path on jaxlib's in-process CPU client: the runtime's two-tier
//! compilation cache over a compiler written in Python (`tessera.graph.jaxlib_xla`'s
//! bridge to the client), so both XLA clients share one cache (keys, disk format,
//! corrupt entries dropped and recompiled, counters).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use runtime::cache::{self, Cache, Compiler};

/// jaxlib's client as a [`Compiler`]: calls the bridge's `compile`, `serialize` and
/// `deserialize`; its executables are the client's Python objects.
struct PyCompiler {
    bridge: Py<PyAny>,
    fingerprint: String,
}

/// A Python exception as the cache's error text.
fn text(e: PyErr) -> String {
    e.to_string()
}

impl Compiler for PyCompiler {
    type Executable = Py<PyAny>;

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    fn compile(&self, module: &str) -> Result<Py<PyAny>, String> {
        Python::attach(|py| {
            self.bridge
                .call_method1(py, "compile", (module,))
                .map_err(text)
        })
    }

    fn serialize(&self, exe: &Py<PyAny>) -> Result<Vec<u8>, String> {
        Python::attach(|py| {
            let bytes = self
                .bridge
                .call_method1(py, "serialize", (exe,))
                .map_err(text)?;
            bytes.extract::<Vec<u8>>(py).map_err(text)
        })
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Py<PyAny>, String> {
        Python::attach(|py| {
            let bytes = PyBytes::new(py, bytes);
            self.bridge
                .call_method1(py, "deserialize", (bytes,))
                .map_err(text)
        })
    }
}

/// The process's cache over the first bridge it is given (there is one jaxlib client
/// per process), its disk tier under `xla-jaxlib/` in the cache directory; `None` once
/// [`jaxlib_release`] has let its executables go.
static CACHE: Mutex<Option<Arc<Cache<PyCompiler>>>> = Mutex::new(None);

/// [`CACHE`], locked (a poisoned lock still holds a usable cache).
fn cache_slot() -> MutexGuard<'static, Option<Arc<Cache<PyCompiler>>>> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's cache, created over `bridge` on first use. (The lock is never held
/// while Python runs: another thread waiting for it would hold the GIL.)
fn jaxlib_cache(bridge: &Bound<'_, PyAny>) -> PyResult<Arc<Cache<PyCompiler>>> {
    if let Some(c) = cache_slot().as_ref() {
        return Ok(c.clone());
    }
    let fingerprint: String = bridge.call_method0("fingerprint")?.extract()?;
    let compiler = PyCompiler {
        bridge: bridge.clone().unbind(),
        fingerprint,
    };
    let dir = cache::default_dir().map(|d| d.join("xla-jaxlib"));
    let created = Arc::new(Cache::new(compiler, dir));
    Ok(cache_slot().get_or_insert(created).clone())
}

/// Drops the cache and the executables it holds, so jaxlib's client can be destroyed
/// before the process exits (the bridge calls it from an `atexit` hook: a client still
/// alive when C++'s static destructors run can abort the process).
#[pyfunction]
fn jaxlib_release(_attached: Python<'_>) {
    // Dropped while attached to the interpreter, so the executables are released now.
    drop(cache_slot().take());
}

/// Compiles a StableHLO module on jaxlib's client through `bridge` (or loads it from
/// the cache): returns the executable, where it came from (`compiled`, `memory`,
/// `disk`) and the milliseconds it took.
#[pyfunction]
fn jaxlib_compile(
    py: Python<'_>,
    bridge: &Bound<'_, PyAny>,
    module: String,
) -> PyResult<(Py<PyAny>, String, f64)> {
    let cache = jaxlib_cache(bridge)?;
    let t = Instant::now();
    let got = py.detach(move || catch_unwind(AssertUnwindSafe(|| cache.get(&module))));
    let (exe, source) = match got {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(PyRuntimeError::new_err(format!("XLA (jaxlib): {e}"))),
        Err(_) => {
            return Err(PyRuntimeError::new_err(
                "XLA (jaxlib): internal error (panic)",
            ))
        }
    };
    Ok((
        exe.clone_ref(py),
        source.name().to_string(),
        t.elapsed().as_secs_f64() * 1e3,
    ))
}

/// Adds the jaxlib path's functions.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(jaxlib_compile, m)?)?;
    m.add_function(wrap_pyfunction!(jaxlib_release, m)?)
}
