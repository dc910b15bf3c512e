//! Tessera kernels called on `tch::Tensor`s: the Rust twin of `torch.ops.tessera.*`.
//!
//! Each op is the library's torch op of the same name (`kernels::OpSpec`): the same
//! checks, with the same messages naming the argument that is wrong, and the same
//! kernel parameters. It runs the library kernel on the best backend that can take it (native > XLA >
//! interpreter, or the one asked for), and returns new tensors. [`sdpa`] is the
//! hand-tuned kernel beside PyTorch's own: it uses Tessera when the call is supported and
//! `Tensor::scaled_dot_product_attention` otherwise.
//!
//! A single-kernel op on f32 tensors that runs natively reads and writes the tensors'
//! storage in place; other calls (bf16/f16, the XLA or interpreter backends) copy
//! through host arrays. Non-contiguous inputs are read through `contiguous()`.
//!
//! ```no_run
//! # use runtime::Backend;
//! # use tch::{Device, Kind, Tensor};
//! # fn main() -> Result<(), aten_bindings::Error> {
//! # let q = Tensor::randn([1, 4, 32, 16], (Kind::Float, Device::Cpu));
//! # let (k, v) = (q.shallow_clone(), q.shallow_clone());
//! let (out, lse) = aten_bindings::flash_attention(&q, &k, &v, true, None, Backend::Auto)?;
//! let (out, path) = aten_bindings::sdpa(&q, &k, &v, None, 0.0, true, None); // path: Tessera(..) or PyTorch
//! # Ok(())
//! # }
//! ```

use kernel_ir::{Array, ArrayData, DType, TensorType};
use kernels::torch_op::{Form, Meta, Operand, Value};
use kernels::Params;
use runtime::Backend;
use tch::{Device, Kind, Tensor};

/// Why an op could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument the op cannot take; the message names it (`x: expected rank 2, ...`),
    /// as the torch op's does.
    #[error("{0}")]
    BadArgument(String),
    /// The kernel failed to build or run.
    #[error("{kernel}: {message}")]
    Kernel {
        /// The library kernel.
        kernel: &'static str,
        /// The error.
        message: String,
    },
}

/// One argument of an op call, in schema order.
enum Arg<'a> {
    Tensor(&'a Tensor),
    Float(f64),
    Bool(bool),
    None,
}

/// PyTorch's name of a tensor's dtype (`torch.float32`).
fn dtype_name(t: &Tensor) -> String {
    let name = match t.kind() {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        Kind::Int => "int32",
        Kind::Int64 => "int64",
        Kind::Bool => "bool",
        other => return format!("{other:?}"),
    };
    format!("torch.{name}")
}

fn shape(t: &Tensor) -> Vec<u64> {
    t.size().iter().map(|&d| d as u64).collect()
}

/// What the op's checks see of the arguments (and that tensors are on the CPU).
fn values(names: &[&str], args: &[Arg]) -> Result<Vec<Value>, Error> {
    names
        .iter()
        .zip(args)
        .map(|(name, a)| match a {
            Arg::Tensor(t) if t.device() != Device::Cpu => Err(Error::BadArgument(format!(
                "{name}: tessera ops run on CPU tensors"
            ))),
            Arg::Tensor(t) => Ok(Value::Tensor(Meta {
                shape: shape(t),
                dtype: dtype_name(t),
                device: "cpu".into(),
            })),
            Arg::Float(f) => Ok(Value::Float(*f)),
            Arg::Bool(b) => Ok(Value::Bool(*b)),
            Arg::None => Ok(Value::None),
        })
        .collect()
}

/// The kernel's operand `o` of argument `t`: a score mask made additive float32 of the
/// operand's shape; data as it is, seen with the operand's type.
fn operand(t: &Tensor, o: &Operand) -> (Tensor, TensorType) {
    let ty = TensorType::new(o.dtype, o.shape.clone());
    let dims: Vec<i64> = o.shape.iter().map(|&d| d as i64).collect();
    match o.form {
        Form::ScoreMask => {
            let additive = if t.kind() == Kind::Bool {
                Tensor::zeros_like(t)
                    .to_kind(Kind::Float)
                    .masked_fill(&t.logical_not(), f64::NEG_INFINITY)
            } else {
                t.to_kind(Kind::Float)
            };
            (additive.expand(dims.as_slice(), false).contiguous(), ty)
        }
        Form::Data => (t.shallow_clone(), ty),
    }
}

/// Calls library op `name` (its [`kernels::OpSpec`]) with `args`: its results and the
/// backend that ran it.
fn call_op(
    name: &'static str,
    args: &[Arg],
    backend: Backend,
) -> Result<(Vec<Tensor>, Backend), Error> {
    let spec = kernels::torch_op(name).ok_or_else(|| kernel_error(name, "not a library op"))?;
    let names: Vec<&str> = spec.args().into_iter().map(|(_, name)| name).collect();
    let values = values(&names, args)?;
    let plan = (spec.plan)(&values).map_err(Error::BadArgument)?;
    let results: Vec<Meta> = spec.outputs.iter().map(|o| o.eval(&values)).collect();
    let kind = |m: &Meta| match m.dtype.as_str() {
        "torch.bfloat16" => Kind::BFloat16,
        "torch.float16" => Kind::Half,
        _ => Kind::Float,
    };
    let dims = |m: &Meta| m.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
    let outs = if plan.launch {
        let inputs: Vec<(Tensor, TensorType)> = plan
            .inputs
            .iter()
            .map(|o| match &args[o.arg] {
                Arg::Tensor(t) => Ok(operand(t, o)),
                _ => Err(kernel_error(name, "the plan names a missing tensor")),
            })
            .collect::<Result<_, _>>()?;
        let refs: Vec<(&Tensor, TensorType)> =
            inputs.iter().map(|(t, ty)| (t, ty.clone())).collect();
        let (k, p) = plan.library_call().map_err(|e| kernel_error(name, e))?;
        let (outs, used) = call(k, &p, &refs, backend)?;
        let outs: Vec<Tensor> = outs
            .iter()
            .zip(&results)
            .map(|(t, m)| t.view(dims(m).as_slice()).to_kind(kind(m)))
            .collect();
        (outs, used)
    } else {
        let outs: Vec<Tensor> = spec
            .outputs
            .iter()
            .zip(&results)
            .map(|(o, m)| {
                Tensor::full(
                    dims(m).as_slice(),
                    f64::from(o.empty),
                    (kind(m), Device::Cpu),
                )
            })
            .collect();
        (outs, backend)
    };
    let (mut outs, used) = outs;
    outs.truncate(spec.returns);
    Ok((outs, used))
}

/// A tensor's elements as a host array of type `ty` (same element count).
fn to_array_as(t: &Tensor, ty: TensorType) -> Array {
    let flat = t.to_kind(Kind::Float).contiguous().view(-1);
    let data = Vec::<f32>::try_from(&flat).expect("a contiguous float tensor converts");
    Array::new(ty, ArrayData::Float(data)).expect("the element count matches the shape")
}

/// A host array as a new tensor of its dtype (bf16/f16 arrays become bf16/f16 tensors).
pub fn tensor(a: &Array) -> Tensor {
    let kind = match a.dtype() {
        DType::F32 => Kind::Float,
        DType::BF16 => Kind::BFloat16,
        DType::F16 => Kind::Half,
        DType::I32 => Kind::Int,
        DType::Bool => Kind::Bool,
    };
    to_tensor(a, kind)
}

fn to_tensor(a: &Array, kind: Kind) -> Tensor {
    let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
    match a.data() {
        ArrayData::Float(v) => Tensor::from_slice(v).view(dims.as_slice()).to_kind(kind),
        ArrayData::Int(v) => Tensor::from_slice(v).view(dims.as_slice()),
        ArrayData::Bool(v) => Tensor::from_slice(v).view(dims.as_slice()),
    }
}

/// Runs library kernel `name` with `params` on `inputs`; returns its outputs and the
/// backend that ran it.
pub fn run(
    name: &'static str,
    params: &[String],
    inputs: &[Array],
    backend: Backend,
) -> Result<(Vec<Array>, Backend), Error> {
    let (k, p) = library(name, params)?;
    run_library(k, &p, inputs, backend)
}

fn library(
    name: &'static str,
    params: &[String],
) -> Result<(&'static dyn kernels::LibraryKernel, Params), Error> {
    let k = kernels::find(name).ok_or_else(|| kernel_error(name, "not a library kernel"))?;
    let p = Params::parse(k.params(), params).map_err(|e| kernel_error(name, e))?;
    Ok((k, p))
}

fn kernel_error(kernel: &'static str, message: impl ToString) -> Error {
    Error::Kernel {
        kernel,
        message: message.to_string(),
    }
}

fn run_library(
    k: &'static dyn kernels::LibraryKernel,
    p: &Params,
    inputs: &[Array],
    backend: Backend,
) -> Result<(Vec<Array>, Backend), Error> {
    let mut used = Backend::Interp;
    let out = k
        .run(p, inputs, &mut |kernel, ins| {
            let (out, resolution) = runtime::run(kernel, ins, backend)?;
            used = resolution.backend;
            Ok(out)
        })
        .map_err(|e| kernel_error(k.name(), e))?;
    Ok((out, used))
}

/// Runs library kernel `name` on tensors, each given with the array type the kernel sees
/// (same element count). A single-kernel op that runs natively on f32 tensors reads and
/// writes the tensors' storage in place; anything else goes through host arrays.
fn call(
    k: &'static dyn kernels::LibraryKernel,
    p: &Params,
    inputs: &[(&Tensor, TensorType)],
    backend: Backend,
) -> Result<(Vec<Tensor>, Backend), Error> {
    let name = k.name();
    let built = k.build(p).map_err(|e| kernel_error(name, e))?;
    if let [kernel] = built.as_slice() {
        let f32_only = kernel
            .input_types()
            .iter()
            .chain(&kernel.output_types())
            .all(|t| t.dtype == DType::F32);
        let native = runtime::resolve(backend, kernel).is_ok_and(|r| r.backend == Backend::Native);
        if f32_only && native {
            let contiguous: Vec<Tensor> = inputs.iter().map(|(t, _)| t.contiguous()).collect();
            let outputs: Vec<Tensor> = kernel
                .output_types()
                .iter()
                .map(|t| {
                    let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                    Tensor::empty(dims.as_slice(), (Kind::Float, Device::Cpu))
                })
                .collect();
            let ins: Vec<*const std::ffi::c_void> = contiguous
                .iter()
                .map(|t| t.data_ptr() as *const _)
                .collect();
            let outs: Vec<*mut std::ffi::c_void> = outputs.iter().map(Tensor::data_ptr).collect();
            // SAFETY: contiguous f32 CPU tensors of the kernel's element counts (the ops
            // check shapes), and fresh outputs of its output types.
            unsafe { runtime::native::backend().run_in_place(kernel, &ins, &outs) }
                .map_err(|e| kernel_error(name, e))?;
            return Ok((outputs, Backend::Native));
        }
    }
    let arrays: Vec<Array> = inputs
        .iter()
        .map(|(t, ty)| to_array_as(t, ty.clone()))
        .collect();
    let (out, used) = run_library(k, p, &arrays, backend)?;
    Ok((out.iter().map(tensor).collect(), used))
}

/// The one result of a single-result op.
fn single(name: &'static str, args: &[Arg], backend: Backend) -> Result<Tensor, Error> {
    let (mut outs, _) = call_op(name, args, backend)?;
    Ok(outs.remove(0))
}

/// Softmax over the last dimension.
pub fn softmax(x: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    single("softmax", &[Arg::Tensor(x)], backend)
}

/// RMSNorm over the last dimension with a `[cols]` weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, backend: Backend) -> Result<Tensor, Error> {
    let args = [Arg::Tensor(x), Arg::Tensor(weight), Arg::Float(eps)];
    single("rms_norm", &args, backend)
}

/// LayerNorm over the last dimension with `[cols]` weight and bias.
pub fn layer_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    backend: Backend,
) -> Result<Tensor, Error> {
    let args = [
        Arg::Tensor(x),
        Arg::Tensor(weight),
        Arg::Tensor(bias),
        Arg::Float(eps),
    ];
    single("layer_norm", &args, backend)
}

/// SwiGLU: `silu(gate) * up`, element-wise over equal shapes.
pub fn swiglu(gate: &Tensor, up: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    single("swiglu", &[Arg::Tensor(gate), Arg::Tensor(up)], backend)
}

/// Rotary embedding (Llama rotate-half) of `x: [batch, heads, seq, head_dim]` with
/// `cos`, `sin: [seq, head_dim]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    let args = [Arg::Tensor(x), Arg::Tensor(cos), Arg::Tensor(sin)];
    single("rope", &args, backend)
}

/// `x @ y` for `[m, k]` and `[k, n]` matrices.
pub fn matmul(x: &Tensor, y: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    single("matmul", &[Arg::Tensor(x), Arg::Tensor(y)], backend)
}

/// Flash attention `[B, H, Sq, D]` x `[B, Hkv, Skv, D]`: the output and its log-sum-exp.
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: Option<f64>,
    backend: Backend,
) -> Result<(Tensor, Tensor), Error> {
    attention(q, k, v, None, causal, scale, backend).map(|(o, lse, _)| (o, lse))
}

/// `flash_attention_fwd` (the output and its log-sum-exp) with an optional score mask,
/// and the backend that ran it.
fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
    backend: Backend,
) -> Result<(Tensor, Tensor, Backend), Error> {
    let args = [
        Arg::Tensor(q),
        Arg::Tensor(k),
        Arg::Tensor(v),
        Arg::Bool(causal),
        scale.map_or(Arg::None, Arg::Float),
        Arg::None,
        Arg::None,
        mask.map_or(Arg::None, Arg::Tensor),
    ];
    let (mut outs, used) = call_op("flash_attention_fwd", &args, backend)?;
    let lse = outs.pop().expect("flash_attention_fwd returns out and lse");
    let out = outs.pop().expect("flash_attention_fwd returns out and lse");
    Ok((out, lse, used))
}

/// Which kernel ran an [`sdpa`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaPath {
    /// Tessera's flash attention on this backend.
    Tessera(Backend),
    /// PyTorch's own kernel (the call was not one Tessera supports).
    PyTorch,
}

/// `scaled_dot_product_attention` on CPU: Tessera's flash attention when it takes the
/// call (no dropout; the checks of `torch.ops.tessera.flash_attention`: f32/bf16 CPU
/// tensors of rank 4, heads divisible, a mask the same for every head), PyTorch's kernel
/// otherwise.
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    causal: bool,
    scale: Option<f64>,
) -> (Tensor, SdpaPath) {
    if dropout_p == 0.0 && !(causal && attn_mask.is_some()) {
        if let Ok((out, _, used)) = attention(q, k, v, attn_mask, causal, scale, Backend::Auto) {
            return (out, SdpaPath::Tessera(used));
        }
    }
    let gqa = q.dim() == 4 && k.dim() == 4 && q.size()[1] != k.size()[1];
    let out =
        Tensor::scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, causal, scale, gqa);
    (out, SdpaPath::PyTorch)
}
