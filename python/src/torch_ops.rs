//! The library ops as PyTorch dispatcher ops. Each op is declared once, beside its
//! kernel, as a [`kernels::OpSpec`] (schema, doc, result types, checks and launch plan);
//! `torch.ops.tessera.*` are defined from Python with those schemas, and their CPU
//! kernels are the boxed Rust functions here, registered through PyTorch's stable C
//! interface, so an eager call runs no Python below autograd.
//!
//! A kernel reads its arguments, has the op's plan check them (errors name the
//! argument), allocates the results with PyTorch, and runs the library kernel on the
//! tensors' storage. Failures leave as C++ exceptions whose message starts with the
//! Python exception they stand for (`ValueError: `, `IndexError: `, `MemoryError: `);
//! the Python autograd kernels raise that exception.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use kernel_ir::CheckKind;
use kernels::torch_op::{self, Form, Meta, Operand};
use kernels::OpSpec;
use runtime::Backend;

use crate::torch_abi::{
    self, int32_of, take_optional, torch, BoxedKernel, Handle, StableIValue, Tensor,
};
use crate::{run_call, Buffer, OpCall, OpError};

/// The ops, in registration order (a kernel finds its op by index).
pub(crate) fn ops() -> &'static [OpSpec] {
    kernels::torch_ops()
}

/// The argument types the kernels read off the stack.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ArgType {
    Tensor,
    Float,
    Bool,
    OptionalTensor,
    OptionalFloat,
    OptionalInt,
}

/// One argument as the schema declares it: its type (`None` for a type the kernels do
/// not read) and its name.
type SchemaArg = (Option<ArgType>, &'static str);

/// The arguments of `op` with the type the kernels read each as (`None` for a type they
/// do not read).
fn parse_args(op: &OpSpec) -> Vec<SchemaArg> {
    op.args()
        .into_iter()
        .map(|(ty, name)| {
            let ty = match ty {
                "Tensor" => Some(ArgType::Tensor),
                "float" => Some(ArgType::Float),
                "bool" => Some(ArgType::Bool),
                "Tensor?" => Some(ArgType::OptionalTensor),
                "float?" => Some(ArgType::OptionalFloat),
                "int?" => Some(ArgType::OptionalInt),
                _ => None,
            };
            (ty, name)
        })
        .collect()
}

/// The arguments of op `i`, parsed from its schema once.
fn schema_args(i: usize) -> &'static [SchemaArg] {
    static ARGS: OnceLock<Vec<Vec<SchemaArg>>> = OnceLock::new();
    &ARGS.get_or_init(|| ops().iter().map(parse_args).collect())[i]
}

/// An argument read off the stack.
enum Value {
    Tensor(Tensor),
    Float(f64),
    Int(i64),
    Bool(bool),
    None,
}

/// How many ops the boxed kernels below can serve.
const SLOTS: usize = 24;

/// The boxed kernel of op `I`.
extern "C-unwind" fn boxed<const I: usize>(stack: *mut StableIValue, args: u64, results: u64) {
    let Some(op) = ops().get(I) else {
        torch_abi::throw(&format!("tessera: no op in slot {I}"))
    };
    // SAFETY: PyTorch calls with a stack of `max(args, results)` values laid out by the
    // op's schema.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        call(op, schema_args(I), stack, args, results)
    }));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.tagged(),
        Err(_) => format!("tessera::{}: internal error (panic)", op.name()),
    };
    torch_abi::throw(&message)
}

/// The boxed kernels, one per op of [`ops`].
pub(crate) fn kernels() -> Vec<(&'static str, BoxedKernel)> {
    macro_rules! slots {
        ($($i:literal)*) => { [$(boxed::<$i> as BoxedKernel),*] };
    }
    let table: [BoxedKernel; SLOTS] =
        slots!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23);
    ops().iter().map(OpSpec::name).zip(table).collect()
}

/// Reads the arguments (taking ownership of every tensor handle first, so all are freed
/// whatever happens), runs the op, and puts its results on the stack.
///
/// # Safety
/// `stack` must hold `max(args, results)` values laid out by `op`'s schema.
unsafe fn call(
    op: &OpSpec,
    schema: &'static [SchemaArg],
    stack: *mut StableIValue,
    args: u64,
    results: u64,
) -> Result<(), OpError> {
    let slots = std::slice::from_raw_parts_mut(stack, args.max(results) as usize);
    if schema.iter().any(|(ty, _)| ty.is_none()) {
        return Err(OpError::Failed(format!(
            "tessera::{}: the schema has an argument type the kernel cannot read",
            op.name()
        )));
    }
    let values: Vec<Value> = schema
        .iter()
        .filter_map(|(ty, _)| *ty)
        .zip(slots.iter())
        .map(|(ty, &v)| match ty {
            ArgType::Tensor => Value::Tensor(Tensor::from_raw(v as Handle)),
            ArgType::Float => Value::Float(f64::from_bits(v)),
            ArgType::Bool => Value::Bool(v & 0xff != 0),
            ArgType::OptionalTensor => take_optional(v).map_or(Value::None, |h| {
                Value::Tensor(Tensor::from_raw(h as Handle))
            }),
            ArgType::OptionalInt => take_optional(v).map_or(Value::None, |i| Value::Int(i as i64)),
            ArgType::OptionalFloat => {
                take_optional(v).map_or(Value::None, |f| Value::Float(f64::from_bits(f)))
            }
        })
        .collect();
    let outs = run(op, schema, values)?;
    if outs.len() as u64 != results {
        return Err(OpError::Failed(format!(
            "tessera::{}: made {} results, the schema has {results}",
            op.name(),
            outs.len()
        )));
    }
    for (slot, t) in slots.iter_mut().zip(outs) {
        *slot = t.into_raw() as StableIValue;
    }
    Ok(())
}

impl OpError {
    /// The message a C++ exception carries: prefixed by the Python exception it stands
    /// for, except `RuntimeError` (what PyTorch raises for it anyway).
    pub(crate) fn tagged(self) -> String {
        match self {
            OpError::Bad(m) => format!("ValueError: {m}"),
            OpError::NoMemory(m) => format!("MemoryError: {m}"),
            OpError::Checked(kind, m) => format!("{}: {m}", kind.python_error()),
            OpError::Failed(m) => m,
        }
    }
}

thread_local! {
    /// The backend `tessera.backend(...)` asks for on this thread.
    static BACKEND: Cell<Backend> = const { Cell::new(Backend::Auto) };
}

/// Sets this thread's backend; returns the previous one.
pub(crate) fn set_backend(backend: Backend) -> Backend {
    BACKEND.with(|b| b.replace(backend))
}

/// This thread's backend.
pub(crate) fn backend() -> Backend {
    BACKEND.with(Cell::get)
}

// ---- running a planned call ------------------------------------------------------------

/// The tensor of a defined tensor argument, taken out of `value`.
fn take_tensor(value: &mut Value) -> Option<Tensor> {
    match std::mem::replace(value, Value::None) {
        Value::Tensor(t) if t.is_defined() => Some(t),
        _ => None,
    }
}

/// What the op's checks see of an argument (and that a tensor is on the CPU).
fn meta(value: &Value, name: &str) -> Result<torch_op::Value, OpError> {
    Ok(match value {
        Value::Tensor(t) if t.is_defined() => {
            if !t.is_cpu() {
                return Err(OpError::Bad(format!(
                    "{name}: tessera ops run on CPU tensors"
                )));
            }
            torch_op::Value::Tensor(Meta {
                shape: t.shape(),
                dtype: torch().dtype_name(t.dtype()),
                device: "cpu".into(),
            })
        }
        Value::Float(f) => torch_op::Value::Float(*f),
        Value::Int(i) => torch_op::Value::Int(*i),
        Value::Bool(b) => torch_op::Value::Bool(*b),
        Value::Tensor(_) | Value::None => torch_op::Value::None,
    })
}

/// Checks and plans a call of `op`, then runs it: the results, of which the op returns
/// the first [`OpSpec::returns`].
fn run(op: &OpSpec, schema: &[SchemaArg], mut values: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let metas = values
        .iter()
        .zip(schema)
        .map(|(v, (_, name))| meta(v, name))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = (op.plan)(&metas).map_err(OpError::Bad)?;
    let mut operands = Vec::with_capacity(plan.inputs.len());
    for operand in &plan.inputs {
        let name = schema.get(operand.arg).map_or("", |(_, n)| n);
        let tensor = values
            .get_mut(operand.arg)
            .and_then(take_tensor)
            .ok_or_else(|| OpError::Failed(format!("{name}: the plan names a missing tensor")))?;
        operands.push(prepare(tensor, operand, name)?);
    }
    if let Some(check) = &plan.check_indices {
        let ints: Vec<&[i32]> = plan
            .inputs
            .iter()
            .zip(&operands)
            .filter(|(o, _)| o.dtype == kernel_ir::DType::I32)
            .map(|(o, t)| {
                // SAFETY: a contiguous int32 tensor of the operand's element count,
                // alive as long as `operands`.
                unsafe { std::slice::from_raw_parts(t.data() as *const i32, numel(&o.shape)) }
            })
            .collect();
        check(&ints).map_err(OpError::Bad)?;
    }
    let results = op
        .outputs
        .iter()
        .map(|out| {
            let m = out.eval(&metas);
            let code = torch_op::tessera_dtype(&m.dtype)
                .and_then(|d| torch().dtype_code(d.name()))
                .unwrap_or(torch().f32);
            Tensor::empty(&m.shape, code).map_err(OpError::NoMemory)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if plan.launch {
        let inputs: Vec<Buffer> = plan
            .inputs
            .iter()
            .zip(&operands)
            .map(|(o, t)| (t.data(), o.shape.clone(), o.dtype.name().to_string()))
            .collect();
        let outputs: Vec<Buffer> = plan
            .outputs
            .iter()
            .zip(&results)
            .map(|(shape, t)| (t.data(), shape.clone(), dtype_of(t)))
            .collect();
        let call = OpCall::planned(&plan).map_err(OpError::Bad)?;
        run_call(&call, &inputs, &outputs, backend())?;
    } else {
        for (out, t) in op.outputs.iter().zip(&results) {
            fill(t, out.empty);
        }
    }
    let mut results = results;
    results.truncate(op.returns);
    Ok(results)
}

fn numel(shape: &[u64]) -> usize {
    shape.iter().product::<u64>() as usize
}

/// Tessera's name of a result's dtype.
fn dtype_of(t: &Tensor) -> String {
    torch()
        .tessera_dtype(t.dtype())
        .unwrap_or("f32")
        .to_string()
}

/// The argument `tensor` as the kernel takes operand `o`: contiguous, of its dtype (int64
/// indices checked into int32; a gradient converted), a score mask made additive f32 of
/// the operand's shape.
fn prepare(tensor: Tensor, o: &Operand, name: &str) -> Result<Tensor, OpError> {
    let t = torch();
    let want = t.dtype_code(o.dtype.name()).unwrap_or(t.f32);
    match o.form {
        Form::ScoreMask => score_mask(&tensor, &o.shape),
        Form::Data if tensor.dtype() == want => tensor.contiguous().map_err(OpError::Failed),
        Form::Data if tensor.dtype() == t.i64 => {
            int32_of(tensor).map_err(|m| OpError::Checked(CheckKind::Index, format!("{name}: {m}")))
        }
        Form::Data => {
            let copy = Tensor::empty(&tensor.shape(), want).map_err(OpError::NoMemory)?;
            copy.copy_from(&tensor).map_err(OpError::Failed)?;
            Ok(copy)
        }
    }
}

/// A score mask (boolean: true where the query sees the key; or additive float) as
/// the kernel takes it: additive f32 of `shape` (broadcast; a hidden key -inf).
fn score_mask(mask: &Tensor, shape: &[u64]) -> Result<Tensor, OpError> {
    let t = torch();
    let additive = Tensor::empty(shape, t.f32).map_err(OpError::NoMemory)?;
    additive.copy_from(mask).map_err(OpError::Failed)?;
    if mask.dtype() == t.bool {
        // SAFETY: `additive` is a fresh contiguous f32 tensor of `shape`.
        let values =
            unsafe { std::slice::from_raw_parts_mut(additive.data() as *mut f32, numel(shape)) };
        for x in values {
            *x = if *x != 0.0 { 0.0 } else { f32::NEG_INFINITY };
        }
    }
    Ok(additive)
}

/// Fills a fresh contiguous result with `value` (0, or -inf for a float32 log-sum-exp).
fn fill(t: &Tensor, value: f32) {
    let n = numel(&t.shape());
    if value == 0.0 {
        let bytes = n * if dtype_of(t) == "f32" { 4 } else { 2 };
        // SAFETY: `t` is a fresh contiguous tensor of exactly `bytes` bytes (f32, bf16
        // or f16: all-zero bits are 0.0 in each).
        unsafe { std::ptr::write_bytes(t.data() as *mut u8, 0, bytes) };
    } else {
        // SAFETY: only float32 results (log-sum-exps) have a nonzero empty value.
        unsafe { std::slice::from_raw_parts_mut(t.data() as *mut f32, n) }.fill(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every schema argument has a type the kernels read, and every op a slot.
    #[test]
    fn every_schema_argument_type_is_read() {
        assert!(ops().len() <= SLOTS, "{} ops, {SLOTS} slots", ops().len());
        for (i, op) in ops().iter().enumerate() {
            let args = schema_args(i);
            assert!(
                args.iter().all(|(ty, _)| ty.is_some()),
                "{}: {args:?}",
                op.schema
            );
        }
    }
}
