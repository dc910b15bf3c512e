//! Graph mode's native half: compile whole-model StableHLO through the XLA backend's
//! two-tier cache, run it on tensors' memory, and run the Tessera ops those programs
//! call (`stablehlo.custom_call @tessera_op`, attributes `op` and `params`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use runtime::pjrt::{Element, Executable, HostBuffer};
use runtime::tune::TuneTarget;
use runtime::Backend;

use crate::library::{UserBuild, UserCall};
use crate::{run_op, Buffer, OpCall};

/// The XLA backend, or why it cannot be used.
fn xla() -> PyResult<&'static runtime::xla::Xla> {
    runtime::xla::backend()
        .map_err(|e| PyRuntimeError::new_err(format!("graph mode needs the XLA backend: {e}")))
}

/// A compiled whole-model program.
#[pyclass(frozen)]
struct GraphExecutable {
    exe: Arc<Executable>,
}

fn host_buffers(buffers: &[Buffer], what: &str) -> PyResult<Vec<HostBuffer>> {
    buffers
        .iter()
        .enumerate()
        .map(|(i, (addr, dims, dtype))| {
            let element = Element::from_name(dtype).ok_or_else(|| {
                PyValueError::new_err(format!("{what} {i}: unsupported dtype `{dtype}`"))
            })?;
            Ok(HostBuffer {
                data: *addr as *mut std::ffi::c_void,
                element,
                dims: dims.iter().map(|&d| d as i64).collect(),
            })
        })
        .collect()
}

#[pymethods]
impl GraphExecutable {
    /// Runs the program: `inputs` and `outputs` are `(address, shape, dtype)` of
    /// contiguous CPU tensors; inputs are aliased where PJRT allows, results copied into
    /// the outputs.
    fn run(&self, py: Python<'_>, inputs: Vec<Buffer>, outputs: Vec<Buffer>) -> PyResult<()> {
        let xla = xla()?;
        let ins = host_buffers(&inputs, "input")?;
        let outs = host_buffers(&outputs, "output")?;
        // Raw pointers are not Send: move their addresses across the released lock.
        let exe = self.exe.clone();
        let result = py.detach(move || {
            catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: the Python side passes live contiguous tensors of these types
                // and fresh outputs, and keeps them alive for the call.
                unsafe { xla.run_host(&exe, &ins, &outs) }
            }))
        });
        match result {
            Ok(r) => r.map_err(|e| PyRuntimeError::new_err(format!("running the graph: {e}"))),
            Err(_) => Err(PyRuntimeError::new_err(
                "running the graph: internal error (panic)",
            )),
        }
    }
}

/// Compiles a StableHLO module (or loads it from the cache): returns the executable,
/// where it came from (`compiled`, `memory`, `disk`) and the milliseconds it took.
#[pyfunction]
fn graph_compile(py: Python<'_>, module: String) -> PyResult<(GraphExecutable, String, f64)> {
    let xla = xla()?;
    let t = Instant::now();
    let got = py.detach(move || catch_unwind(AssertUnwindSafe(|| xla.compile(&module))));
    let (exe, source) = match got {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(PyRuntimeError::new_err(format!("XLA: {e}"))),
        Err(_) => return Err(PyRuntimeError::new_err("XLA: internal error (panic)")),
    };
    Ok((
        GraphExecutable { exe },
        source.name().to_string(),
        t.elapsed().as_secs_f64() * 1e3,
    ))
}

/// Why XLA programs cannot call Tessera ops here, or `None` when they can.
#[pyfunction]
fn custom_calls_unavailable() -> Option<String> {
    match runtime::xla::backend() {
        Err(e) => Some(format!("the XLA backend is unavailable: {e}")),
        Ok(x) => x.custom_calls().err().map(String::from),
    }
}

/// The `tessera_op` custom-call handler in an unnamed capsule (the typed XLA FFI
/// handler's address), for `jax.ffi.register_ffi_target` on jaxlib's CPU client.
#[pyfunction]
fn custom_call_handler(py: Python<'_>) -> PyResult<Py<PyAny>> {
    // SAFETY: the capsule holds a function pointer that lives as long as the process
    // (the extension is never unloaded) and has no destructor.
    unsafe {
        let capsule =
            pyo3::ffi::PyCapsule_New(runtime::custom_call::handler_ptr(), std::ptr::null(), None);
        Bound::from_owned_ptr_or_err(py, capsule).map(Bound::unbind)
    }
}

/// The `backend_config` JSON of the `tpu_custom_call` that runs library op `op` with
/// `params` (its Mosaic body; the TPU rules are checked first), and the kernel's name.
/// `operands` is how many tensors the call passes: an op whose kernel takes other inputs
/// (derived on the host) is refused.
#[pyfunction]
fn tpu_custom_call_config(
    op: &str,
    params: Vec<String>,
    operands: usize,
) -> PyResult<(String, String)> {
    let limits = lowering::tpu_rules::TpuLimits::default();
    if op == USER_OP {
        let call = UserCall::parse(&params).map_err(PyValueError::new_err)?;
        let kernel = match call.build().map_err(PyValueError::new_err)? {
            UserBuild::Kernel(k) => k,
            UserBuild::Outputs(_) => {
                return Err(PyValueError::new_err(format!(
                    "user op `{params:?}` has nothing to compute for these shapes (an empty \
                     batch): TPU export takes calls that run a kernel"
                )))
            }
        };
        let config = lowering::mosaic::custom_call_config(&kernel, &limits)
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", kernel.name)))?;
        return Ok((config, kernel.name.clone()));
    }
    let call = OpCall::parse(op, &params).map_err(PyValueError::new_err)?;
    let (k, p) = (call.op, call.tuned(Backend::Auto, Some(TuneTarget::Mosaic)));
    let kernels = k
        .build(&p)
        .map_err(|e| PyValueError::new_err(format!("{op} {p}: {e}")))?;
    let [kernel] = kernels.as_slice() else {
        return Err(PyValueError::new_err(format!(
            "{op} runs {} kernels; TPU export takes single-kernel ops",
            kernels.len()
        )));
    };
    let inputs = kernel.input_types().len();
    if inputs != operands {
        return Err(PyValueError::new_err(format!(
            "{op}'s kernel takes {inputs} inputs that the host derives from the call's \
             {operands} operands before running (varlen attention plans its tiles from the \
             offsets); TPU export takes ops whose kernel takes the call's operands"
        )));
    }
    let config = lowering::mosaic::custom_call_config(kernel, &limits)
        .map_err(|e| PyValueError::new_err(format!("{op} {p}: {e}")))?;
    Ok((config, kernel.name.clone()))
}

/// The `op` of a custom call that runs a user library's op (`library::UserCall`).
const USER_OP: &str = "user_op";

/// Runs one `tessera_op` custom call: the library op `op` with `params`
/// (comma-separated `name=value`) on XLA's buffers, natively, or in the interpreter
/// when the native backend declines it (never on XLA: this already runs inside an XLA
/// program, and PJRT is not re-entrant).
fn run_custom_call(call: &runtime::custom_call::OpCall) -> Result<(), String> {
    let op = call.attr("op")?;
    let params: Vec<String> = call
        .attr("params")?
        .split(',')
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    let buffers = |bs: &[runtime::custom_call::CallBuffer]| -> Vec<Buffer> {
        bs.iter()
            .map(|b| (b.data as usize, b.dims.clone(), b.dtype.to_string()))
            .collect()
    };
    let (ins, outs) = (buffers(&call.inputs), buffers(&call.outputs));
    if op == USER_OP {
        return UserCall::parse(&params)?.run(&ins, &outs);
    }
    run_op(op, &params, &ins, &outs, Backend::Native)
        .or_else(|_| run_op(op, &params, &ins, &outs, Backend::Interp))
        .map(|_| ())
        .map_err(|e| e.message())
}

/// The kernel choice stored for graph `key` on this machine (`None`: none stored, or no
/// cache directory). A corrupt entry is dropped: `ValueError` says which and why.
#[pyfunction]
fn stored_graph_choice(key: &str) -> PyResult<Option<String>> {
    let Some(choices) = runtime::tune::GraphChoices::default_choices() else {
        return Ok(None);
    };
    choices.get(key).map_err(PyValueError::new_err)
}

/// Stores the kernel choice `choice` for graph `key`; returns the file (`OSError` when
/// the cache directory is not writable, `None` when there is none).
#[pyfunction]
fn store_graph_choice(key: &str, choice: &str) -> PyResult<Option<String>> {
    let Some(choices) = runtime::tune::GraphChoices::default_choices() else {
        return Ok(None);
    };
    let path = choices.put(key, choice)?;
    Ok(Some(path.display().to_string()))
}

/// Adds graph mode's functions and installs the custom-call runner.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    runtime::custom_call::set_op_runner(Box::new(run_custom_call));
    m.add_class::<GraphExecutable>()?;
    m.add_function(wrap_pyfunction!(graph_compile, m)?)?;
    m.add_function(wrap_pyfunction!(custom_calls_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(custom_call_handler, m)?)?;
    m.add_function(wrap_pyfunction!(tpu_custom_call_config, m)?)?;
    m.add_function(wrap_pyfunction!(stored_graph_choice, m)?)?;
    m.add_function(wrap_pyfunction!(store_graph_choice, m)?)?;
    Ok(())
}
