//! Tessera kernels called on `tch::Tensor`s: the Rust twin of `torch.ops.tessera.*`.
//!
//! Each op checks its tensors (device, dtype, rank, shape) and says which argument is
//! wrong, runs the library kernel on the best backend that can take it (native > XLA >
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
use kernels::Params;
use runtime::Backend;
use tch::{Device, Kind, Tensor};

/// Why an op could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor argument that the op cannot take (named).
    #[error("{arg}: {problem}")]
    BadArgument {
        /// The argument's name.
        arg: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The kernel failed to build or run.
    #[error("{kernel}: {message}")]
    Kernel {
        /// The library kernel.
        kernel: &'static str,
        /// The error.
        message: String,
    },
}

fn bad(arg: &'static str, problem: impl Into<String>) -> Error {
    Error::BadArgument {
        arg,
        problem: problem.into(),
    }
}

/// The Tessera dtype of a float tensor on the CPU.
fn float_dtype(arg: &'static str, t: &Tensor) -> Result<DType, Error> {
    if t.device() != Device::Cpu {
        return Err(bad(
            arg,
            format!("expected a CPU tensor, got {:?}", t.device()),
        ));
    }
    match t.kind() {
        Kind::Float => Ok(DType::F32),
        Kind::BFloat16 => Ok(DType::BF16),
        Kind::Half => Ok(DType::F16),
        k => Err(bad(
            arg,
            format!("expected float32, bfloat16 or float16, got {k:?}"),
        )),
    }
}

fn shape(t: &Tensor) -> Vec<u64> {
    t.size().iter().map(|&d| d as u64).collect()
}

fn check_rank(arg: &'static str, t: &Tensor, rank: usize) -> Result<(), Error> {
    if t.dim() != rank {
        return Err(bad(
            arg,
            format!("expected rank {rank}, got shape {:?}", t.size()),
        ));
    }
    Ok(())
}

fn same_kind(arg: &'static str, t: &Tensor, like: &Tensor) -> Result<(), Error> {
    if t.kind() != like.kind() {
        return Err(bad(
            arg,
            format!("expected {:?}, got {:?}", like.kind(), t.kind()),
        ));
    }
    Ok(())
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
    name: &'static str,
    params: &[String],
    inputs: &[(&Tensor, TensorType)],
    backend: Backend,
) -> Result<(Vec<Tensor>, Backend), Error> {
    let (k, p) = library(name, params)?;
    let built = k.build(&p).map_err(|e| kernel_error(name, e))?;
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
    let (out, used) = run_library(k, &p, &arrays, backend)?;
    Ok((out.iter().map(tensor).collect(), used))
}

fn rows_cols(t: &Tensor) -> (u64, u64) {
    let s = shape(t);
    let cols = s.last().copied().unwrap_or(1);
    (s.iter().product::<u64>() / cols.max(1), cols)
}

/// Softmax over the last dimension.
pub fn softmax(x: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    let dt = float_dtype("x", x)?;
    let (rows, cols) = rows_cols(x);
    let params = [
        format!("rows={rows}"),
        format!("cols={cols}"),
        format!("dtype={dt}"),
    ];
    let input = (x, TensorType::new(dt, [rows, cols]));
    let (out, _) = call("softmax", &params, &[input], backend)?;
    Ok(out[0].view(x.size().as_slice()))
}

/// RMSNorm over the last dimension with a `[cols]` weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, backend: Backend) -> Result<Tensor, Error> {
    norm("rms_norm", x, &[("weight", weight)], eps, backend)
}

/// LayerNorm over the last dimension with `[cols]` weight and bias.
pub fn layer_norm(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    backend: Backend,
) -> Result<Tensor, Error> {
    norm(
        "layer_norm",
        x,
        &[("weight", weight), ("bias", bias)],
        eps,
        backend,
    )
}

/// A row-wise norm of `x` with `[cols]` parameter vectors (named for errors).
fn norm(
    name: &'static str,
    x: &Tensor,
    vectors: &[(&'static str, &Tensor)],
    eps: f64,
    backend: Backend,
) -> Result<Tensor, Error> {
    let dt = float_dtype("x", x)?;
    let (rows, cols) = rows_cols(x);
    let mut inputs = vec![(x, TensorType::new(dt, [rows, cols]))];
    for &(arg, t) in vectors {
        same_kind(arg, t, x)?;
        if shape(t) != [cols] {
            return Err(bad(
                arg,
                format!("expected shape [{cols}], got {:?}", t.size()),
            ));
        }
        inputs.push((t, TensorType::new(dt, [cols])));
    }
    let params = [
        format!("rows={rows}"),
        format!("cols={cols}"),
        format!("dtype={dt}"),
        format!("eps={eps:e}"),
    ];
    let (out, _) = call(name, &params, &inputs, backend)?;
    Ok(out[0].view(x.size().as_slice()))
}

/// SwiGLU: `silu(gate) * up`, element-wise over equal shapes.
pub fn swiglu(gate: &Tensor, up: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    let dt = float_dtype("gate", gate)?;
    same_kind("up", up, gate)?;
    if up.size() != gate.size() {
        return Err(bad(
            "up",
            format!("expected shape {:?}, got {:?}", gate.size(), up.size()),
        ));
    }
    let (rows, cols) = rows_cols(gate);
    let params = [
        format!("rows={rows}"),
        format!("cols={cols}"),
        format!("dtype={dt}"),
    ];
    let ty = TensorType::new(dt, [rows, cols]);
    let (out, _) = call("swiglu", &params, &[(gate, ty.clone()), (up, ty)], backend)?;
    Ok(out[0].view(gate.size().as_slice()))
}

/// Rotary embedding (Llama rotate-half) of `x: [batch, heads, seq, head_dim]` with
/// `cos`, `sin: [seq, head_dim]`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    let dt = float_dtype("x", x)?;
    check_rank("x", x, 4)?;
    let s = shape(x);
    for (arg, t) in [("cos", cos), ("sin", sin)] {
        same_kind(arg, t, x)?;
        if shape(t) != [s[2], s[3]] {
            return Err(bad(
                arg,
                format!("expected shape [{}, {}], got {:?}", s[2], s[3], t.size()),
            ));
        }
    }
    if !s[3].is_multiple_of(2) {
        return Err(bad("x", format!("head_dim {} is odd", s[3])));
    }
    let params = [
        format!("batch={}", s[0]),
        format!("heads={}", s[1]),
        format!("seq={}", s[2]),
        format!("head_dim={}", s[3]),
        format!("dtype={dt}"),
    ];
    let table = TensorType::new(dt, [s[2], s[3]]);
    let inputs = [
        (x, TensorType::new(dt, s)),
        (cos, table.clone()),
        (sin, table),
    ];
    let (out, _) = call("rope", &params, &inputs, backend)?;
    Ok(out[0].shallow_clone())
}

/// `a @ b` for `[m, k]` and `[k, n]` matrices.
pub fn matmul(a: &Tensor, b: &Tensor, backend: Backend) -> Result<Tensor, Error> {
    let dt = float_dtype("a", a)?;
    same_kind("b", b, a)?;
    check_rank("a", a, 2)?;
    check_rank("b", b, 2)?;
    let (sa, sb) = (shape(a), shape(b));
    if sa[1] != sb[0] {
        return Err(bad(
            "b",
            format!(
                "expected {} rows to match a {:?}, got {:?}",
                sa[1],
                a.size(),
                b.size()
            ),
        ));
    }
    let params = [
        format!("m={}", sa[0]),
        format!("k={}", sa[1]),
        format!("n={}", sb[1]),
        format!("dtype={dt}"),
    ];
    let inputs = [(a, TensorType::new(dt, sa)), (b, TensorType::new(dt, sb))];
    let (out, _) = call("matmul", &params, &inputs, backend)?;
    Ok(out[0].to_kind(a.kind()))
}

/// The parameters of a flash-attention call, or why Tessera's kernel cannot take it.
fn attention_params(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: Option<f64>,
) -> Result<Vec<String>, Error> {
    let dt = float_dtype("q", q)?;
    if !matches!(dt, DType::F32 | DType::BF16) {
        return Err(bad(
            "q",
            format!(
                "flash attention takes float32 or bfloat16, got {:?}",
                q.kind()
            ),
        ));
    }
    for (arg, t) in [("q", q), ("k", k), ("v", v)] {
        check_rank(arg, t, 4)?;
        same_kind(arg, t, q)?;
    }
    let (sq, sk) = (shape(q), shape(k));
    if sk[0] != sq[0] || sk[3] != sq[3] || k.size() != v.size() {
        return Err(bad(
            "k",
            format!(
                "shapes k {:?} / v {:?} do not match q {:?}",
                k.size(),
                v.size(),
                q.size()
            ),
        ));
    }
    if sk[1] == 0 || sq[1] % sk[1] != 0 {
        return Err(bad(
            "k",
            format!("{} kv heads do not divide the {} query heads", sk[1], sq[1]),
        ));
    }
    let scale = scale.unwrap_or(1.0 / (sq[3] as f64).sqrt());
    Ok(vec![
        format!("batch={}", sq[0]),
        format!("heads={}", sq[1]),
        format!("kv_heads={}", sk[1]),
        format!("q_len={}", sq[2]),
        format!("kv_len={}", sk[2]),
        format!("head_dim={}", sq[3]),
        format!("causal={causal}"),
        format!("scale={scale:e}"),
        format!("dtype={dt}"),
    ])
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
    attention(q, k, v, causal, scale, backend).map(|(o, lse, _)| (o, lse))
}

fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: Option<f64>,
    backend: Backend,
) -> Result<(Tensor, Tensor, Backend), Error> {
    let params = attention_params(q, k, v, causal, scale)?;
    let dt = float_dtype("q", q)?;
    let typed = |t: &Tensor| TensorType::new(dt, shape(t));
    let inputs = [(q, typed(q)), (k, typed(k)), (v, typed(v))];
    let (mut out, used) = call("flash_attention", &params, &inputs, backend)?;
    let lse = out.pop().expect("flash attention returns o and lse");
    Ok((
        out.pop().expect("flash attention returns o and lse"),
        lse.to_kind(Kind::Float),
        used,
    ))
}

/// Which kernel ran an [`sdpa`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaPath {
    /// Tessera's flash attention on this backend.
    Tessera(Backend),
    /// PyTorch's own kernel (the call was not one Tessera supports).
    PyTorch,
}

/// `scaled_dot_product_attention` on CPU: Tessera's flash attention when it supports the
/// call (no mask, no dropout, f32/bf16 CPU tensors of rank 4, heads divisible), PyTorch's
/// kernel otherwise.
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    dropout_p: f64,
    causal: bool,
    scale: Option<f64>,
) -> (Tensor, SdpaPath) {
    if attn_mask.is_none() && dropout_p == 0.0 {
        if let Ok((out, _, used)) = attention(q, k, v, causal, scale, Backend::Auto) {
            return (out, SdpaPath::Tessera(used));
        }
    }
    let gqa = q.dim() == 4 && k.dim() == 4 && q.size()[1] != k.size()[1];
    let out =
        Tensor::scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, causal, scale, gqa);
    (out, SdpaPath::PyTorch)
}
