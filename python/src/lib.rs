//! `tessera._tessera`: runs library kernels on host buffers handed over by Python
//! (address, shape, dtype), so torch ops can wrap them without copying tensors into
//! Python objects. The lock is released while kernels run; every failure, panics
//! included, becomes a Python exception.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use kernel_ir::{try_with_capacity, AllocError, Array, ArrayData, DType, TensorType};
use kernels::{find, tuning, BoxError, Params};
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use runtime::native::NativeArray;
use runtime::tune::TuneTarget;
use runtime::Backend;

mod graph;
mod graph_jaxlib;
mod library;
mod native_autograd;
mod op_specs;
mod torch_abi;
mod torch_ops;
mod user_kernels;

/// A contiguous host buffer: address, shape, dtype name.
pub(crate) type Buffer = (usize, Vec<u64>, String);

fn dtype(name: &str, what: &str) -> Result<DType, String> {
    DType::from_name(name)
        .filter(|d| *d != DType::Bool)
        .ok_or_else(|| format!("{what}: unsupported dtype `{name}`"))
}

/// Copies a buffer into an array.
///
/// # Safety
/// `addr` must point at `shape.product()` contiguous elements of `dtype`, alive and not
/// written during the call.
unsafe fn read(addr: usize, ty: &TensorType, what: &str) -> Result<Array, AllocError> {
    let n = ty.num_elements() as usize;
    /// The `n` elements at `addr`, converted, in a fallibly allocated vector.
    unsafe fn copy<S: Copy, T>(
        addr: usize,
        n: usize,
        what: &str,
        ty: &TensorType,
        f: impl Fn(S) -> T,
    ) -> Result<Vec<T>, AllocError> {
        let mut v = try_with_capacity(|| format!("{what} ({ty})"), n as u64)?;
        v.extend(
            std::slice::from_raw_parts(addr as *const S, n)
                .iter()
                .map(|&x| f(x)),
        );
        Ok(v)
    }
    let data = match ty.dtype {
        DType::F32 => ArrayData::Float(copy(addr, n, what, ty, |x: f32| x)?),
        DType::BF16 | DType::F16 => ArrayData::Float(copy(addr, n, what, ty, |b| {
            kernel_ir::from_half_bits(ty.dtype, b)
        })?),
        DType::I32 => ArrayData::Int(copy(addr, n, what, ty, |x: i32| x)?),
        DType::Bool => ArrayData::Bool(copy(addr, n, what, ty, |x: bool| x)?),
    };
    Ok(Array::new(ty.clone(), data).expect("the storage matches the type"))
}

/// Copies an array into a buffer of its type.
///
/// # Safety
/// `addr` must point at writable room for the array's elements.
unsafe fn write(addr: usize, a: &Array) {
    let n = a.ty().num_elements() as usize;
    match (a.data(), a.dtype()) {
        (ArrayData::Float(v), DType::F32) => {
            std::slice::from_raw_parts_mut(addr as *mut f32, n).copy_from_slice(v)
        }
        (ArrayData::Float(v), dtype) => {
            for (d, &x) in std::slice::from_raw_parts_mut(addr as *mut u16, n)
                .iter_mut()
                .zip(v)
            {
                *d = kernel_ir::to_half_bits(dtype, x);
            }
        }
        (ArrayData::Int(v), _) => {
            std::slice::from_raw_parts_mut(addr as *mut i32, n).copy_from_slice(v)
        }
        (ArrayData::Bool(v), _) => {
            std::slice::from_raw_parts_mut(addr as *mut bool, n).copy_from_slice(v)
        }
    }
}

fn types(buffers: &[Buffer], what: &str) -> Result<Vec<TensorType>, String> {
    buffers
        .iter()
        .enumerate()
        .map(|(i, (_, shape, d))| {
            Ok(TensorType::new(
                dtype(d, &format!("{what} {i}"))?,
                shape.clone(),
            ))
        })
        .collect()
}

/// A library op made ready for one parameter set and requested backend: the op with its
/// (tuned) parameters, and each of its kernels compiled to run natively on the callers'
/// storage (a kernel that fails to trace or compile leaves the op to run
/// through arrays, which reports why). Remembered ([`prepared`]), so a repeated call skips
/// parsing, tracing, backend resolution and compilation lookups.
struct PreparedOp {
    op: &'static dyn kernels::LibraryKernel,
    params: Params,
    /// Each kernel of the op's `build`, compiled for in-place runs (`None` where it cannot
    /// run so): the op's one kernel, or the steps of its [`kernels::Chain`] ([`run_chain`]).
    kernels: Vec<Option<runtime::native::Prepared>>,
}

impl PreparedOp {
    /// The compiled kernel of a single-kernel op.
    fn single(&self) -> Option<&runtime::native::Prepared> {
        match self.kernels.as_slice() {
            [single] => single.as_ref(),
            _ => None,
        }
    }
}

/// Prepared ops the extension remembers, at most this many (the memo then restarts).
const PREPARED_MEMO_LIMIT: usize = 1024;

/// A call of a library op: the op, its parameters (defaults filled in) and the names
/// the caller gave (tuning leaves those alone).
pub(crate) struct OpCall {
    op: &'static dyn kernels::LibraryKernel,
    params: Params,
    given: Vec<&'static str>,
}

impl OpCall {
    /// The call `params` (`name=value` items, as the command line, a custom call or
    /// Python give them) describe.
    fn parse(kernel: &str, params: &[String]) -> Result<OpCall, String> {
        let op = find(kernel).ok_or_else(|| format!("unknown kernel `{kernel}`"))?;
        let parsed = Params::parse(op.params(), params).map_err(|e| e.to_string())?;
        let named = tuning::named_in(params);
        let given = op
            .params()
            .iter()
            .map(|d| d.name)
            .filter(|n| named.contains(n))
            .collect();
        Ok(OpCall {
            op,
            params: parsed,
            given,
        })
    }

    /// The call an op's plan makes, its typed parameters as they are.
    fn planned(plan: &kernels::torch_op::Plan) -> Result<OpCall, String> {
        let (op, params) = plan.library_call()?;
        let given = plan.params.iter().map(|(name, _)| *name).collect();
        Ok(OpCall { op, params, given })
    }

    /// The given parameters as `name=value` text (what the launch trace records).
    fn given_text(&self) -> String {
        let parts: Vec<String> = self
            .given
            .iter()
            .filter_map(|n| self.params.get(n).map(|v| format!("{n}={v}")))
            .collect();
        parts.join(",")
    }

    /// The parameters with the blocks `tessera tune` stored for `target` (for `None`,
    /// the backend `requested` resolves to) filling the tunable ones the caller did
    /// not give.
    fn tuned(&self, requested: Backend, target: Option<TuneTarget>) -> Params {
        let (op, mut p) = (self.op, self.params.clone());
        tuning::apply_stored(op, &mut p, &self.given, |p, problem| {
            let first_kernel = || op.build(p).ok()?.into_iter().next();
            runtime::tune::stored_config(op.name(), problem, target, requested, first_kernel)
        });
        p
    }
}

/// The prepared op for `call` and `requested`.
fn prepared(call: &OpCall, requested: Backend) -> Result<Arc<PreparedOp>, OpError> {
    thread_local! {
        /// The last op this thread asked for: a repeated call skips the shared memo.
        static LAST: RefCell<Option<(LastKey, Arc<PreparedOp>)>> = const { RefCell::new(None) };
    }
    let is_last = |(k, b, p, g): &LastKey| {
        *k == call.op.name() && *b == requested && *p == call.params && *g == call.given
    };
    let last = LAST.with_borrow(|last| {
        last.as_ref()
            .filter(|(key, _)| is_last(key))
            .map(|(_, op)| op.clone())
    });
    if let Some(hit) = last {
        return Ok(hit);
    }
    let op = prepared_shared(call, requested)?;
    let key = (
        call.op.name(),
        requested,
        call.params.clone(),
        call.given.clone(),
    );
    LAST.set(Some((key, op.clone())));
    Ok(op)
}

/// What [`prepared`]'s per-thread memo compares: op, backend asked for, parameters and
/// the names given.
type LastKey = (&'static str, Backend, Params, Vec<&'static str>);

/// [`prepared`] through the memo all threads share.
fn prepared_shared(call: &OpCall, requested: Backend) -> Result<Arc<PreparedOp>, OpError> {
    static MEMO: OnceLock<Mutex<HashMap<String, Arc<PreparedOp>>>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    let key = format!(
        "{} {requested} {} given {:?}",
        call.op.name(),
        call.params,
        call.given
    );
    if let Some(hit) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(hit.clone());
    }
    let (op, params) = (call.op, call.tuned(requested, None));
    let kernels = op
        .build(&params)
        .map(|built| {
            built
                .iter()
                .map(|kernel| compiled_in_place(kernel, requested))
                .collect()
        })
        .unwrap_or_default();
    let prepared = Arc::new(PreparedOp {
        op,
        params,
        kernels,
    });
    let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
    if memo.len() >= PREPARED_MEMO_LIMIT {
        memo.clear();
    }
    memo.insert(key, prepared.clone());
    Ok(prepared)
}

/// `kernel` compiled to run natively on the callers' storage, when `requested` resolves to
/// the native backend for it. A kernel the JIT cannot compile gives `None`: it runs
/// through arrays, where `auto` falls back.
pub(crate) fn compiled_in_place(
    kernel: &kernel_ir::Kernel,
    requested: Backend,
) -> Option<runtime::native::Prepared> {
    let native = runtime::resolve(requested, kernel).is_ok_and(|r| r.backend == Backend::Native);
    native
        .then(|| runtime::native::backend().prepare(kernel).ok())
        .flatten()
}

/// Runs `run` on the buffers' addresses with panics caught: the native in-place path.
/// `context` names the call in errors. Returns the backend that ran (native).
fn in_place(
    context: &dyn Fn() -> String,
    inputs: &[Buffer],
    outputs: &[Buffer],
    run: impl FnOnce(&[*const std::ffi::c_void], &[*mut std::ffi::c_void]) -> Result<(), runtime::Error>,
) -> Result<&'static str, OpError> {
    let ins: Vec<*const std::ffi::c_void> = inputs.iter().map(|b| b.0 as *const _).collect();
    let outs: Vec<*mut std::ffi::c_void> = outputs.iter().map(|b| b.0 as *mut _).collect();
    match catch_unwind(AssertUnwindSafe(|| run(&ins, &outs))) {
        Ok(Ok(())) => Ok(Backend::Native.name()),
        Ok(Err(e)) => Err(OpError::from_run(context(), &e)),
        Err(_) => Err(OpError::Failed(format!(
            "{}: internal error (panic)",
            context()
        ))),
    }
}

/// Runs compiled kernel `native` in place on the buffers ([`in_place`]); `None` (nothing
/// run) when they are not exactly its input and output types.
///
/// # Safety
/// The buffers' addresses are live, contiguous storage of their shapes and dtypes; the
/// outputs' are fresh (not aliasing an input).
pub(crate) unsafe fn run_prepared(
    native: &runtime::native::Prepared,
    context: &dyn Fn() -> String,
    inputs: &[Buffer],
    outputs: &[Buffer],
) -> Option<Result<&'static str, OpError>> {
    if !buffers_match(inputs, native.input_types())
        || !buffers_match(outputs, native.output_types())
    {
        return None;
    }
    // SAFETY: the caller's guarantee, and the types checked above.
    Some(in_place(context, inputs, outputs, |ins, outs| unsafe {
        native.run_in_place(ins, outs)
    }))
}

/// Runs an op's [`kernels::Chain`] natively on the callers' buffers
/// ([`runtime::native::ChainRun`]): its host-derived arrays (computed from the small
/// inputs the chain reads, such as varlen's offsets) and intermediate arrays in host
/// memory, no copies of the inputs or outputs. `None` (before anything ran) when the op
/// has no chain for these inputs, a kernel cannot run in place, or a buffer is not of the
/// type its kernel takes.
fn run_chain(
    prepared: &PreparedOp,
    context: &dyn Fn() -> String,
    inputs: &[Buffer],
    outputs: &[Buffer],
) -> Option<Result<&'static str, OpError>> {
    let chain = prepared.op.chain(&prepared.params, inputs.len())?;
    let (in_types, out_types) = (types(inputs, "input").ok()?, types(outputs, "output").ok()?);
    if chain
        .steps
        .iter()
        .any(|s| !matches!(prepared.kernels.get(s.kernel), Some(Some(_))))
    {
        return None; // a kernel that cannot run in place: derive nothing
    }
    let derived = match derive(prepared, &chain.reads, inputs, context)? {
        Ok(derived) => derived,
        Err(e) => return Some(Err(e)),
    };
    let derived_types: Vec<TensorType> = derived.iter().map(|a| a.ty().clone()).collect();
    let run = runtime::native::ChainRun::new(
        &chain,
        &prepared.kernels,
        &in_types,
        &derived_types,
        &out_types,
    )?;
    let derived_addrs: Vec<*const std::ffi::c_void> =
        derived.iter().map(NativeArray::as_ptr).collect();
    // SAFETY: the callers pass live, contiguous buffers of their types and fresh outputs;
    // the derived arrays live until the run ends; `ChainRun::new` checked every type.
    Some(in_place(context, inputs, outputs, |ins, outs| unsafe {
        run.run(ins, &derived_addrs, outs, context)
    }))
}

/// The arrays a chain derives on the host ([`kernels::LibraryKernel::derive`]) from copies
/// of the inputs `reads` names, in the kernels' layout. `None` when a read buffer's dtype
/// has no array form (the caller falls back); `Some(Err)` when the op rejects what it
/// reads or memory runs out.
fn derive(
    prepared: &PreparedOp,
    reads: &[usize],
    inputs: &[Buffer],
    context: &dyn Fn() -> String,
) -> Option<Result<Vec<NativeArray>, OpError>> {
    if reads.is_empty() {
        return Some(Ok(Vec::new()));
    }
    let mut read_arrays = Vec::with_capacity(reads.len());
    for &i in reads {
        let (addr, shape, name) = inputs.get(i)?;
        let ty = TensorType::new(dtype(name, "input").ok()?, shape.clone());
        // SAFETY: the callers pass live, contiguous buffers of their shapes and dtypes.
        match unsafe { read(*addr, &ty, &format!("a copy of input {i}")) } {
            Ok(a) => read_arrays.push(a),
            Err(e) => return Some(Err(OpError::NoMemory(e.to_string()))),
        }
    }
    let derived = match prepared.op.derive(&prepared.params, &read_arrays) {
        Ok(derived) => derived,
        Err(e) => return Some(Err(OpError::from_run(context(), &*e))),
    };
    Some(
        derived
            .iter()
            .map(NativeArray::from_array)
            .collect::<Result<_, _>>()
            .map_err(|e| OpError::NoMemory(e.to_string())),
    )
}

/// Whether the buffers have exactly these types.
fn buffers_match(buffers: &[Buffer], types: &[TensorType]) -> bool {
    buffers.len() == types.len()
        && buffers
            .iter()
            .zip(types)
            .all(|((_, shape, d), t)| *shape == t.shape && d == t.dtype.name())
}

/// One run on host buffers: what it is (for messages), the backend asked for, and the
/// buffers with their types.
pub(crate) struct HostCall<'a> {
    context: String,
    requested: Backend,
    inputs: &'a [Buffer],
    outputs: &'a [Buffer],
    in_types: Vec<TensorType>,
    out_types: Vec<TensorType>,
}

impl<'a> HostCall<'a> {
    /// Reads the buffers' types (`ValueError` for an unsupported dtype).
    pub(crate) fn new(
        context: String,
        requested: Backend,
        inputs: &'a [Buffer],
        outputs: &'a [Buffer],
    ) -> Result<Self, OpError> {
        Ok(HostCall {
            context,
            requested,
            in_types: types(inputs, "input").map_err(OpError::Bad)?,
            out_types: types(outputs, "output").map_err(OpError::Bad)?,
            inputs,
            outputs,
        })
    }

    /// Runs one kernel whose types match the buffers': in place when it can, else
    /// through arrays on the backend `runtime` chooses.
    pub(crate) fn run_kernel(&self, kernel: &kernel_ir::Kernel) -> Result<&'static str, OpError> {
        if kernel.input_types() != self.in_types || kernel.output_types() != self.out_types {
            let names = |ts: &[TensorType]| ts.iter().map(ToString::to_string).collect::<Vec<_>>();
            return Err(OpError::Bad(format!(
                "{}: the kernel takes {:?} and returns {:?}, the call passes {:?} and {:?}",
                self.context,
                names(&kernel.input_types()),
                names(&kernel.output_types()),
                names(&self.in_types),
                names(&self.out_types),
            )));
        }
        if let Some(used) = self.in_place(kernel) {
            return used;
        }
        self.through_arrays(|arrays| {
            let (out, resolution) = runtime::run(kernel, arrays, self.requested)?;
            Ok((out, resolution.backend))
        })
    }

    /// The zero-copy path: a kernel that runs natively reads the tensors' storage and
    /// writes the outputs' directly. `None` when it does not apply
    /// (then the caller copies through arrays).
    fn in_place(&self, kernel: &kernel_ir::Kernel) -> Option<Result<&'static str, OpError>> {
        if kernel.input_types() != self.in_types
            || kernel.output_types() != self.out_types
            || runtime::resolve(self.requested, kernel).ok()?.backend != Backend::Native
        {
            return None;
        }
        Some(in_place(
            &|| self.context.clone(),
            self.inputs,
            self.outputs,
            |ins, outs| {
                // SAFETY: the callers pass the data pointers of contiguous buffers of exactly
                // these types (checked above), and fresh output buffers.
                unsafe { runtime::native::backend().run_in_place(kernel, ins, outs) }
            },
        ))
    }

    /// Copies the inputs into arrays, runs `f` on them with panics caught, checks and
    /// writes its results into the outputs; returns the backend that ran.
    fn through_arrays(
        &self,
        f: impl FnOnce(&[Array]) -> Result<(Vec<Array>, Backend), BoxError>,
    ) -> Result<&'static str, OpError> {
        let context = &self.context;
        let result = catch_unwind(AssertUnwindSafe(
            || -> Result<(Vec<Array>, Backend), BoxError> {
                // SAFETY: the caller passes live, contiguous buffers of these types.
                let arrays: Vec<Array> = self
                    .inputs
                    .iter()
                    .zip(&self.in_types)
                    .enumerate()
                    .map(|(i, (b, t))| unsafe { read(b.0, t, &format!("a copy of input {i}")) })
                    .collect::<Result<_, _>>()?;
                f(&arrays)
            },
        ));
        let (got, used) = match result {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(OpError::from_run(context, &*e)),
            Err(_) => {
                return Err(OpError::Failed(format!(
                    "{context}: internal error (panic)"
                )))
            }
        };
        if got.len() != self.outputs.len() {
            return Err(OpError::Bad(format!(
                "{context} returns {} outputs, {} buffers were given",
                got.len(),
                self.outputs.len()
            )));
        }
        for (i, (a, t)) in got.iter().zip(&self.out_types).enumerate() {
            if a.ty() != t {
                return Err(OpError::Bad(format!(
                    "{context} output {i} is {}, the buffer is {t}",
                    a.ty()
                )));
            }
        }
        for (a, b) in got.iter().zip(self.outputs) {
            // SAFETY: checked above that each buffer has the output's type.
            unsafe { write(b.0, a) };
        }
        Ok(used.name())
    }
}

/// Why an op call failed: bad arguments (`ValueError`), an array that could not be
/// allocated (`MemoryError`), a kernel's failed `check` on its data (`ValueError` or
/// `IndexError`, as the check's kind says) or a failed run (`RuntimeError`).
pub(crate) enum OpError {
    Bad(String),
    NoMemory(String),
    Checked(kernel_ir::CheckKind, String),
    Failed(String),
}

impl From<OpError> for PyErr {
    fn from(e: OpError) -> PyErr {
        match e {
            OpError::Bad(m) | OpError::Checked(kernel_ir::CheckKind::Value, m) => {
                PyValueError::new_err(m)
            }
            OpError::Checked(kernel_ir::CheckKind::Index, m) => PyIndexError::new_err(m),
            OpError::NoMemory(m) => PyMemoryError::new_err(m),
            OpError::Failed(m) => PyRuntimeError::new_err(m),
        }
    }
}

impl OpError {
    /// A failed run of `context`: `NoMemory` when an allocation failed, `Checked` when a
    /// check of the kernel failed.
    fn from_run(context: impl std::fmt::Display, e: &(dyn std::error::Error + 'static)) -> Self {
        let message = format!("{context}: {e}");
        if AllocError::in_chain(e) {
            OpError::NoMemory(message)
        } else if let Some(c) = kernel_ir::ops::CheckFailure::in_chain(e) {
            OpError::Checked(c.kind, message)
        } else {
            OpError::Failed(message)
        }
    }

    fn message(self) -> String {
        match self {
            OpError::Bad(m)
            | OpError::NoMemory(m)
            | OpError::Checked(_, m)
            | OpError::Failed(m) => m,
        }
    }
}

/// Runs library op `kernel` with parameters `params` (`name=value` items) on `inputs`
/// and writes its outputs into `outputs`; returns the backend that ran it. Used by
/// XLA programs' custom calls and `_tessera.run`.
fn run_op(
    kernel: &str,
    params: &[String],
    inputs: &[Buffer],
    outputs: &[Buffer],
    requested: Backend,
) -> Result<&'static str, OpError> {
    let call = OpCall::parse(kernel, params).map_err(OpError::Bad)?;
    run_call(&call, inputs, outputs, requested)
}

/// Runs `call` on `inputs`, writing `outputs` ([`run_op`]; the torch ops call it with
/// their plan's typed parameters).
fn run_call(
    call: &OpCall,
    inputs: &[Buffer],
    outputs: &[Buffer],
    requested: Backend,
) -> Result<&'static str, OpError> {
    let kernel = call.op.name();
    launches::record(|| format!("{kernel} {}", call.given_text()));
    let prepared = prepared(call, requested)?;
    let PreparedOp { op, params: p, .. } = &*prepared;
    if let Some(native) = prepared.single() {
        // SAFETY: the callers pass the data pointers of contiguous buffers, and fresh
        // output buffers.
        if let Some(done) =
            unsafe { run_prepared(native, &|| format!("{kernel} {p}"), inputs, outputs) }
        {
            return done;
        }
    }
    if let Some(done) = run_chain(&prepared, &|| format!("{kernel} {p}"), inputs, outputs) {
        return done;
    }
    let call = HostCall::new(format!("{kernel} {p}"), requested, inputs, outputs)?;
    call.through_arrays(|arrays| {
        let mut used = Backend::Interp;
        let got = op.run(p, arrays, &mut |kern, ins| {
            let (out, resolution) = runtime::run(kern, ins, requested)?;
            used = resolution.backend;
            Ok(out)
        })?;
        Ok((got, used))
    })
}

/// Runs library kernel `kernel` with parameters `params` (`name=value` items) on
/// `inputs` and writes its outputs into `outputs`; returns the backend that ran it.
#[pyfunction]
#[pyo3(signature = (kernel, params, inputs, outputs, backend = "auto"))]
fn run(
    py: Python<'_>,
    kernel: &str,
    params: Vec<String>,
    inputs: Vec<Buffer>,
    outputs: Vec<Buffer>,
    backend: &str,
) -> PyResult<&'static str> {
    let requested = parse_backend(backend)?;
    Ok(py.detach(|| run_op(kernel, &params, &inputs, &outputs, requested))?)
}

/// A backend name (`ValueError` for an unknown one).
fn parse_backend(name: &str) -> Result<Backend, OpError> {
    name.parse()
        .map_err(|e: runtime::Error| OpError::Bad(e.to_string()))
}

/// The schemas of the dispatcher ops (`name(args) -> results`),
/// which Python defines in the `tessera` namespace before [`register_cpu_kernels`].
#[pyfunction]
fn op_schemas() -> Vec<&'static str> {
    torch_ops::ops().iter().map(|op| op.schema).collect()
}

/// Registers the CPU kernels of the ops of [`op_schemas`] (already defined) through
/// PyTorch's stable C interface, resolved from `libtorch_cpu` at `path`.
#[pyfunction]
fn register_cpu_kernels(path: &str) -> PyResult<()> {
    let torch = torch_abi::load(path).map_err(PyRuntimeError::new_err)?;
    torch
        .register_cpu("tessera", &torch_ops::kernels())
        .map_err(PyRuntimeError::new_err)
}

/// Runs native grids on PyTorch's OpenMP team (ATen's intra-op pool) instead of
/// Tessera's own threads, for the life of the process; returns its thread count.
/// [`register_cpu_kernels`] has resolved PyTorch's library.
#[pyfunction]
fn use_torch_threads() -> PyResult<usize> {
    let torch = torch_abi::loaded().ok_or_else(|| {
        PyRuntimeError::new_err("PyTorch's library is not resolved yet (import tessera)")
    })?;
    let omp = torch.openmp().map_err(PyRuntimeError::new_err)?;
    Ok(runtime::native::use_openmp(omp))
}

/// Registers native autograd kernels for these ops of `namespace` on CPU tensors: calls that
/// need no gradient then skip the Python autograd kernels (which calls that do still
/// reach). False when this build has none (PyTorch's headers were not found when it was
/// built); `RuntimeError` when they were built for another PyTorch than
/// `torch_version` (`2.13.0`) or do not load.
#[pyfunction]
#[pyo3(signature = (names, torch_version, namespace = "tessera"))]
fn register_native_autograd(
    names: Vec<String>,
    torch_version: &str,
    namespace: &str,
) -> PyResult<bool> {
    if !native_autograd::BUILT {
        return Ok(false);
    }
    native_autograd::register(namespace, &names, torch_version).map_err(PyRuntimeError::new_err)?;
    Ok(true)
}

/// What runs native grids with the calling thread: `openmp` (PyTorch's threads) or
/// `tessera` (Tessera's own).
#[pyfunction]
fn thread_pool() -> &'static str {
    runtime::native::thread_pool()
}

/// Sets the backend this thread's ops ask for; returns the previous one.
#[pyfunction]
fn set_backend(name: &str) -> PyResult<&'static str> {
    Ok(torch_ops::set_backend(parse_backend(name)?).name())
}

/// The backend this thread's ops ask for.
#[pyfunction]
fn current_backend() -> &'static str {
    torch_ops::backend().name()
}

/// The problem `tessera tune` stores library op `kernel`'s blocks under for `params`
/// (`name=value` items): its parameters with defaults filled, without the tunable ones.
#[pyfunction]
fn tuning_problem(kernel: &str, params: Vec<String>) -> PyResult<String> {
    let call = OpCall::parse(kernel, &params).map_err(PyValueError::new_err)?;
    Ok(kernels::tuning::problem(call.op, &call.params))
}

/// Every `TESSERA_*` variable: `(name, default, doc)` (`runtime::config`).
#[pyfunction]
fn config_variables() -> Vec<(&'static str, &'static str, &'static str)> {
    runtime::config::Var::ALL
        .iter()
        .map(|v| (v.name(), v.default(), v.doc()))
        .collect()
}

/// The variables with their current values, as `tessera config` prints them.
#[pyfunction]
fn describe_config() -> String {
    runtime::config::describe()
}

/// The backend a kernel would run on, and why better ones were skipped.
#[pyfunction]
#[pyo3(signature = (kernel, params, backend = "auto"))]
fn explain(kernel: &str, params: Vec<String>, backend: &str) -> PyResult<(String, Vec<String>)> {
    let call = OpCall::parse(kernel, &params).map_err(PyValueError::new_err)?;
    let requested = parse_backend(backend)?;
    let kernels = call
        .op
        .build(&call.params)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let first = kernels
        .first()
        .ok_or_else(|| PyValueError::new_err("no kernel"))?;
    let r = runtime::resolve(requested, first).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((r.backend.name().to_string(), r.fallbacks))
}

/// The launch trace behind `tessera.trace_ops()`: while it is on, every library or user
/// op run records its kernel and parameters (the shapes the kernel ran on: under DTensor,
/// the local shards').
pub(crate) mod launches {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use pyo3::prelude::*;

    static ON: AtomicBool = AtomicBool::new(false);
    static RECORDED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// Records one launch (`what` is only called while the trace is on).
    pub(crate) fn record(what: impl FnOnce() -> String) {
        if ON.load(Ordering::Relaxed) {
            RECORDED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(what());
        }
    }

    /// Turns the trace on or off; returns whether it was on.
    #[pyfunction]
    pub(crate) fn trace_launches(on: bool) -> bool {
        ON.swap(on, Ordering::Relaxed)
    }

    /// The launches recorded so far (`op params`), emptying the trace.
    #[pyfunction]
    pub(crate) fn take_launches() -> Vec<String> {
        std::mem::take(&mut *RECORDED.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The extension module.
#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(config_variables, m)?)?;
    m.add_function(wrap_pyfunction!(tuning_problem, m)?)?;
    m.add_function(wrap_pyfunction!(describe_config, m)?)?;
    m.add_function(wrap_pyfunction!(op_schemas, m)?)?;
    m.add_function(wrap_pyfunction!(op_specs::op_specs, m)?)?;
    m.add_function(wrap_pyfunction!(op_specs::dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(op_specs::op_plan, m)?)?;
    m.add_function(wrap_pyfunction!(register_cpu_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(set_backend, m)?)?;
    m.add_function(wrap_pyfunction!(use_torch_threads, m)?)?;
    m.add_function(wrap_pyfunction!(register_native_autograd, m)?)?;
    m.add_function(wrap_pyfunction!(thread_pool, m)?)?;
    m.add_function(wrap_pyfunction!(current_backend, m)?)?;
    m.add_function(wrap_pyfunction!(launches::trace_launches, m)?)?;
    m.add_function(wrap_pyfunction!(launches::take_launches, m)?)?;
    graph::register(m)?;
    graph_jaxlib::register(m)?;
    library::register(m)?;
    Ok(())
}
