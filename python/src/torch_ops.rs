//! The library ops as PyTorch dispatcher ops. `torch.ops.tessera.*` are defined from
//! Python (`torch.library`, which also holds their fake and autograd kernels) with the
//! schemas in [`OPS`]; their CPU kernels are the boxed Rust functions here, registered
//! through PyTorch's stable C interface, so an eager call runs no Python below autograd.
//!
//! A kernel checks its arguments (errors name the argument, as the Python ops did),
//! allocates its results with PyTorch, and runs the library kernel on the tensors'
//! storage. Failures leave as C++ exceptions whose message starts with the Python
//! exception they stand for (`ValueError: `, `IndexError: `, `MemoryError: `); the Python autograd
//! kernels raise that exception.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use kernel_ir::CheckKind;
use runtime::Backend;

use crate::torch_abi::{
    self, int32_of, take_optional, torch, BoxedKernel, Handle, StableIValue, Tensor,
};
use crate::{run_op, Buffer, OpError};

/// One dispatcher op: its schema (`name(args) -> results`) and its CPU kernel.
pub(crate) struct NativeOp {
    pub(crate) schema: &'static str,
    run: fn(Vec<Value>) -> Result<Vec<Tensor>, OpError>,
}

impl NativeOp {
    /// The op's name: the schema up to `(`.
    pub(crate) fn name(&self) -> &'static str {
        &self.schema[..self.schema.find('(').unwrap_or(0)]
    }

    /// The argument types, in order, read from the schema (`None` for a type the
    /// kernels do not read).
    fn parse_arg_types(&self) -> Vec<Option<ArgType>> {
        let start = self.schema.find('(').map_or(0, |i| i + 1);
        let end = self.schema.find(')').unwrap_or(start);
        self.schema[start..end]
            .split(',')
            .filter_map(|a| a.split_whitespace().next())
            .map(|t| match t {
                "Tensor" => Some(ArgType::Tensor),
                "float" => Some(ArgType::Float),
                "bool" => Some(ArgType::Bool),
                "Tensor?" => Some(ArgType::OptionalTensor),
                "float?" => Some(ArgType::OptionalFloat),
                "int?" => Some(ArgType::OptionalInt),
                _ => None,
            })
            .collect()
    }
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

/// The argument types of `OPS[i]`, parsed from the schemas once (`None` when one is a
/// type the kernels do not read).
fn arg_types(i: usize) -> Option<&'static [ArgType]> {
    static TYPES: OnceLock<Vec<Option<Vec<ArgType>>>> = OnceLock::new();
    TYPES.get_or_init(|| {
        OPS.iter()
            .map(|op| op.parse_arg_types().into_iter().collect())
            .collect()
    })[i]
        .as_deref()
}

/// An argument read off the stack.
enum Value {
    Tensor(Tensor),
    Float(f64),
    Int(i64),
    Bool(bool),
    None,
}

/// The ops, in registration order (a kernel finds its op by index).
pub(crate) const OPS: &[NativeOp] = &[
    NativeOp {
        schema: "softmax(Tensor x) -> Tensor",
        run: softmax,
    },
    NativeOp {
        schema: "rms_norm(Tensor x, Tensor weight, float eps=1e-05) -> Tensor",
        run: rms_norm,
    },
    NativeOp {
        schema: "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps=1e-05) -> Tensor",
        run: layer_norm,
    },
    NativeOp {
        schema: "swiglu(Tensor gate, Tensor up) -> Tensor",
        run: swiglu,
    },
    NativeOp {
        schema: "matmul(Tensor x, Tensor y) -> Tensor",
        run: matmul,
    },
    NativeOp {
        schema: "rope(Tensor x, Tensor cos, Tensor sin) -> Tensor",
        run: rope,
    },
    NativeOp {
        schema: "flash_attention_fwd(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, \
                 int? window=None, float? softcap=None, Tensor? mask=None) -> (Tensor, Tensor)",
        run: flash_attention_fwd,
    },
    NativeOp {
        schema:
            "flash_attention_bwd(Tensor q, Tensor k, Tensor v, Tensor grad_out, bool is_causal, \
                 float scale, Tensor? out=None, Tensor? lse=None, int? window=None, \
                 float? softcap=None, Tensor? mask=None) -> (Tensor, Tensor, Tensor)",
        run: flash_attention_bwd,
    },
    NativeOp {
        schema: "flash_attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, \
                 float? scale=None, int? window=None, float? softcap=None, Tensor? mask=None) \
                 -> Tensor",
        run: flash_attention,
    },
    NativeOp {
        schema: "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, \
                 Tensor context_lens, float? scale=None) -> Tensor",
        run: paged_attention,
    },
    NativeOp {
        schema: "varlen_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, \
                 Tensor cu_seqlens_k, bool is_causal, float scale) -> (Tensor, Tensor)",
        run: varlen_attention_fwd,
    },
    NativeOp {
        schema: "varlen_attention_bwd(Tensor q, Tensor k, Tensor v, Tensor grad_out, \
                 Tensor cu_seqlens_q, Tensor cu_seqlens_k, bool is_causal, float scale, \
                 Tensor? out=None, Tensor? lse=None) -> (Tensor, Tensor, Tensor)",
        run: varlen_attention_bwd,
    },
    NativeOp {
        schema: "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, \
                 Tensor cu_seqlens_k, bool is_causal=False, float? scale=None) -> Tensor",
        run: varlen_attention,
    },
];

/// The boxed kernel of `OPS[I]`.
extern "C-unwind" fn boxed<const I: usize>(stack: *mut StableIValue, args: u64, results: u64) {
    let op = &OPS[I];
    // SAFETY: PyTorch calls with a stack of `max(args, results)` values laid out by the
    // op's schema.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        call(op, arg_types(I), stack, args, results)
    }));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.tagged(),
        Err(_) => format!("tessera::{}: internal error (panic)", op.name()),
    };
    torch_abi::throw(&message)
}

/// The boxed kernels, one per op of [`OPS`].
pub(crate) fn kernels() -> Vec<(&'static str, BoxedKernel)> {
    // Sized by `OPS`: an op added there without a slot here does not compile.
    let table: [BoxedKernel; OPS.len()] = [
        boxed::<0>,
        boxed::<1>,
        boxed::<2>,
        boxed::<3>,
        boxed::<4>,
        boxed::<5>,
        boxed::<6>,
        boxed::<7>,
        boxed::<8>,
        boxed::<9>,
        boxed::<10>,
        boxed::<11>,
        boxed::<12>,
    ];
    OPS.iter().map(NativeOp::name).zip(table).collect()
}

/// Reads the arguments (taking ownership of every tensor handle first, so all are freed
/// whatever happens), runs the op, and puts its results on the stack.
///
/// # Safety
/// `stack` must hold `max(args, results)` values laid out by `op`'s schema.
unsafe fn call(
    op: &NativeOp,
    types: Option<&[ArgType]>,
    stack: *mut StableIValue,
    args: u64,
    results: u64,
) -> Result<(), OpError> {
    let slots = std::slice::from_raw_parts_mut(stack, args.max(results) as usize);
    let Some(types) = types else {
        return Err(OpError::Failed(format!(
            "tessera::{}: the schema has an argument type the kernel cannot read",
            op.name()
        )));
    };
    let values: Vec<Value> = types
        .iter()
        .copied()
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
    let outs = (op.run)(values)?;
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

// ---- argument checks ------------------------------------------------------------------

/// `(5, 3)` / `(5,)` / `()`: a shape as Python prints it (the messages quote shapes so).
fn py_shape(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn bad(message: String) -> OpError {
    OpError::Bad(message)
}

/// A checked tensor argument: the tensor, its shape, its dtype code and its name (for
/// messages).
struct Arg {
    tensor: Tensor,
    shape: Vec<u64>,
    dtype: i32,
    name: &'static str,
}

impl Arg {
    /// Checks device and dtype (float32, bfloat16 or float16).
    fn new(value: Value, name: &'static str) -> Result<Arg, OpError> {
        let tensor = match value {
            Value::Tensor(t) if t.is_defined() => t,
            _ => return Err(bad(format!("{name}: expected a tensor, got None"))),
        };
        if !tensor.is_cpu() {
            return Err(bad(format!("{name}: tessera ops run on CPU tensors")));
        }
        let t = torch();
        let dtype = tensor.dtype();
        if ![t.f32, t.bf16, t.f16].contains(&dtype) {
            return Err(bad(format!(
                "{name}: dtype {} is not supported (float32, bfloat16, float16)",
                t.dtype_name(dtype)
            )));
        }
        Ok(Arg {
            shape: tensor.shape(),
            tensor,
            dtype,
            name,
        })
    }

    /// Checks device and that the dtype is int32, or int64 (PyTorch's index dtype) whose
    /// values int32 holds, converted (block tables, lengths, offsets).
    fn int32(value: Value, name: &'static str) -> Result<Arg, OpError> {
        let tensor = match value {
            Value::Tensor(t) if t.is_defined() => t,
            _ => return Err(bad(format!("{name}: expected a tensor, got None"))),
        };
        let t = torch();
        if !tensor.is_cpu() {
            return Err(bad(format!("{name}: tessera ops run on CPU tensors")));
        }
        let tensor = if tensor.dtype() == t.i64 {
            int32_of(tensor)
                .map_err(|m| OpError::Checked(CheckKind::Index, format!("{name}: {m}")))?
        } else {
            tensor
        };
        if tensor.dtype() != t.i32 {
            return Err(bad(format!(
                "{name}: expected torch.int32 or torch.int64, got {}",
                t.dtype_name(tensor.dtype())
            )));
        }
        Ok(Arg {
            shape: tensor.shape(),
            tensor,
            dtype: t.i32,
            name,
        })
    }

    /// The elements of a contiguous int32 argument.
    fn i32s(&self) -> &[i32] {
        // SAFETY: a contiguous int32 tensor of `numel` elements, alive as long as `self`.
        unsafe {
            std::slice::from_raw_parts(self.tensor.data() as *const i32, self.numel() as usize)
        }
    }

    /// Checks that the dtype is `first`'s.
    fn same_dtype(self, first: &Arg) -> Result<Arg, OpError> {
        if self.dtype != first.dtype {
            let t = torch();
            return Err(bad(format!(
                "{}: dtype {} differs from the first argument's {}",
                self.name,
                t.dtype_name(self.dtype),
                t.dtype_name(first.dtype)
            )));
        }
        Ok(self)
    }

    fn rank(self, rank: usize) -> Result<Arg, OpError> {
        if self.shape.len() != rank {
            return Err(bad(format!(
                "{}: expected rank {rank}, got shape {}",
                self.name,
                py_shape(&self.shape)
            )));
        }
        Ok(self)
    }

    fn min_rank(self, rank: usize) -> Result<Arg, OpError> {
        if self.shape.len() < rank {
            return Err(bad(format!(
                "{}: expected at least {rank} dimension(s), got shape {}",
                self.name,
                py_shape(&self.shape)
            )));
        }
        Ok(self)
    }

    /// A 1-D argument with `n` elements.
    fn vector(self, first: &Arg, n: u64) -> Result<Arg, OpError> {
        let a = self.same_dtype(first)?.rank(1)?;
        if a.shape[0] != n {
            return Err(bad(format!(
                "{}: expected {n} elements, got {}",
                a.name, a.shape[0]
            )));
        }
        Ok(a)
    }

    fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Tessera's name of the dtype.
    fn dtype_name(&self) -> &'static str {
        // `new` and `int32` admit only dtypes Tessera has.
        torch().tessera_dtype(self.dtype).unwrap_or("f32")
    }

    /// A buffer of the contiguous tensor, seen with `shape`.
    fn buffer(&self, shape: &[u64]) -> Buffer {
        (
            self.tensor.data(),
            shape.to_vec(),
            self.dtype_name().to_string(),
        )
    }

    fn contiguous(self) -> Result<Arg, OpError> {
        Ok(Arg {
            tensor: self.tensor.contiguous().map_err(OpError::Failed)?,
            ..self
        })
    }

    /// A fresh tensor of this dtype.
    fn empty(&self, shape: &[u64]) -> Result<Tensor, OpError> {
        Tensor::empty(shape, self.dtype).map_err(OpError::NoMemory)
    }
}

/// The arguments in order, as an iterator to take from.
struct Args(std::vec::IntoIter<Value>);

impl Args {
    fn tensor(&mut self, name: &'static str) -> Result<Arg, OpError> {
        Arg::new(self.0.next().unwrap_or(Value::None), name)
    }

    fn float(&mut self, name: &str) -> Result<Option<f64>, OpError> {
        match self.0.next() {
            Some(Value::Float(f)) if f.is_finite() => Ok(Some(f)),
            Some(Value::Float(f)) => Err(bad(format!("{name}: expected a finite number, got {f}"))),
            _ => Ok(None),
        }
    }

    /// An optional non-negative integer.
    fn count(&mut self, name: &str) -> Result<Option<u64>, OpError> {
        match self.0.next() {
            Some(Value::Int(i)) => u64::try_from(i)
                .map(Some)
                .map_err(|_| bad(format!("{name}: expected a non-negative integer, got {i}"))),
            _ => Ok(None),
        }
    }

    fn flag(&mut self) -> bool {
        matches!(self.0.next(), Some(Value::Bool(true)))
    }
}

/// Runs library kernel `kernel` with `params` on the buffers, on this thread's backend.
fn launch(
    kernel: &str,
    params: &[(&str, String)],
    inputs: &[Buffer],
    outputs: &[Buffer],
) -> Result<(), OpError> {
    let params: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    run_op(kernel, &params, inputs, outputs, backend()).map(drop)
}

/// `(rows, cols)` of a tensor seen as rows of its last dimension.
fn rows(shape: &[u64]) -> (u64, u64) {
    let cols = *shape.last().unwrap_or(&1);
    let n: u64 = shape.iter().product();
    (n.checked_div(cols).unwrap_or(0), cols)
}

/// A fresh tensor of `like`'s dtype and `shape`, zeroed (all-zero bits are 0.0 in f32,
/// bf16 and f16).
fn zeros(like: &Arg, shape: &[u64]) -> Result<Tensor, OpError> {
    let t = like.empty(shape)?;
    let bytes = shape.iter().product::<u64>() * if like.dtype_name() == "f32" { 4 } else { 2 };
    // SAFETY: `t` is a fresh contiguous tensor of exactly `bytes` bytes.
    unsafe { std::ptr::write_bytes(t.data() as *mut u8, 0, bytes as usize) };
    Ok(t)
}

// ---- the ops -------------------------------------------------------------------------

/// The row-wise ops: softmax, rms_norm, layer_norm, swiglu (one output like the first
/// input, run on `[rows, cols]`). `rest` are the other inputs, each with whether it is
/// a per-column vector (`[cols]`) rather than shaped like `first`.
fn row_op(
    kernel: &str,
    first: Arg,
    rest: Vec<(Arg, bool)>,
    eps: Option<f64>,
) -> Result<Vec<Tensor>, OpError> {
    let out = first.empty(&first.shape)?;
    if first.numel() == 0 {
        return Ok(vec![out]);
    }
    let (r, c) = rows(&first.shape);
    let first = first.contiguous()?;
    let rest = rest
        .into_iter()
        .map(|(a, vector)| Ok((a.contiguous()?, vector)))
        .collect::<Result<Vec<_>, OpError>>()?;
    let mut params = vec![
        ("rows", r.to_string()),
        ("cols", c.to_string()),
        ("dtype", first.dtype_name().into()),
    ];
    if let Some(eps) = eps {
        params.push(("eps", eps.to_string()));
    }
    let mut inputs = vec![first.buffer(&[r, c])];
    for (a, vector) in &rest {
        let shape = if *vector { vec![c] } else { vec![r, c] };
        inputs.push(a.buffer(&shape));
    }
    let output = (out.data(), vec![r, c], first.dtype_name().to_string());
    launch(kernel, &params, &inputs, &[output])?;
    Ok(vec![out])
}

fn softmax(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let x = a.tensor("x")?.min_rank(1)?;
    row_op("softmax", x, vec![], None)
}

fn rms_norm(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let x = a.tensor("x")?.min_rank(1)?;
    let cols = *x.shape.last().unwrap_or(&0);
    let w = a.tensor("weight")?.vector(&x, cols)?;
    let eps = a.float("eps")?;
    row_op("rms_norm", x, vec![(w, true)], eps)
}

fn layer_norm(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let x = a.tensor("x")?.min_rank(1)?;
    let cols = *x.shape.last().unwrap_or(&0);
    let w = a.tensor("weight")?.vector(&x, cols)?;
    let b = a.tensor("bias")?.vector(&x, cols)?;
    let eps = a.float("eps")?;
    row_op("layer_norm", x, vec![(w, true), (b, true)], eps)
}

fn swiglu(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let gate = a.tensor("gate")?.min_rank(1)?;
    let up = a.tensor("up")?.same_dtype(&gate)?;
    if up.shape != gate.shape {
        return Err(bad(format!(
            "up: shape {} differs from gate's {}",
            py_shape(&up.shape),
            py_shape(&gate.shape)
        )));
    }
    row_op("swiglu", gate, vec![(up, false)], None)
}

fn matmul(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let x = a.tensor("x")?.rank(2)?;
    let y = a.tensor("y")?.rank(2)?.same_dtype(&x)?;
    if x.shape[1] != y.shape[0] {
        return Err(bad(format!(
            "y: expected {} rows to match x, got shape {}",
            x.shape[1],
            py_shape(&y.shape)
        )));
    }
    let (m, k, n) = (x.shape[0], x.shape[1], y.shape[1]);
    if m * n * k == 0 {
        return Ok(vec![zeros(&x, &[m, n])?]);
    }
    let out = x.empty(&[m, n])?;
    let (x, y) = (x.contiguous()?, y.contiguous()?);
    let dt = x.dtype_name().to_string();
    let params = [
        ("m", m.to_string()),
        ("k", k.to_string()),
        ("n", n.to_string()),
        ("dtype", dt.clone()),
    ];
    let inputs = [x.buffer(&[m, k]), y.buffer(&[k, n])];
    launch("matmul", &params, &inputs, &[(out.data(), vec![m, n], dt)])?;
    Ok(vec![out])
}

fn rope(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let x = a.tensor("x")?.rank(4)?;
    let (b, h, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let mut tables = vec![];
    for name in ["cos", "sin"] {
        let t = a.tensor(name)?.rank(2)?.same_dtype(&x)?;
        if t.shape != [s, d] {
            return Err(bad(format!(
                "{name}: expected shape {}, got {}",
                py_shape(&[s, d]),
                py_shape(&t.shape)
            )));
        }
        tables.push(t.contiguous()?);
    }
    if d % 2 == 1 {
        return Err(bad(format!(
            "x: rotary embedding needs an even head_dim, got {d}"
        )));
    }
    let out = x.empty(&x.shape)?;
    if x.numel() == 0 {
        return Ok(vec![out]);
    }
    let x = x.contiguous()?;
    let dt = x.dtype_name().to_string();
    let params = [
        ("batch", b.to_string()),
        ("heads", h.to_string()),
        ("seq", s.to_string()),
        ("head_dim", d.to_string()),
        ("dtype", dt.clone()),
    ];
    let inputs = [
        x.buffer(&x.shape),
        tables[0].buffer(&[s, d]),
        tables[1].buffer(&[s, d]),
    ];
    launch(
        "rope",
        &params,
        &inputs,
        &[(out.data(), x.shape.clone(), dt)],
    )?;
    Ok(vec![out])
}

/// Checked attention arguments and the kernel parameters.
struct Attention {
    q: Arg,
    k: Arg,
    v: Arg,
    params: Vec<(&'static str, String)>,
    /// The score mask as the kernel takes it: additive f32 `[batch or 1, 1, q_len, kv_len]`.
    mask: Option<Tensor>,
}

impl Attention {
    fn new(a: &mut Args) -> Result<Attention, OpError> {
        let q = a.tensor("query")?.rank(4)?;
        let k = a.tensor("key")?.rank(4)?.same_dtype(&q)?;
        let v = a.tensor("value")?.rank(4)?.same_dtype(&q)?;
        if q.dtype_name() == "f16" {
            return Err(bad(
                "query: flash_attention takes float32 or bfloat16, got torch.float16".into(),
            ));
        }
        let (b, h, sq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        if k.shape[0] != b || k.shape[3] != d || k.shape != v.shape {
            return Err(bad(format!(
                "key/value: shapes {}/{} do not match query {}",
                py_shape(&k.shape),
                py_shape(&v.shape),
                py_shape(&q.shape)
            )));
        }
        let (hkv, sk) = (k.shape[1], k.shape[2]);
        check_heads(h, hkv, d)?;
        let params = vec![
            ("batch", b.to_string()),
            ("heads", h.to_string()),
            ("kv_heads", hkv.to_string()),
            ("q_len", sq.to_string()),
            ("kv_len", sk.to_string()),
            ("head_dim", d.to_string()),
            ("dtype", q.dtype_name().to_string()),
        ];
        Ok(Attention {
            q,
            k,
            v,
            params,
            mask: None,
        })
    }

    /// Reads the optional score mask: boolean (true: the query sees the key) or additive
    /// float, broadcastable to `[batch, heads, q_len, kv_len]` as SDPA's `attn_mask`,
    /// the same for every head. Made the kernel's f32 `[batch or 1, 1, q_len, kv_len]`.
    fn score_mask(&mut self, a: &mut Args) -> Result<(), OpError> {
        let mask = match a.0.next() {
            Some(Value::Tensor(t)) if t.is_defined() => t,
            _ => return Ok(()),
        };
        if !mask.is_cpu() {
            return Err(bad("mask: tessera ops run on CPU tensors".into()));
        }
        let t = torch();
        let dtype = mask.dtype();
        if ![t.bool, t.f32, t.bf16, t.f16].contains(&dtype) {
            return Err(bad(format!(
                "mask: expected a boolean or floating mask, got {}",
                t.dtype_name(dtype)
            )));
        }
        let (b, h, sq) = (self.q.shape[0], self.q.shape[1], self.q.shape[2]);
        let full = [b, h, sq, self.k.shape[2]];
        let shape = mask.shape();
        // Right-aligned as broadcasting aligns: [.., heads, q_len, kv_len].
        let lead = 4usize.saturating_sub(shape.len());
        let broadcasts = shape.len() <= 4
            && shape
                .iter()
                .zip(&full[lead..])
                .all(|(&m, &f)| m == f || m == 1);
        let per_head = shape.len() >= 3 && shape[shape.len() - 3] != 1;
        if !broadcasts {
            return Err(bad(format!(
                "mask: shape {} does not broadcast to {}",
                py_shape(&shape),
                py_shape(&full)
            )));
        }
        if per_head {
            return Err(bad(format!(
                "mask: shape {} has a mask per head; the kernel takes one for every head \
                 ([batch or 1, 1, q_len, kv_len])",
                py_shape(&shape)
            )));
        }
        let per_batch = shape.len() == 4 && shape[0] == b && b > 1;
        let kernel_shape = [if per_batch { b } else { 1 }, 1, sq, self.k.shape[2]];
        let additive = Tensor::empty(&kernel_shape, t.f32).map_err(OpError::NoMemory)?;
        additive.copy_from(&mask).map_err(OpError::Failed)?;
        if dtype == t.bool {
            let n = kernel_shape.iter().product::<u64>() as usize;
            // SAFETY: `additive` is a fresh contiguous f32 tensor of `n` elements.
            let values = unsafe { std::slice::from_raw_parts_mut(additive.data() as *mut f32, n) };
            for x in values {
                *x = if *x != 0.0 { 0.0 } else { f32::NEG_INFINITY };
            }
        }
        let kind = if per_batch { "batch" } else { "shared" };
        self.params.push(("mask", kind.to_string()));
        self.mask = Some(additive);
        Ok(())
    }

    /// The score mask's buffer, if there is one.
    fn mask_buffer(&self) -> Option<Buffer> {
        let m = self.mask.as_ref()?;
        Some((m.data(), m.shape(), "f32".to_string()))
    }

    /// Adds `causal` and the `scale` when given (the kernel's default is
    /// `1/sqrt(head_dim)`; leaving it out keeps the problem the one `tessera tune` stores).
    fn options(&mut self, causal: bool, scale: Option<f64>) {
        self.params.push(("causal", causal.to_string()));
        if let Some(scale) = scale {
            self.params.push(("scale", format!("{scale:?}")));
        }
    }

    /// Reads and adds the sliding `window` and the `softcap` (both optional).
    fn window_and_softcap(&mut self, a: &mut Args) -> Result<(), OpError> {
        if let Some(w) = a.count("window")? {
            self.params.push(("window", w.to_string()));
        }
        match a.float("softcap")? {
            Some(cap) if cap <= 0.0 => {
                return Err(bad(format!(
                    "softcap: expected a positive number, got {cap:?}"
                )))
            }
            Some(cap) => self.params.push(("softcap", format!("{cap:?}"))),
            None => {}
        }
        Ok(())
    }

    fn empty(&self) -> bool {
        self.q.numel() == 0 || self.k.numel() == 0
    }

    /// The forward's output and log-sum-exp `[batch, heads, q_len, 1]`, if saved.
    fn saved(&self, a: &mut Args) -> Result<Option<(Arg, Arg)>, OpError> {
        let lse_shape = [self.q.shape[0], self.q.shape[1], self.q.shape[2], 1];
        saved_forward(a, &self.q, &lse_shape)
    }

    /// The forward: output and log-sum-exp `[batch, heads, q_len, 1]` (f32).
    fn forward(self) -> Result<Vec<Tensor>, OpError> {
        let lse_shape = [self.q.shape[0], self.q.shape[1], self.q.shape[2], 1];
        if self.empty() {
            return no_keys(&self.q, &lse_shape);
        }
        let lse = Tensor::empty(&lse_shape, torch().f32).map_err(OpError::NoMemory)?;
        let out = self.q.empty(&self.q.shape)?;
        let mask = self.mask_buffer();
        let (q, k, v) = (
            self.q.contiguous()?,
            self.k.contiguous()?,
            self.v.contiguous()?,
        );
        let mut inputs = vec![q.buffer(&q.shape), k.buffer(&k.shape), v.buffer(&v.shape)];
        inputs.extend(mask);
        let outputs = [
            (out.data(), q.shape.clone(), q.dtype_name().to_string()),
            (lse.data(), lse_shape.to_vec(), "f32".to_string()),
        ];
        launch("flash_attention", &self.params, &inputs, &outputs)?;
        Ok(vec![out, lse])
    }
}

/// Attention's head counts (GQA: the kv heads divide the query heads) and head dim.
fn check_heads(heads: u64, kv_heads: u64, head_dim: u64) -> Result<(), OpError> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(bad(format!(
            "key: {kv_heads} heads do not divide the query's {heads} heads"
        )));
    }
    if head_dim == 0 {
        return Err(bad("query: head_dim must be at least 1".into()));
    }
    Ok(())
}

/// The forward's output and log-sum-exp (`lse_shape`, f32), when the caller saved them
/// (both or neither), checked against the query and made contiguous.
fn saved_forward(a: &mut Args, q: &Arg, lse_shape: &[u64]) -> Result<Option<(Arg, Arg)>, OpError> {
    let (out, lse) = match (a.0.next(), a.0.next()) {
        (Some(Value::Tensor(o)), Some(Value::Tensor(l))) => (o, l),
        (None | Some(Value::None), None | Some(Value::None)) => return Ok(None),
        _ => {
            return Err(bad(
                "out/lse: pass both of the forward's results or neither".into(),
            ))
        }
    };
    let out = Arg::new(Value::Tensor(out), "out")?.same_dtype(q)?;
    let lse = Arg::new(Value::Tensor(lse), "lse")?;
    if out.shape != q.shape || lse.shape != lse_shape || lse.dtype != torch().f32 {
        return Err(bad(format!(
            "out/lse: expected the forward's {} output and float32 {} log-sum-exp, got {} and {} {}",
            py_shape(&q.shape),
            py_shape(lse_shape),
            py_shape(&out.shape),
            torch().dtype_name(lse.dtype),
            py_shape(&lse.shape)
        )));
    }
    Ok(Some((out.contiguous()?, lse.contiguous()?)))
}

/// The forward's results when queries see no keys: output 0, log-sum-exp -inf (as
/// PyTorch's SDPA).
fn no_keys(q: &Arg, lse_shape: &[u64]) -> Result<Vec<Tensor>, OpError> {
    let lse = Tensor::empty(lse_shape, torch().f32).map_err(OpError::NoMemory)?;
    let n = lse_shape.iter().product::<u64>() as usize;
    // SAFETY: `lse` is a fresh contiguous f32 tensor of `n` elements.
    unsafe { std::slice::from_raw_parts_mut(lse.data() as *mut f32, n) }.fill(f32::NEG_INFINITY);
    Ok(vec![zeros(q, &q.shape)?, lse])
}

/// Fresh tensors shaped like q, k and v for their gradients; `zeroed` when no work will
/// write them (no queries or no keys).
fn gradients_like(qkv: [&Arg; 3], zeroed: bool) -> Result<Vec<Tensor>, OpError> {
    qkv.iter()
        .map(|t| {
            if zeroed {
                zeros(t, &t.shape)
            } else {
                t.empty(&t.shape)
            }
        })
        .collect()
}

/// `grad` in `like`'s dtype, contiguous (a conversion copies into fresh contiguous
/// memory already).
fn grad_like(grad: Arg, like: &Arg) -> Result<Arg, OpError> {
    if grad.dtype == like.dtype {
        grad.contiguous()
    } else {
        convert(grad, like)
    }
}

fn flash_attention_fwd(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let mut att = Attention::new(&mut a)?;
    let causal = a.flag();
    let scale = a.float("scale")?;
    att.options(causal, scale);
    att.window_and_softcap(&mut a)?;
    att.score_mask(&mut a)?;
    att.forward()
}

fn flash_attention(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut outs = flash_attention_fwd(args)?;
    outs.truncate(1);
    Ok(outs)
}

fn flash_attention_bwd(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let mut att = Attention::new(&mut a)?;
    let grad = Arg::new(a.0.next().unwrap_or(Value::None), "grad_out")?.rank(4)?;
    if grad.shape != att.q.shape {
        return Err(bad(format!(
            "grad_out: shape {} differs from query's {}",
            py_shape(&grad.shape),
            py_shape(&att.q.shape)
        )));
    }
    let causal = a.flag();
    let scale = a.float("scale")?;
    att.options(causal, scale);
    let saved = att.saved(&mut a)?;
    att.window_and_softcap(&mut a)?;
    att.score_mask(&mut a)?;
    if att.empty() {
        return gradients_like([&att.q, &att.k, &att.v], true);
    }
    let grads = gradients_like([&att.q, &att.k, &att.v], false)?;
    let grad = grad_like(grad, &att.q)?;
    let mask = att.mask_buffer();
    let (q, k, v) = (
        att.q.contiguous()?,
        att.k.contiguous()?,
        att.v.contiguous()?,
    );
    let mut inputs = vec![
        q.buffer(&q.shape),
        k.buffer(&k.shape),
        v.buffer(&v.shape),
        grad.buffer(&q.shape),
    ];
    if let Some((out, lse)) = saved {
        inputs.extend([out.buffer(&out.shape), lse.buffer(&lse.shape)]);
    }
    inputs.extend(mask);
    let outputs: Vec<Buffer> = grads
        .iter()
        .zip([&q, &k, &v])
        .map(|(g, t)| (g.data(), t.shape.clone(), t.dtype_name().to_string()))
        .collect();
    launch("flash_attention_bwd", &att.params, &inputs, &outputs)?;
    Ok(grads)
}

/// Decode attention over a paged KV cache: `q [batch, heads, head_dim]`, caches
/// `[kv_heads, num_pages, page_size, head_dim]`, an int32 `[batch, max_pages]` block table
/// and int32 `[batch]` lengths, checked before anything runs.
fn paged_attention(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let q = a.tensor("query")?.rank(3)?;
    if q.dtype_name() == "f16" {
        return Err(bad(
            "query: paged_attention takes float32 or bfloat16, got torch.float16".into(),
        ));
    }
    let k = a.tensor("k_cache")?.rank(4)?.same_dtype(&q)?;
    let v = a.tensor("v_cache")?.rank(4)?.same_dtype(&q)?;
    let table = Arg::int32(a.0.next().unwrap_or(Value::None), "block_table")?.rank(2)?;
    let lens = Arg::int32(a.0.next().unwrap_or(Value::None), "context_lens")?.rank(1)?;
    let scale = a.float("scale")?;
    let (b, h, d) = (q.shape[0], q.shape[1], q.shape[2]);
    let (hkv, pages, ps) = (k.shape[0], k.shape[1], k.shape[2]);
    if k.shape != v.shape || k.shape[3] != d {
        return Err(bad(format!(
            "k_cache/v_cache: shapes {}/{} must be equal [kv_heads, num_pages, page_size, {d}]",
            py_shape(&k.shape),
            py_shape(&v.shape)
        )));
    }
    if hkv == 0 || h % hkv != 0 {
        return Err(bad(format!(
            "k_cache: {hkv} kv heads do not divide the query's {h} heads"
        )));
    }
    if table.shape[0] != b || lens.shape != [b] {
        return Err(bad(format!(
            "block_table/context_lens: shapes {}/{} do not match the query's batch of {b}",
            py_shape(&table.shape),
            py_shape(&lens.shape)
        )));
    }
    let (table, lens) = (table.contiguous()?, lens.contiguous()?);
    let max_pages = table.shape[1];
    kernels::check_block_tables(table.i32s(), lens.i32s(), max_pages, ps, pages).map_err(bad)?;
    if q.numel() == 0 || k.numel() == 0 || max_pages == 0 {
        // No queries, or no tokens (the check above allows only empty contexts).
        return Ok(vec![zeros(&q, &q.shape)?]);
    }
    let out = q.empty(&q.shape)?;
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let params = [
        ("batch", b.to_string()),
        ("heads", h.to_string()),
        ("kv_heads", hkv.to_string()),
        ("head_dim", d.to_string()),
        ("page_size", ps.to_string()),
        ("num_pages", pages.to_string()),
        ("max_pages", max_pages.to_string()),
        ("scale", format!("{scale:?}")),
        ("dtype", q.dtype_name().to_string()),
    ];
    // The kernel's order: the scalar-prefetch operands first.
    let inputs = [
        table.buffer(&table.shape),
        lens.buffer(&lens.shape),
        q.buffer(&q.shape),
        k.buffer(&k.shape),
        v.buffer(&v.shape),
    ];
    let outputs = [(out.data(), q.shape.clone(), q.dtype_name().to_string())];
    launch("paged_attention", &params, &inputs, &outputs)?;
    Ok(vec![out])
}

/// Checked varlen attention arguments (packed `[heads, tokens, head_dim]` q/k/v and
/// int32 offsets, checked before anything runs) and the kernel parameters.
struct Varlen {
    q: Arg,
    k: Arg,
    v: Arg,
    cu_q: Arg,
    cu_k: Arg,
    params: Vec<(&'static str, String)>,
}

impl Varlen {
    /// Reads `q, k, v`, then (after `grad_out` for the backward, read by the caller
    /// through `between`) the offsets, `is_causal` and `scale`.
    fn new(
        a: &mut Args,
        between: impl FnOnce(&mut Args, &Arg) -> Result<(), OpError>,
    ) -> Result<Varlen, OpError> {
        let q = a.tensor("query")?.rank(3)?;
        let k = a.tensor("key")?.rank(3)?.same_dtype(&q)?;
        let v = a.tensor("value")?.rank(3)?.same_dtype(&q)?;
        if q.dtype_name() == "f16" {
            return Err(bad(
                "query: varlen_attention takes float32 or bfloat16, got torch.float16".into(),
            ));
        }
        let (h, tq, d) = (q.shape[0], q.shape[1], q.shape[2]);
        if k.shape != v.shape || k.shape[2] != d {
            return Err(bad(format!(
                "key/value: shapes {}/{} must be equal [kv_heads, total_k, {d}]",
                py_shape(&k.shape),
                py_shape(&v.shape)
            )));
        }
        let (hkv, tk) = (k.shape[0], k.shape[1]);
        check_heads(h, hkv, d)?;
        between(a, &q)?;
        let offsets = |a: &mut Args, name| {
            Arg::int32(a.0.next().unwrap_or(Value::None), name)?
                .rank(1)?
                .contiguous()
        };
        let cu_q = offsets(a, "cu_seqlens_q")?;
        let cu_k = offsets(a, "cu_seqlens_k")?;
        if cu_q.shape != cu_k.shape || cu_q.shape[0] == 0 {
            return Err(bad(format!(
                "cu_seqlens_q/cu_seqlens_k: shapes {}/{} must be equal (batch + 1,)",
                py_shape(&cu_q.shape),
                py_shape(&cu_k.shape)
            )));
        }
        let batch = cu_q.shape[0] - 1;
        kernels::check_cu_seqlens("cu_seqlens_q", cu_q.i32s(), batch, tq).map_err(bad)?;
        kernels::check_cu_seqlens("cu_seqlens_k", cu_k.i32s(), batch, tk).map_err(bad)?;
        let causal = a.flag();
        let mut params = vec![
            ("batch", batch.to_string()),
            ("heads", h.to_string()),
            ("kv_heads", hkv.to_string()),
            ("total_q", tq.to_string()),
            ("total_k", tk.to_string()),
            ("head_dim", d.to_string()),
            ("causal", causal.to_string()),
            ("dtype", q.dtype_name().to_string()),
        ];
        // The kernel's default scale is 1/sqrt(head_dim): given only when the caller set
        // one, so the problem is the one `tessera tune` stores.
        if let Some(scale) = a.float("scale")? {
            params.push(("scale", format!("{scale:?}")));
        }
        Ok(Varlen {
            q,
            k,
            v,
            cu_q,
            cu_k,
            params,
        })
    }

    fn empty(&self) -> bool {
        self.q.numel() == 0 || self.k.numel() == 0
    }

    fn lse_shape(&self) -> [u64; 3] {
        [self.q.shape[0], self.q.shape[1], 1]
    }

    /// q, k and v made contiguous.
    fn into_contiguous(self) -> Result<Varlen, OpError> {
        Ok(Varlen {
            q: self.q.contiguous()?,
            k: self.k.contiguous()?,
            v: self.v.contiguous()?,
            ..self
        })
    }

    /// The kernel's inputs: `q, k, v`, then `extra`, then the offsets (`self` contiguous).
    fn buffers(&self, extra: &[&Arg]) -> Vec<Buffer> {
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let mut b = vec![q.buffer(&q.shape), k.buffer(&k.shape), v.buffer(&v.shape)];
        b.extend(extra.iter().map(|a| a.buffer(&a.shape)));
        b.extend([
            self.cu_q.buffer(&self.cu_q.shape),
            self.cu_k.buffer(&self.cu_k.shape),
        ]);
        b
    }
}

fn varlen_attention_fwd(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let att = Varlen::new(&mut Args(args.into_iter()), |_, _| Ok(()))?;
    let lse_shape = att.lse_shape();
    if att.empty() {
        return no_keys(&att.q, &lse_shape);
    }
    let lse = Tensor::empty(&lse_shape, torch().f32).map_err(OpError::NoMemory)?;
    let out = att.q.empty(&att.q.shape)?;
    let att = att.into_contiguous()?;
    let outputs = [
        (
            out.data(),
            att.q.shape.clone(),
            att.q.dtype_name().to_string(),
        ),
        (lse.data(), lse_shape.to_vec(), "f32".to_string()),
    ];
    launch("varlen_attention", &att.params, &att.buffers(&[]), &outputs)?;
    Ok(vec![out, lse])
}

fn varlen_attention(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut outs = varlen_attention_fwd(args)?;
    outs.truncate(1);
    Ok(outs)
}

fn varlen_attention_bwd(args: Vec<Value>) -> Result<Vec<Tensor>, OpError> {
    let mut a = Args(args.into_iter());
    let mut grad = None;
    let att = Varlen::new(&mut a, |a, q| {
        let g = a.tensor("grad_out")?.rank(3)?;
        if g.shape != q.shape {
            return Err(bad(format!(
                "grad_out: shape {} differs from query's {}",
                py_shape(&g.shape),
                py_shape(&q.shape)
            )));
        }
        grad = Some(g);
        Ok(())
    })?;
    let saved = saved_forward(&mut a, &att.q, &att.lse_shape())?;
    if att.empty() {
        return gradients_like([&att.q, &att.k, &att.v], true);
    }
    let grads = gradients_like([&att.q, &att.k, &att.v], false)?;
    let grad = grad_like(grad.expect("read by Varlen::new"), &att.q)?;
    let att = att.into_contiguous()?;
    let mut inputs = att.buffers(&[&grad]);
    if let Some((out, lse)) = &saved {
        inputs.extend([out.buffer(&out.shape), lse.buffer(&lse.shape)]);
    }
    let outputs: Vec<Buffer> = grads
        .iter()
        .zip([&att.q, &att.k, &att.v])
        .map(|(g, t)| (g.data(), t.shape.clone(), t.dtype_name().to_string()))
        .collect();
    launch("varlen_attention_bwd", &att.params, &inputs, &outputs)?;
    Ok(grads)
}

/// `a` converted to `like`'s dtype (PyTorch's copy converts).
fn convert(a: Arg, like: &Arg) -> Result<Arg, OpError> {
    let copy = like.empty(&a.shape)?;
    copy.copy_from(&a.tensor).map_err(OpError::Failed)?;
    Ok(Arg {
        tensor: copy,
        dtype: like.dtype,
        ..a
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every schema argument has a type the kernels read.
    #[test]
    fn every_schema_argument_type_is_read() {
        for (i, op) in OPS.iter().enumerate() {
            assert!(
                arg_types(i).is_some(),
                "{}: {:?}",
                op.schema,
                op.parse_arg_types()
            );
        }
    }
}
