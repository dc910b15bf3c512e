//! The reference interpreter: the semantics of the IR, bounds-checked.
//!
//! The grid runs in row-major order. Its leading `parallel` axes are split across
//! worker threads; everything from the first `arbitrary` axis on runs in order on one
//! worker, whose scratch buffers persist across those programs (as on one TPU core).
//! Every load and store index is checked against the block extent (a fault names the
//! program id, the op and the ref). An edge block may overhang its array, as in Pallas:
//! the overhang reads NaN-poison (`i32::MIN`, `false`) and writes there are dropped.

mod window;

use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::array::{try_with_capacity, AllocError, Array, ArrayData};
use crate::ir::{DimSemantics, Kernel, Op, OpKind, RefId, RefKind, Region, Value};
use crate::ops;
use crate::print::Namer;
use crate::types::{DType, TensorType};
use crate::verify::{block_starts, unflatten, verify};

/// How to run a kernel.
#[derive(Clone, Debug, Default)]
pub struct InterpretOptions {
    /// Fill scratch buffers and outputs with NaN (i32::MIN, false) before running, so
    /// reads of never-written data show up in the results.
    pub poison_uninitialized: bool,
    /// Worker threads for the parallel grid axes; 0 means one per core.
    pub threads: usize,
}

/// Why a kernel could not be run to completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunError {
    /// The kernel failed verification.
    Invalid(crate::verify::VerifyError),
    /// An argument does not match the kernel's signature.
    BadArgument {
        /// Position of the input.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// An array the run needs (an output, a scratch buffer or a block value) could not
    /// be allocated.
    Alloc(AllocError),
    /// A program faulted.
    Fault {
        /// Program ids of the faulting program.
        program: Vec<u64>,
        /// The op, as printed.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// A `check` of the kernel failed (its data was bad, not the kernel).
    CheckFailed(crate::ops::CheckFailure),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Invalid(e) => e.fmt(f),
            RunError::BadArgument { index, message } => write!(f, "input {index}: {message}"),
            RunError::Alloc(e) => e.fmt(f),
            RunError::Fault {
                program,
                op,
                message,
            } => write!(f, "program {program:?} faulted at `{op}`: {message}"),
            RunError::CheckFailed(c) => c.fmt(f),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Alloc(e) => Some(e),
            RunError::CheckFailed(c) => Some(c),
            _ => None,
        }
    }
}

/// Arrays larger than this are test-allocated by [`check_allocatable`].
const PROBE_OVER_BYTES: u64 = 64 << 20;

/// Checks that each large array a run of `kernel` needs (outputs, scratch buffers,
/// block values) can be allocated, by reserving and freeing it once, so that a
/// backend whose own allocations are infallible (XLA's, the interpreter's block
/// values) reports [`RunError::Alloc`] instead of aborting.
pub fn check_allocatable(kernel: &Kernel) -> Result<(), RunError> {
    // Names are built only for an array that is probed (this runs on every native call).
    let mut probed = std::collections::HashSet::new();
    let mut probe = |what: &dyn Fn() -> String, ty: &crate::types::TensorType| {
        let bytes = ty.byte_size().unwrap_or(u64::MAX);
        if bytes > PROBE_OVER_BYTES && probed.insert(bytes) {
            try_with_capacity::<u8>(|| format!("{} ({ty})", what()), bytes)
                .map_err(RunError::Alloc)?;
        }
        Ok(())
    };
    for r in kernel.refs.iter().filter(|r| r.kind != RefKind::Input) {
        probe(&|| format!("{} %{}", r.kind.keyword(), r.name), &r.ty)?;
    }
    let namer = std::cell::OnceCell::new();
    for (i, ty) in kernel.value_types.iter().enumerate() {
        let name = || {
            namer
                .get_or_init(|| Namer::new(kernel))
                .name(Value(i as u32))
        };
        probe(&|| format!("block value {}", name()), ty)?;
    }
    Ok(())
}

/// Why one program stopped: an op faulted (before the fault is tagged with the program
/// id), or a `check` failed (the data's fault, reported as such).
enum Fault<'k> {
    Op { op: &'k Op, message: String },
    Check(crate::ops::CheckFailure),
}

/// Checks that `inputs` match the kernel's input types (count, dtype, shape); every
/// backend calls this before running.
pub fn check_inputs(kernel: &Kernel, inputs: &[Array]) -> Result<(), RunError> {
    let expected = kernel.input_types();
    if inputs.len() != expected.len() {
        return Err(RunError::BadArgument {
            index: inputs.len().min(expected.len()),
            message: format!(
                "kernel @{} takes {} inputs, {} were given",
                kernel.name,
                expected.len(),
                inputs.len()
            ),
        });
    }
    for (index, (a, t)) in inputs.iter().zip(&expected).enumerate() {
        if a.ty() != t {
            let name = &kernel.refs[index].name;
            return Err(RunError::BadArgument {
                index,
                message: format!("%{name} expects {t}, got {}", a.ty()),
            });
        }
    }
    Ok(())
}

/// The i32 data of the kernel's scalar-prefetch operands (its leading inputs).
pub fn prefetch_data<'a>(kernel: &Kernel, inputs: &'a [Array]) -> Vec<&'a [i32]> {
    inputs[..kernel.scalar_prefetch().min(inputs.len())]
        .iter()
        .map(|a| match a.data() {
            ArrayData::Int(v) => v.as_slice(),
            _ => &[],
        })
        .collect()
}

/// Reads scalar-prefetch operand `r` at `index` from `prefetch` (the leading inputs'
/// data), or says which read left the operand.
fn read_prefetch<'a>(
    kernel: &'a Kernel,
    prefetch: &'a [&'a [i32]],
) -> impl FnMut(RefId, &[i64]) -> Result<i64, String> + 'a {
    move |r, index| {
        let decl = kernel.ref_decl(r);
        let shape = &decl.ty.shape;
        let mut flat = 0u64;
        for (&i, &n) in index.iter().zip(shape) {
            if i < 0 || i as u64 >= n {
                let at: Vec<String> = index.iter().map(i64::to_string).collect();
                return Err(format!(
                    "it reads %{}[{}], outside its shape {shape:?}",
                    decl.name,
                    at.join(", ")
                ));
            }
            flat = flat * n + i as u64;
        }
        prefetch
            .get(r.0 as usize)
            .and_then(|d| d.get(flat as usize))
            .map(|&v| i64::from(v))
            .ok_or_else(|| format!("%{} is not a scalar-prefetch operand", decl.name))
    }
}

/// Where each input/output block of program `pids` starts, per array dim (the index
/// maps read the scalar-prefetch data `prefetch`); a block outside its array, or a read
/// outside an operand, is a fault of the program.
fn program_block_starts(
    kernel: &Kernel,
    pids: &[u64],
    prefetch: &[&[i32]],
) -> Result<Vec<Vec<u64>>, RunError> {
    let mut read = read_prefetch(kernel, prefetch);
    kernel
        .refs
        .iter()
        .filter(|r| r.block.is_some())
        .map(|r| {
            let what = format!("{} %{}", r.kind.keyword(), r.name);
            ref_block_starts(&what, r, pids, &mut read)
        })
        .collect()
}

/// Where I/O ref `r`'s block of program `pids` starts (see [`block_starts`]), a failure
/// being a fault of the program.
fn ref_block_starts(
    what: &str,
    r: &crate::ir::RefDecl,
    pids: &[u64],
    read: &mut crate::ir::ScalarRead,
) -> Result<Vec<u64>, RunError> {
    let spec = r.block.as_ref().expect("I/O refs have block specs");
    block_starts(what, &r.ty.shape, spec, pids, Some(read)).map_err(|e| RunError::Fault {
        program: pids.to_vec(),
        op: e.op,
        message: e.message,
    })
}

/// Checks that the blocks every program's index maps place from scalar-prefetch data
/// (`prefetch`, the leading inputs) lie inside their arrays: backends that compute
/// block positions in compiled code (native, XLA) call this before running, so a bad
/// table is an error naming the program, the ref and the read, never a stray access.
pub fn check_scalar_prefetch(kernel: &Kernel, prefetch: &[&[i32]]) -> Result<(), RunError> {
    if kernel.scalar_prefetch() == 0 {
        return Ok(());
    }
    // The verifier checked the maps that read no data.
    let dependent: Vec<_> = kernel
        .refs
        .iter()
        .filter(|r| {
            r.block
                .as_ref()
                .is_some_and(|b| b.index_map.reads_scalars())
        })
        .map(|r| (format!("{} %{}", r.kind.keyword(), r.name), r))
        .collect();
    let mut read = read_prefetch(kernel, prefetch);
    (0..kernel.num_programs()).try_for_each(|i| {
        let pids = unflatten(i, &kernel.grid);
        dependent
            .iter()
            .try_for_each(|(what, r)| ref_block_starts(what, r, &pids, &mut read).map(drop))
    })
}

/// Runs `kernel` on `inputs` and returns its outputs.
pub fn interpret(
    kernel: &Kernel,
    inputs: &[Array],
    options: &InterpretOptions,
) -> Result<Vec<Array>, RunError> {
    verify(kernel).map_err(RunError::Invalid)?;
    check_inputs(kernel, inputs)?;
    check_allocatable(kernel)?;
    let fill = |r: &crate::ir::RefDecl| {
        let value = if options.poison_uninitialized {
            f64::NAN
        } else {
            0.0
        };
        let what = format!("{} %{}", r.kind.keyword(), r.name);
        Array::try_filled(r.ty.clone(), value, &what).map_err(RunError::Alloc)
    };
    let outputs: Vec<Mutex<Array>> = kernel
        .refs_of(RefKind::Output)
        .map(|(_, r)| fill(r).map(Mutex::new))
        .collect::<Result<_, _>>()?;

    let parallel_prefix = kernel
        .dimension_semantics
        .iter()
        .take_while(|s| **s == DimSemantics::Parallel)
        .count();
    let outer: u64 = kernel.grid[..parallel_prefix].iter().product();
    let inner: u64 = kernel.grid[parallel_prefix..].iter().product();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if options.threads == 0 {
        cores
    } else {
        options.threads
    };
    let threads = threads.min(outer as usize).max(1);

    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let first_fault: Mutex<Option<(u64, RunError)>> = Mutex::new(None);
    let namer = std::sync::OnceLock::new();
    let record = |flat: u64, e: RunError| {
        let mut slot = first_fault.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|(f, _)| flat < *f) {
            *slot = Some((flat, e));
        }
        failed.store(true, Ordering::Relaxed);
    };
    let prefetch = prefetch_data(kernel, inputs);
    let worker = || {
        let scratch: Result<Vec<Array>, _> = kernel
            .refs_of(RefKind::Scratch)
            .map(|(_, r)| fill(r))
            .collect();
        let mut scratch = match scratch {
            Ok(s) => s,
            Err(e) => return record(0, e),
        };
        loop {
            let o = next.fetch_add(1, Ordering::Relaxed);
            if o >= outer || failed.load(Ordering::Relaxed) {
                return;
            }
            for i in 0..inner {
                let flat = o * inner + i;
                let pids = unflatten(flat, &kernel.grid);
                if let Err(e) =
                    run_program(kernel, &pids, (inputs, &prefetch), &outputs, &mut scratch)
                {
                    let e = match e {
                        ProgramError::Fault(Fault::Check(c)) => RunError::CheckFailed(c),
                        ProgramError::Fault(Fault::Op { op, message }) => RunError::Fault {
                            program: pids,
                            op: namer
                                .get_or_init(|| Namer::new(kernel))
                                .op_header(kernel, op),
                            message,
                        },
                        ProgramError::Run(e) => e,
                    };
                    return record(flat, e);
                }
            }
        }
    };
    if threads == 1 {
        worker();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(worker);
            }
        });
    }
    if let Some((_, e)) = first_fault.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(outputs
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect())
}

enum ProgramError<'k> {
    Fault(Fault<'k>),
    Run(RunError),
}

/// The state of one program: its block positions and the values computed so far.
struct Program<'k, 'a> {
    kernel: &'k Kernel,
    pids: &'a [u64],
    inputs: &'a [Array],
    outputs: &'a [Mutex<Array>],
    scratch: &'a mut [Array],
    /// Where each input/output block starts, per array dim.
    block_starts: Vec<Vec<u64>>,
    env: Vec<Option<Rc<Array>>>,
}

fn run_program<'k>(
    kernel: &'k Kernel,
    pids: &[u64],
    inputs: (&[Array], &[&[i32]]),
    outputs: &[Mutex<Array>],
    scratch: &mut [Array],
) -> Result<(), ProgramError<'k>> {
    let (inputs, prefetch) = inputs;
    let block_starts = program_block_starts(kernel, pids, prefetch).map_err(ProgramError::Run)?;
    let mut program = Program {
        kernel,
        pids,
        inputs,
        outputs,
        scratch,
        block_starts,
        env: vec![None; kernel.value_types.len()],
    };
    program
        .region(&kernel.body)
        .map(|_| ())
        .map_err(ProgramError::Fault)
}

impl<'k> Program<'k, '_> {
    fn get(&self, v: Value) -> Rc<Array> {
        self.env[v.0 as usize]
            .clone()
            .expect("the verifier checks values are defined before use")
    }

    fn set(&mut self, v: Value, a: Array) {
        self.env[v.0 as usize] = Some(Rc::new(a));
    }

    fn scalar_i64(&self, v: Value) -> i64 {
        match self.get(v).data() {
            ArrayData::Int(x) => i64::from(x[0]),
            _ => unreachable!("the verifier checks index values are i32"),
        }
    }

    /// Runs a region's ops; returns the yielded values (empty for the body).
    fn region(&mut self, region: &'k Region) -> Result<Vec<Rc<Array>>, Fault<'k>> {
        for op in &region.ops {
            if let OpKind::Yield { values } = &op.kind {
                return Ok(values.iter().map(|&v| self.get(v)).collect());
            }
            self.op(op)?;
        }
        Ok(vec![])
    }

    fn op(&mut self, op: &'k Op) -> Result<(), Fault<'k>> {
        let fault = |message: String| Fault::Op { op, message };
        match &op.kind {
            OpKind::Load {
                src,
                index,
                mask,
                other,
            } => {
                let value = self.load(*src, index, *mask, *other).map_err(fault)?;
                self.set(op.results[0], value);
            }
            OpKind::Store {
                dst,
                index,
                value,
                mask,
            } => self.store(*dst, index, *value, *mask).map_err(fault)?,
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let (lo, hi, st) = (
                    self.scalar_i64(*lower),
                    self.scalar_i64(*upper),
                    self.scalar_i64(*step),
                );
                if st <= 0 {
                    return Err(fault(format!(
                        "loop step is {st}, expected a positive step"
                    )));
                }
                let mut carried: Vec<Rc<Array>> = inits.iter().map(|&v| self.get(v)).collect();
                let mut i = lo;
                while i < hi {
                    self.set(
                        body.args[0],
                        Array::filled(TensorType::scalar(DType::I32), i as f64),
                    );
                    for (&arg, val) in body.args[1..].iter().zip(carried) {
                        self.env[arg.0 as usize] = Some(val);
                    }
                    carried = self.region(body)?;
                    i += st;
                }
                self.bind(op, carried);
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let taken = match self.get(*cond).data() {
                    ArrayData::Bool(b) => b[0],
                    _ => unreachable!("the verifier checks the condition is bool"),
                };
                let values = self.region(if taken { then_region } else { else_region })?;
                self.bind(op, values);
            }
            OpKind::Yield { .. } => unreachable!("handled by region()"),
            OpKind::DebugPrint { message, values } => {
                eprintln!("{}", self.debug_line(message, values));
            }
            OpKind::Check {
                kind,
                cond,
                message,
                values,
            } => {
                let holds = match self.get(*cond).data() {
                    ArrayData::Bool(b) => b.iter().all(|&x| x),
                    _ => unreachable!("the verifier checks the condition is bool"),
                };
                if !holds {
                    return Err(Fault::Check(ops::CheckFailure {
                        kind: *kind,
                        program: self.pids.to_vec(),
                        line: self.debug_line(message, values),
                    }));
                }
            }
            kind => {
                let cx = ops::EvalCx {
                    operand: &|v| self.get(v),
                    result: self.kernel.type_of(op.results[0]),
                    pids: self.pids,
                    grid: &self.kernel.grid,
                };
                let value = ops::eval(kind, &cx).map_err(fault)?;
                self.set(op.results[0], value);
            }
        }
        Ok(())
    }

    /// The line a `debug_print` prints and a failed `check` reports: the program id,
    /// `message` and `values`.
    fn debug_line(&self, message: &str, values: &[Value]) -> String {
        let arrays: Vec<Rc<Array>> = values.iter().map(|&v| self.get(v)).collect();
        let arrays: Vec<&Array> = arrays.iter().map(Rc::as_ref).collect();
        ops::format_debug_print(message, self.pids, &arrays)
    }

    /// Binds `op`'s results to the values its region yielded.
    fn bind(&mut self, op: &Op, values: Vec<Rc<Array>>) {
        for (&r, val) in op.results.iter().zip(values) {
            self.env[r.0 as usize] = Some(val);
        }
    }

    /// The array behind a ref, with where this program's block starts in it.
    fn locate(&self, r: RefId) -> (usize, RefKind, Vec<u64>) {
        let decl = self.kernel.ref_decl(r);
        let n_in = self.inputs.len();
        let n_out = self.outputs.len();
        let i = r.0 as usize;
        match decl.kind {
            RefKind::Input => (i, decl.kind, self.block_starts[i].clone()),
            RefKind::Output => (i - n_in, decl.kind, self.block_starts[i].clone()),
            RefKind::Scratch => (i - n_in - n_out, decl.kind, vec![0; decl.ty.rank()]),
        }
    }

    fn load(
        &self,
        src: RefId,
        index: &[crate::ir::Index],
        mask: Option<Value>,
        other: Option<Value>,
    ) -> Result<Array, String> {
        let decl = self.kernel.ref_decl(src);
        let (slot, kind, starts) = self.locate(src);
        let dims = window::resolve(decl, &starts, index, |v| self.scalar_i64(v))
            .map_err(|e| format!("load of %{}: {e}", decl.name))?;
        let mask = mask.map(|m| self.get(m));
        let mask_bits = mask.as_deref().map(bools);
        let other = other.map(|o| self.get(o));
        let other_data = other.as_deref().map(Array::data);
        let read = |a: &Array| window::load(a.data(), a.shape(), &dims, mask_bits, other_data);
        let data = match kind {
            RefKind::Input => read(&self.inputs[slot]),
            RefKind::Output => read(&self.outputs[slot].lock().unwrap_or_else(|p| p.into_inner())),
            RefKind::Scratch => read(&self.scratch[slot]),
        };
        let ty = window::value_type(decl, &dims);
        Ok(Array::from_parts(ty, data))
    }

    fn store(
        &mut self,
        dst: RefId,
        index: &[crate::ir::Index],
        value: Value,
        mask: Option<Value>,
    ) -> Result<(), String> {
        let decl = self.kernel.ref_decl(dst);
        let (slot, kind, starts) = self.locate(dst);
        let dims = window::resolve(decl, &starts, index, |v| self.scalar_i64(v))
            .map_err(|e| format!("store to %{}: {e}", decl.name))?;
        let value = self.get(value);
        let mask = mask.map(|m| self.get(m));
        let mask_bits = mask.as_deref().map(bools);
        let write = |a: &mut Array| {
            let shape = a.shape().to_vec();
            window::store(a.data_mut(), &shape, &dims, value.data(), mask_bits)
        };
        match kind {
            RefKind::Output => {
                write(&mut self.outputs[slot].lock().unwrap_or_else(|p| p.into_inner()))
            }
            RefKind::Scratch => write(&mut self.scratch[slot]),
            RefKind::Input => unreachable!("the verifier rejects stores to inputs"),
        }
        Ok(())
    }
}

fn bools(a: &Array) -> &[bool] {
    match a.data() {
        ArrayData::Bool(b) => b,
        _ => unreachable!("the verifier checks masks are bool"),
    }
}
