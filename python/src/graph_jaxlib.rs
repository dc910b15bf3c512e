//! Graph mode's XLA path on jaxlib's in-process CPU client: the runtime's two-tier
//! compilation cache over a compiler written in Python (`tessera.graph.jaxlib_xla`'s
//! bridge to the client), so both XLA clients share one cache (keys, disk format,
//! corrupt entries dropped and recompiled, counters).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
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
/// per process), its disk tier under `xla-jaxlib/` in the cache directory.
fn jaxlib_cache(bridge: &Bound<'_, PyAny>) -> PyResult<&'static Cache<PyCompiler>> {
    static CACHE: OnceLock<Cache<PyCompiler>> = OnceLock::new();
    if let Some(c) = CACHE.get() {
        return Ok(c);
    }
    let fingerprint: String = bridge.call_method0("fingerprint")?.extract()?;
    let compiler = PyCompiler {
        bridge: bridge.clone().unbind(),
        fingerprint,
    };
    let dir = cache::default_dir().map(|d| d.join("xla-jaxlib"));
    Ok(CACHE.get_or_init(|| Cache::new(compiler, dir)))
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
    m.add_function(wrap_pyfunction!(jaxlib_compile, m)?)
}
