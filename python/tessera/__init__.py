"""Tessera kernels as PyTorch ops: ``torch.ops.tessera.*``.

Importing this package registers the ops with ``torch.library.custom_op``: a CPU
implementation that runs the Tessera kernel (native > XLA > interpreter, see
``tessera.explain``), a fake (meta) implementation for ``torch.compile``, and autograd
for attention (through the FlashAttention backward kernels).

    import torch, tessera
    y = torch.ops.tessera.softmax(x)
    with tessera.backend("interp"):
        o = torch.ops.tessera.flash_attention(q, k, v, is_causal=True)
"""

import contextlib
import math
import threading
from typing import Optional

import torch

from . import _tessera

__all__ = ["backend", "disable_sdpa_override", "enable_sdpa_override", "explain",
           "explain_graph", "export", "graph_stats", "load_library", "reset_graph_stats"]

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_state = threading.local()


def _backend() -> str:
    return getattr(_state, "backend", "auto")


@contextlib.contextmanager
def backend(name: str):
    """Forces a backend (``interp``, ``xla``, ``native`` or ``auto``) inside the block."""
    if name not in ("interp", "xla", "native", "auto"):
        raise ValueError(f"backend: expected interp, xla, native or auto, got {name!r}")
    previous = _backend()
    _state.backend = name
    try:
        yield
    finally:
        _state.backend = previous


def explain(kernel: str, **params) -> tuple:
    """The backend ``kernel`` would run on with these parameters, and why better
    backends were skipped: ``(backend, [reasons])``."""
    return _tessera.explain(kernel, [f"{k}={v}" for k, v in params.items()], _backend())


def _check(t: torch.Tensor, name: str, rank: Optional[int] = None, dtype: Optional[torch.dtype] = None,
           min_rank: int = 0) -> str:
    """Checks one tensor argument (type, device, dtype, rank); returns its dtype name."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: tessera ops run on CPU tensors, got device {t.device}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (float32, bfloat16, float16)")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from the first argument's {dtype}")
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank}, got shape {tuple(t.shape)}")
    if t.dim() < min_rank:
        raise ValueError(f"{name}: expected at least {min_rank} dimension(s), got shape {tuple(t.shape)}")
    return _DTYPES[t.dtype]


def _same_device(**tensors) -> None:
    """Checks that the tensor arguments share one device (fake kernels see meta and CPU
    tensors mixed, which must not produce a result)."""
    devices = {t.device for t in tensors.values() if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in tensors.items() if isinstance(t, torch.Tensor))
        raise ValueError(f"tensor arguments are on different devices: {where}")


def _check_eps(eps: float) -> None:
    if not math.isfinite(eps):
        raise ValueError(f"eps: expected a finite number, got {eps}")


def _empty(like: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def _buffer(t: torch.Tensor, dt: str, shape=None):
    return (t.data_ptr(), list(shape if shape is not None else t.shape), dt)


def _run(kernel: str, params: dict, inputs, outputs) -> None:
    """Runs ``kernel`` on contiguous ``inputs`` [(tensor, shape)] into ``outputs``."""
    _tessera.run(
        kernel,
        [f"{k}={v}" for k, v in params.items()],
        [_buffer(t, _DTYPES[t.dtype], s) for t, s in inputs],
        [_buffer(t, _DTYPES[t.dtype], s) for t, s in outputs],
        _backend(),
    )


def _rows(x: torch.Tensor):
    cols = x.shape[-1]
    return x.numel() // cols if cols else 0, cols


# ---- element-wise and row-wise ops -------------------------------------------------


@torch.library.custom_op("tessera::softmax", mutates_args=())
def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension."""
    dt = _check(x, "x", min_rank=1)
    if x.numel() == 0:
        return _empty(x)
    x = x.contiguous()
    out = torch.empty_like(x)
    rows, cols = _rows(x)
    _run("softmax", {"rows": rows, "cols": cols, "dtype": dt}, [(x, [rows, cols])], [(out, [rows, cols])])
    return out


@softmax.register_fake
def _(x):
    return _empty(x)


@torch.library.custom_op("tessera::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""
    dt = _check(x, "x", min_rank=1)
    _check(weight, "weight", rank=1, dtype=x.dtype)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight: expected {x.shape[-1]} elements, got {weight.shape[0]}")
    _check_eps(eps)
    if x.numel() == 0:
        return _empty(x)
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    rows, cols = _rows(x)
    params = {"rows": rows, "cols": cols, "dtype": dt, "eps": eps}
    _run("rms_norm", params, [(x, [rows, cols]), (weight, [cols])], [(out, [rows, cols])])
    return out


@rms_norm.register_fake
def _(x, weight, eps=1e-5):
    _same_device(x=x, weight=weight)
    return _empty(x)


@torch.library.custom_op("tessera::layer_norm", mutates_args=())
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension."""
    dt = _check(x, "x", min_rank=1)
    for name, v in (("weight", weight), ("bias", bias)):
        _check(v, name, rank=1, dtype=x.dtype)
        if v.shape[0] != x.shape[-1]:
            raise ValueError(f"{name}: expected {x.shape[-1]} elements, got {v.shape[0]}")
    _check_eps(eps)
    if x.numel() == 0:
        return _empty(x)
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    out = torch.empty_like(x)
    rows, cols = _rows(x)
    params = {"rows": rows, "cols": cols, "dtype": dt, "eps": eps}
    _run("layer_norm", params, [(x, [rows, cols]), (weight, [cols]), (bias, [cols])], [(out, [rows, cols])])
    return out


@layer_norm.register_fake
def _(x, weight, bias, eps=1e-5):
    _same_device(x=x, weight=weight, bias=bias)
    return _empty(x)


@torch.library.custom_op("tessera::swiglu", mutates_args=())
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, fused."""
    dt = _check(gate, "gate", min_rank=1)
    _check(up, "up", dtype=gate.dtype)
    if gate.shape != up.shape:
        raise ValueError(f"up: shape {tuple(up.shape)} differs from gate's {tuple(gate.shape)}")
    if gate.numel() == 0:
        return _empty(gate)
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    rows, cols = _rows(gate)
    params = {"rows": rows, "cols": cols, "dtype": dt}
    _run("swiglu", params, [(gate, [rows, cols]), (up, [rows, cols])], [(out, [rows, cols])])
    return out


@swiglu.register_fake
def _(gate, up):
    _same_device(gate=gate, up=up)
    return _empty(gate)


@torch.library.custom_op("tessera::matmul", mutates_args=())
def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x @ y`` for 2-D tensors, f32 accumulation."""
    dt = _check(x, "x", rank=2)
    _check(y, "y", rank=2, dtype=x.dtype)
    if x.shape[1] != y.shape[0]:
        raise ValueError(f"y: expected {x.shape[1]} rows to match x, got shape {tuple(y.shape)}")
    m, k = x.shape
    n = y.shape[1]
    if m * n * k == 0:
        return torch.zeros((m, n), dtype=x.dtype)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty((m, n), dtype=x.dtype)
    _run("matmul", {"m": m, "k": k, "n": n, "dtype": dt}, [(x, [m, k]), (y, [k, n])], [(out, [m, n])])
    return out


@matmul.register_fake
def _(x, y):
    _same_device(x=x, y=y)
    return x.new_empty((x.shape[0], y.shape[1]))


@torch.library.custom_op("tessera::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Llama rotate-half) of ``x: [batch, heads, seq, head_dim]``."""
    dt = _check(x, "x", rank=4)
    b, h, s, d = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        _check(t, name, rank=2, dtype=x.dtype)
        if tuple(t.shape) != (s, d):
            raise ValueError(f"{name}: expected shape {(s, d)}, got {tuple(t.shape)}")
    if d % 2:
        raise ValueError(f"x: rotary embedding needs an even head_dim, got {d}")
    if x.numel() == 0:
        return _empty(x)
    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    params = {"batch": b, "heads": h, "seq": s, "head_dim": d, "dtype": dt}
    _run("rope", params, [(x, list(x.shape)), (cos, [s, d]), (sin, [s, d])], [(out, list(x.shape))])
    return out


@rope.register_fake
def _(x, cos, sin):
    _same_device(x=x, cos=cos, sin=sin)
    return _empty(x)


# ---- autograd of the non-attention ops ---------------------------------------------


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


_REFERENCES = {
    softmax: (1, lambda x: torch.softmax(x, -1)),
    rms_norm: (2, lambda x, w, eps=1e-5: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w),
    layer_norm: (3, lambda x, w, b, eps=1e-5: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)),
    swiglu: (2, lambda a, b: torch.nn.functional.silu(a) * b),
    rope: (3, lambda x, cos, sin: x * cos + _rotate_half(x) * sin),
}


def _register_reference_autograd(op, n_tensors, reference):
    """Backward of `op` by differentiating its plain PyTorch math (f32) on the saved inputs."""

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:n_tensors])
        ctx.rest = inputs[n_tensors:]

    def backward(ctx, grad):
        saved = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().float().requires_grad_() for t in saved]
            out = reference(*leaves, *ctx.rest)
            grads = torch.autograd.grad(out, leaves, grad.float())
        return (*[g.to(t.dtype) for g, t in zip(grads, saved)], *([None] * len(ctx.rest)))

    op.register_autograd(backward, setup_context=setup)


for _op, (_n, _reference) in _REFERENCES.items():
    _register_reference_autograd(_op, _n, _reference)


def _matmul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx, grad):
    x, y = ctx.saved_tensors
    grad = grad.to(x.dtype)
    return torch.ops.tessera.matmul(grad, y.t()), torch.ops.tessera.matmul(x.t(), grad)


matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


# ---- attention -----------------------------------------------------------------------


def _attention_params(q, k, v, is_causal, scale):
    dt = _check(q, "query", rank=4)
    _check(k, "key", rank=4, dtype=q.dtype)
    _check(v, "value", rank=4, dtype=q.dtype)
    if q.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"query: flash_attention takes float32 or bfloat16, got {q.dtype}")
    b, h, sq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or k.shape != v.shape:
        raise ValueError(f"key/value: shapes {tuple(k.shape)}/{tuple(v.shape)} do not match query {tuple(q.shape)}")
    hkv, sk = k.shape[1], k.shape[2]
    if hkv == 0 or h % hkv:
        raise ValueError(f"key: {hkv} heads do not divide the query's {h} heads")
    if d == 0:
        raise ValueError("query: head_dim must be at least 1")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    return {
        "batch": b, "heads": h, "kv_heads": hkv, "q_len": sq, "kv_len": sk, "head_dim": d,
        "causal": "true" if is_causal else "false", "scale": repr(scale), "dtype": dt,
    }


@torch.library.custom_op("tessera::flash_attention_fwd", mutates_args=())
def flash_attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output and its log-sum-exp ``[batch, heads, q_len, 1]`` (f32)."""
    params = _attention_params(q, k, v, is_causal, scale)
    if q.numel() == 0 or k.numel() == 0:
        # No keys: the output is zero and the log-sum-exp -inf (as PyTorch's SDPA).
        return (torch.zeros(q.shape, dtype=q.dtype),
                torch.full((*q.shape[:3], 1), -math.inf, dtype=torch.float32))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty((*q.shape[:3], 1), dtype=torch.float32)
    _run("flash_attention", params, [(q, list(q.shape)), (k, list(k.shape)), (v, list(v.shape))],
         [(out, list(out.shape)), (lse, list(lse.shape))])
    return out, lse


@flash_attention_fwd.register_fake
def _(q, k, v, is_causal, scale):
    _same_device(query=q, key=k, value=v)
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((*q.shape[:3], 1), dtype=torch.float32)


@torch.library.custom_op("tessera::flash_attention_bwd", mutates_args=())
def flash_attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of attention for an output gradient."""
    params = _attention_params(q, k, v, is_causal, scale)
    _check(grad_out, "grad_out", rank=4)
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out: shape {tuple(grad_out.shape)} differs from query's {tuple(q.shape)}")
    if q.numel() == 0 or k.numel() == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous().to(q.dtype)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _run("flash_attention_bwd", params,
         [(q, list(q.shape)), (k, list(k.shape)), (v, list(v.shape)), (grad_out, list(q.shape))],
         [(dq, list(q.shape)), (dk, list(k.shape)), (dv, list(v.shape))])
    return dq, dk, dv


@flash_attention_bwd.register_fake
def _(q, k, v, grad_out, is_causal, scale):
    _same_device(query=q, key=k, value=v, grad_out=grad_out)
    return (torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _fwd_setup(ctx, inputs, output):
    q, k, v, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v)
    ctx.is_causal, ctx.scale = is_causal, scale


def _fwd_backward(ctx, grad_out, grad_lse):
    q, k, v = ctx.saved_tensors
    dq, dk, dv = torch.ops.tessera.flash_attention_bwd(q, k, v, grad_out, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None


flash_attention_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


@torch.library.custom_op("tessera::flash_attention", mutates_args=())
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: Optional[float] = None) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` with GQA by head
    count: ``q: [batch, heads, q_len, d]``, ``k, v: [batch, kv_heads, kv_len, d]``."""
    _attention_params(q, k, v, is_causal, scale)
    d = q.shape[-1]
    return torch.ops.tessera.flash_attention_fwd(q, k, v, is_causal, 1.0 / math.sqrt(d) if scale is None else scale)[0]


@flash_attention.register_fake
def _(q, k, v, is_causal=False, scale=None):
    _same_device(query=q, key=k, value=v)
    return _empty(q)


def _attn_setup(ctx, inputs, output):
    q, k, v, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v)
    ctx.is_causal = is_causal
    ctx.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _attn_backward(ctx, grad_out):
    q, k, v = ctx.saved_tensors
    dq, dk, dv = torch.ops.tessera.flash_attention_bwd(q, k, v, grad_out, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None


flash_attention.register_autograd(_attn_backward, setup_context=_attn_setup)


# ---- scaled_dot_product_attention override ---------------------------------------

_original_sdpa = None


def _sdpa_supported(query, key, value, attn_mask, dropout_p, scale, enable_gqa):
    """Why this SDPA call cannot go to tessera, or None when it can."""
    tensors = (query, key, value)
    if attn_mask is not None:
        return "attn_mask is not supported"
    if dropout_p:
        return "dropout is not supported"
    if any(t.device.type != "cpu" for t in tensors):
        return "not a CPU call"
    if any(t.dim() != 4 for t in tensors) or query.dtype not in (torch.float32, torch.bfloat16):
        return "needs 4-D float32 or bfloat16 tensors"
    if any(t.dtype != query.dtype for t in tensors):
        return "mixed dtypes"
    if key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        return "head counts differ without enable_gqa"
    if query.shape[-1] > 256 or key.shape != value.shape:
        return "head dim above 256 or key/value shapes differ"
    return None


def enable_sdpa_override():
    """Routes CPU `torch.nn.functional.scaled_dot_product_attention` calls that tessera
    supports to `torch.ops.tessera.flash_attention`; every other call (masks, dropout,
    other devices or dtypes) goes to PyTorch's own kernel."""
    global _original_sdpa
    if _original_sdpa is not None:
        return
    _original_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _sdpa_supported(query, key, value, attn_mask, dropout_p, scale, enable_gqa) is None:
            return torch.ops.tessera.flash_attention(query, key, value, is_causal, scale)
        return _original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = sdpa


def disable_sdpa_override():
    """Restores PyTorch's own `scaled_dot_product_attention`."""
    global _original_sdpa
    if _original_sdpa is not None:
        torch.nn.functional.scaled_dot_product_attention = _original_sdpa
        _original_sdpa = None


# ---- user op libraries: tessera.load_library(path) ----------------------------------

from .library import load_library  # noqa: E402

# ---- graph mode: torch.compile(model, backend="tessera") ----------------------------

from .graph import explain_graph, export, graph_stats, reset_graph_stats, tessera_backend  # noqa: E402


def _register_backend():
    """Registers the Dynamo backend ``tessera`` (unless Dynamo found the package's
    ``torch_dynamo_backends`` entry point, through which it registers it itself)."""
    from torch._dynamo.backends import registry

    if "tessera" not in registry._COMPILER_FNS and registry._BACKENDS.get("tessera") is None:
        registry.register_backend(tessera_backend, name="tessera")


_register_backend()
