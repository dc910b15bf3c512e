//! The CPU kernels of user ops (`tessera.load_library`): boxed Rust functions registered
//! through PyTorch's stable C interface, as the library ops' are, so an eager call of a
//! user op runs no Python below autograd either. A kernel reads its tensor and scalar
//! arguments off the stack, writes the build request the library's op takes (the same
//! text as graph mode's), builds the kernel once per request, allocates the results
//! with PyTorch and runs the kernel on the tensors' storage.
//!
//! PyTorch calls a boxed kernel with its stack alone, so each registered op takes one of
//! [`SLOTS`] functions, each knowing its slot's index.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, RwLock};

use kernel_ir::CheckKind;
use runtime::native::Prepared;
use runtime::Backend;

use crate::library::{build, UserBuild};
use crate::torch_abi::{self, int32_of, torch, BoxedKernel, Handle, StableIValue, Tensor};
use crate::torch_ops::backend;
use crate::{compiled_in_place, launches, run_prepared, Buffer, OpError};

/// How many user ops a process can register with native kernels.
pub(crate) const SLOTS: usize = 64;

/// What a user op's argument is on the stack (`Tensor`, `float`, `int` or `bool`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum ArgKind {
    Tensor,
    Float,
    Int,
    Bool,
}

/// A registered user op: its library, names and arguments.
struct UserOp {
    lib: usize,
    /// `namespace::name`, for messages.
    qualified: String,
    name: String,
    args: Vec<(String, ArgKind)>,
}

static OPS: RwLock<Vec<UserOp>> = RwLock::new(Vec::new());

/// Registers native CPU kernels for ops `(name, [(argument, type)])` of library `lib`
/// (defined beforehand in `namespace`). Fails before registering any when the slots run
/// out (naming the namespace) or an argument's type is not one op libraries take (naming
/// the op and argument).
pub(crate) fn register(
    lib: usize,
    namespace: &str,
    ops: Vec<(String, Vec<(String, String)>)>,
) -> Result<(), String> {
    let mut table = OPS.write().unwrap_or_else(|e| e.into_inner());
    if table.len() + ops.len() > SLOTS {
        return Err(format!(
            "{namespace}: a process can register at most {SLOTS} user ops with native \
             kernels, {} are registered",
            table.len()
        ));
    }
    let mut parsed = Vec::with_capacity(ops.len());
    for (name, args) in ops {
        let qualified = format!("{namespace}::{name}");
        let args = args
            .into_iter()
            .map(|(arg, ty)| match ty.as_str() {
                "Tensor" => Ok((arg, ArgKind::Tensor)),
                "float" => Ok((arg, ArgKind::Float)),
                "int" => Ok((arg, ArgKind::Int)),
                "bool" => Ok((arg, ArgKind::Bool)),
                _ => Err(format!("{qualified}: argument `{arg}` has type {ty}")),
            })
            .collect::<Result<Vec<_>, String>>()?;
        parsed.push(UserOp {
            lib,
            qualified,
            name,
            args,
        });
    }
    let kernels: Vec<(String, BoxedKernel)> = parsed
        .iter()
        .zip(&KERNELS[table.len()..])
        .map(|(op, k)| (op.name.clone(), *k))
        .collect();
    table.extend(parsed);
    let named: Vec<(&str, BoxedKernel)> = kernels.iter().map(|(n, k)| (n.as_str(), *k)).collect();
    torch_abi::torch().register_cpu(namespace, &named)
}

/// The boxed kernel of slot `I`.
extern "C-unwind" fn boxed<const I: usize>(stack: *mut StableIValue, args: u64, results: u64) {
    let table = OPS.read().unwrap_or_else(|e| e.into_inner());
    let op = &table[I];
    // SAFETY: PyTorch calls with a stack of `max(args, results)` values laid out by the
    // op's schema, whose arguments `op.args` lists.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        call(I, op, stack, args, results)
    }));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.tagged(),
        Err(_) => format!("{}: internal error (panic)", op.qualified),
    };
    drop(table);
    torch_abi::throw(&message)
}

macro_rules! slots {
    ($($i:literal)*) => { [$(boxed::<$i> as BoxedKernel),*] };
}

/// One kernel per slot.
const KERNELS: [BoxedKernel; SLOTS] = slots!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
    61 62 63
);

/// Reads the arguments (taking ownership of every tensor handle first, so all are freed
/// whatever happens), builds and runs the op's kernel, and puts its results on the stack.
///
/// # Safety
/// `stack` must hold `max(args, results)` values laid out by `op`'s schema.
unsafe fn call(
    index: usize,
    op: &UserOp,
    stack: *mut StableIValue,
    args: u64,
    results: u64,
) -> Result<(), OpError> {
    let slots = std::slice::from_raw_parts_mut(stack, args.max(results) as usize);
    let values: Vec<(&str, ArgKind, StableIValue, Option<Tensor>)> = op
        .args
        .iter()
        .zip(slots.iter())
        .map(|((arg, kind), &v)| {
            let tensor = (*kind == ArgKind::Tensor).then(|| Tensor::from_raw(v as Handle));
            (arg.as_str(), *kind, v, tensor)
        })
        .collect();
    // The request: one `name value` line per argument, as graph mode writes it. The
    // tensors stay owned here while the kernel runs on their buffers.
    let mut request = String::new();
    let (mut tensors, mut in_buffers) = (Vec::new(), Vec::new());
    for (arg, kind, value, tensor) in values {
        let scalar = match (kind, tensor) {
            (_, Some(t)) => {
                let (t, buffer) = input(op, arg, t)?;
                let dims: Vec<String> = buffer.1.iter().map(u64::to_string).collect();
                let _ = writeln!(request, "{arg} {}[{}]", buffer.2, dims.join(", "));
                tensors.push(t);
                in_buffers.push(buffer);
                continue;
            }
            (ArgKind::Int, _) => value as i64 as f64,
            (ArgKind::Bool, _) => f64::from(u8::from(value & 0xff != 0)),
            _ => f64::from_bits(value),
        };
        let _ = writeln!(request, "{arg} {scalar:?}");
    }
    let requested = backend();
    let ready = ready(index, op, requested, request)?;
    let (mut outputs, mut out_buffers) = (Vec::new(), Vec::new());
    for ty in ready.build.output_types() {
        let code = torch()
            .dtype_code(ty.dtype.name())
            .ok_or_else(|| OpError::Failed(format!("{}: its kernel returns {ty}", op.qualified)))?;
        let t = Tensor::empty(&ty.shape, code).map_err(OpError::NoMemory)?;
        out_buffers.push((t.data(), ty.shape.clone(), ty.dtype.name().to_string()));
        outputs.push(t);
    }
    if outputs.len() as u64 != results {
        return Err(OpError::Failed(format!(
            "{}: its kernel makes {} results, the schema has {results}",
            op.qualified,
            outputs.len()
        )));
    }
    let context = || format!("op `{}`", op.name);
    // SAFETY: the buffers are the contiguous storage of `tensors` and of the fresh
    // `outputs`, alive until the end of this function.
    let done = ready
        .native
        .as_ref()
        .and_then(|native| unsafe { run_prepared(native, &context, &in_buffers, &out_buffers) });
    match done {
        Some(done) => {
            done?;
        }
        None => {
            ready
                .build
                .run(&context(), requested, &in_buffers, &out_buffers)?;
        }
    };
    drop(tensors);
    for (slot, t) in slots.iter_mut().zip(outputs) {
        *slot = t.into_raw() as StableIValue;
    }
    Ok(())
}

/// What a user op builds for one request and backend asked for, with the kernel's
/// compiled form when it runs natively on the tensors' storage.
struct Ready {
    build: UserBuild,
    native: Option<Prepared>,
}

/// Built kernels remembered, at most this many (the memo then restarts).
const BUILT_LIMIT: usize = 1024;

/// What the op in slot `index` builds for `request` on backend `requested`, built and
/// compiled once (later calls only look it up).
fn ready(
    index: usize,
    op: &UserOp,
    requested: Backend,
    request: String,
) -> Result<Arc<Ready>, OpError> {
    type Memo = HashMap<(usize, Backend, String), Arc<Ready>>;
    static MEMO: Mutex<Option<Memo>> = Mutex::new(None);
    let key = (index, requested, request);
    let hit = MEMO
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key).cloned());
    let ready = match hit {
        Some(ready) => ready,
        None => {
            let build = build(op.lib, &op.name, &key.2)?;
            let native = match &build {
                UserBuild::Kernel(kernel) => compiled_in_place(kernel, requested),
                UserBuild::Outputs(_) => None,
            };
            let ready = Arc::new(Ready { build, native });
            let mut memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
            let memo = memo.get_or_insert_with(HashMap::new);
            if memo.len() >= BUILT_LIMIT {
                memo.clear();
            }
            memo.insert(key.clone(), ready.clone());
            ready
        }
    };
    if matches!(ready.build, UserBuild::Kernel(_)) {
        launches::record(|| format!("user op {} {}", op.name, key.2));
    }
    Ok(ready)
}

/// A checked tensor argument, made contiguous, and its buffer.
fn input(op: &UserOp, arg: &str, t: Tensor) -> Result<(Tensor, Buffer), OpError> {
    if !t.is_cpu() {
        return Err(OpError::Bad(format!(
            "{}: {arg}: Tessera ops run on CPU tensors",
            op.qualified
        )));
    }
    let t = if t.dtype() == torch().i64 {
        int32_of(t).map_err(|m| {
            OpError::Checked(CheckKind::Index, format!("{}: {arg}: {m}", op.qualified))
        })?
    } else {
        t
    };
    let dtype = torch().tessera_dtype(t.dtype()).ok_or_else(|| {
        OpError::Bad(format!(
            "{}: {arg}: dtype {} is not supported (torch.float32, torch.bfloat16, \
             torch.float16, torch.int32, torch.int64 as int32, torch.bool)",
            op.qualified,
            torch().dtype_name(t.dtype())
        ))
    })?;
    let shape = t.shape();
    let t = t.contiguous().map_err(OpError::Failed)?;
    let buffer = (t.data(), shape, dtype.to_string());
    Ok((t, buffer))
}
