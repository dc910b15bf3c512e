"""Tessera kernels as PyTorch ops: ``torch.ops.tessera.*``.

Importing this package registers the ops with PyTorch's dispatcher: a CPU kernel in
the extension (Rust, registered through PyTorch's stable C interface) that runs the
Tessera kernel (native > XLA > interpreter, see ``tessera.explain``), a fake (meta)
kernel for ``torch.compile``, and autograd (attention through the FlashAttention
backward kernel, the others through PyTorch's math).

    import torch, tessera
    y = torch.ops.tessera.softmax(x)
    with tessera.backend("interp"):
        o = torch.ops.tessera.flash_attention(q, k, v, is_causal=True)
"""

import contextlib
import math
import os
import sys
import warnings
from typing import Optional

import torch

from . import _tessera, config

__all__ = [
    "backend",
    "disable_sdpa_override",
    "enable_sdpa_override",
    "explain",
    "explain_graph",
    "export",
    "graph_stats",
    "load_library",
    "OpTrace",
    "reset_graph_stats",
    "thread_pool",
    "trace_ops",
]

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


# Index tensors the ops take: int32, and int64 (PyTorch's index dtype) converted to int32
# with a range check by the CPU kernels.
_INDEX_DTYPES = (torch.int32, torch.int64)


def _backend() -> str:
    return _tessera.current_backend()


@contextlib.contextmanager
def backend(name: str):
    """Forces a backend (``interp``, ``xla``, ``native`` or ``auto``) for the ops this
    thread runs inside the block."""
    if name not in ("interp", "xla", "native", "auto"):
        raise ValueError(f"backend: expected interp, xla, native or auto, got {name!r}")
    previous = _tessera.set_backend(name)
    try:
        yield
    finally:
        _tessera.set_backend(previous)


def explain(kernel: str, **params) -> tuple:
    """The backend ``kernel`` would run on with these parameters, and why better
    backends were skipped: ``(backend, [reasons])``."""
    return _tessera.explain(kernel, [f"{k}={v}" for k, v in params.items()], _backend())


# ---- the ops: schemas and CPU kernels from the extension ------------------------------
#
# The extension holds each op's schema and its CPU kernel (Rust, registered with the
# dispatcher through PyTorch's stable C interface: an eager call runs no Python below
# autograd). Python adds what PyTorch needs in Python: fake kernels for torch.compile,
# and autograd kernels.

_lib = torch.library.Library("tessera", "DEF")
for _schema in _tessera.op_schemas():
    _lib.define(_schema)
_tessera.register_cpu_kernels(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))

# Native grids run on PyTorch's own OpenMP threads (ATen's intra-op pool, sized by
# torch.set_num_threads), which PyTorch keeps spinning between its ops: Tessera's own
# threads would compete with them for the cores. TESSERA_THREAD_POOL=tessera keeps
# Tessera's threads (for comparison).
if config.get("TESSERA_THREAD_POOL", "openmp") != "tessera":
    try:
        _tessera.use_torch_threads()
    except RuntimeError as _e:  # a PyTorch built without OpenMP: Tessera's own threads
        warnings.warn(f"tessera: native kernels use their own threads: {_e}", stacklevel=2)


def thread_pool() -> str:
    """What runs native kernels' grids with the calling thread: ``"openmp"``
    (PyTorch's intra-op threads) or ``"tessera"`` (Tessera's own)."""
    return _tessera.thread_pool()


_PYTHON_ERRORS = {"ValueError": ValueError, "IndexError": IndexError, "MemoryError": MemoryError}


def _python_error(e: RuntimeError) -> Exception:
    """The exception a native kernel's error stands for: its message starts with the
    Python exception's name (C++ exceptions reach Python as RuntimeError)."""
    kind, sep, message = str(e).partition(": ")
    error = _PYTHON_ERRORS.get(kind)
    return error(message) if sep and error else e


# ---- fake kernels (torch.compile, meta tensors) ------------------------------------


def _check(
    t: torch.Tensor, name: str, rank: Optional[int] = None, dtype: Optional[torch.dtype] = None, min_rank: int = 0
) -> None:
    """Checks one tensor argument of a fake kernel (the CPU kernels check the same)."""
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (float32, bfloat16, float16)")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: dtype {t.dtype} differs from the first argument's {dtype}")
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank}, got shape {tuple(t.shape)}")
    if t.dim() < min_rank:
        raise ValueError(f"{name}: expected at least {min_rank} dimension(s), got shape {tuple(t.shape)}")


def _same_device(**tensors) -> None:
    """Checks that the tensor arguments share one device (fake kernels see meta and CPU
    tensors mixed, which must not produce a result)."""
    devices = {t.device for t in tensors.values() if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in tensors.items() if isinstance(t, torch.Tensor))
        raise ValueError(f"tensor arguments are on different devices: {where}")


def _empty(like: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def _fake(name):
    return torch.library.register_fake(f"tessera::{name}", lib=_lib)


@_fake("softmax")
def _(x):
    _check(x, "x", min_rank=1)
    return _empty(x)


def _row_vectors(x, **vectors):
    _check(x, "x", min_rank=1)
    for name, v in vectors.items():
        _check(v, name, rank=1, dtype=x.dtype)
        if v.shape[0] != x.shape[-1]:
            raise ValueError(f"{name}: expected {x.shape[-1]} elements, got {v.shape[0]}")
    _same_device(x=x, **vectors)
    return _empty(x)


@_fake("rms_norm")
def _(x, weight, eps=1e-5):
    return _row_vectors(x, weight=weight)


@_fake("layer_norm")
def _(x, weight, bias, eps=1e-5):
    return _row_vectors(x, weight=weight, bias=bias)


@_fake("swiglu")
def _(gate, up):
    _check(gate, "gate", min_rank=1)
    _check(up, "up", dtype=gate.dtype)
    if gate.shape != up.shape:
        raise ValueError(f"up: shape {tuple(up.shape)} differs from gate's {tuple(gate.shape)}")
    _same_device(gate=gate, up=up)
    return _empty(gate)


@_fake("matmul")
def _(x, y):
    _check(x, "x", rank=2)
    _check(y, "y", rank=2, dtype=x.dtype)
    if x.shape[1] != y.shape[0]:
        raise ValueError(f"y: expected {x.shape[1]} rows to match x, got shape {tuple(y.shape)}")
    _same_device(x=x, y=y)
    return x.new_empty((x.shape[0], y.shape[1]))


@_fake("rope")
def _(x, cos, sin):
    _check(x, "x", rank=4)
    _, _, s, d = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        _check(t, name, rank=2, dtype=x.dtype)
        if tuple(t.shape) != (s, d):
            raise ValueError(f"{name}: expected shape {(s, d)}, got {tuple(t.shape)}")
    _same_device(x=x, cos=cos, sin=sin)
    return _empty(x)


def _attention_shapes(q, k, v):
    _check(q, "query", rank=4)
    _check(k, "key", rank=4, dtype=q.dtype)
    _check(v, "value", rank=4, dtype=q.dtype)
    if q.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"query: flash_attention takes float32 or bfloat16, got {q.dtype}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] or k.shape != v.shape:
        raise ValueError(f"key/value: shapes {tuple(k.shape)}/{tuple(v.shape)} do not match query {tuple(q.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"key: {k.shape[1]} heads do not divide the query's {q.shape[1]} heads")
    _same_device(query=q, key=k, value=v)


def _attention_options(window, softcap):
    if window is not None and window < 0:
        raise ValueError(f"window: expected a non-negative integer, got {window}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap: expected a positive number, got {softcap}")


def _attention_mask(q, k, mask):
    """Checks a score mask (boolean, or additive float) for ``q``/``k``: it broadcasts to
    ``[batch, heads, q_len, kv_len]`` and is the same for every head. Returns the kernel's
    ``mask`` parameter: ``"none"``, ``"batch"`` (one mask per batch entry) or ``"shared"``."""
    if mask is None:
        return "none"
    if not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
        raise ValueError(f"mask: expected a boolean or floating mask, got {mask.dtype}")
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    shape = tuple(mask.shape)
    aligned = full[4 - len(shape) :] if len(shape) <= 4 else ()
    broadcasts = len(shape) <= 4 and all(m in (f, 1) for m, f in zip(shape, aligned))
    if not broadcasts:
        raise ValueError(f"mask: shape {shape} does not broadcast to {full}")
    if len(shape) >= 3 and shape[-3] != 1:
        raise ValueError(
            f"mask: shape {shape} has a mask per head; the kernel takes one for every head "
            "([batch or 1, 1, q_len, kv_len])"
        )
    _same_device(query=q, mask=mask)
    return "batch" if len(shape) == 4 and shape[0] == q.shape[0] > 1 else "shared"


def _attention_params(q, k, v, is_causal, scale, window=None, softcap=None, mask=None):
    """The attention kernel's parameters for these arguments (graph mode's custom calls)."""
    _attention_shapes(q, k, v)
    _attention_options(window, softcap)
    mask_kind = _attention_mask(q, k, mask)
    b, h, sq, d = q.shape
    if d == 0:
        raise ValueError("query: head_dim must be at least 1")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    return {
        "batch": b,
        "heads": h,
        "kv_heads": k.shape[1],
        "q_len": sq,
        "kv_len": k.shape[2],
        "head_dim": d,
        "causal": "true" if is_causal else "false",
        # As the eager op passes it (the kernel's default is 1/sqrt(head_dim)), so both
        # find the same blocks `tessera tune` stored.
        "scale": "none" if scale is None else repr(float(scale)),
        "dtype": _DTYPES[q.dtype],
        "window": "none" if window is None else int(window),
        "softcap": "none" if softcap is None else repr(float(softcap)),
        "mask": mask_kind,
    }


@_fake("flash_attention_fwd")
def _(q, k, v, is_causal, scale, window=None, softcap=None, mask=None):
    _attention_shapes(q, k, v)
    _attention_options(window, softcap)
    _attention_mask(q, k, mask)
    return _empty(q), q.new_empty((*q.shape[:3], 1), dtype=torch.float32)


@_fake("flash_attention_bwd")
def _(q, k, v, grad_out, is_causal, scale, out=None, lse=None, window=None, softcap=None, mask=None):
    _attention_shapes(q, k, v)
    _attention_options(window, softcap)
    _attention_mask(q, k, mask)
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out: shape {tuple(grad_out.shape)} differs from query's {tuple(q.shape)}")
    _same_device(query=q, grad_out=grad_out)
    return _empty(q), _empty(k), _empty(v)


@_fake("flash_attention")
def _(q, k, v, is_causal=False, scale=None, window=None, softcap=None, mask=None):
    _attention_shapes(q, k, v)
    _attention_options(window, softcap)
    _attention_mask(q, k, mask)
    return _empty(q)


@_fake("paged_attention")
def _(q, k_cache, v_cache, block_table, context_lens, scale=None):
    _check(q, "query", rank=3)
    if q.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"query: paged_attention takes float32 or bfloat16, got {q.dtype}")
    _check(k_cache, "k_cache", rank=4, dtype=q.dtype)
    _check(v_cache, "v_cache", rank=4, dtype=q.dtype)
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(
            f"k_cache/v_cache: shapes {tuple(k_cache.shape)}/{tuple(v_cache.shape)} must be equal "
            f"[kv_heads, num_pages, page_size, {q.shape[2]}]"
        )
    for name, t, rank in (("block_table", block_table, 2), ("context_lens", context_lens, 1)):
        if t.dtype not in _INDEX_DTYPES or t.dim() != rank or t.shape[0] != q.shape[0]:
            raise ValueError(
                f"{name}: expected int32 or int64 of rank {rank} over the query's batch of {q.shape[0]}, "
                f"got {t.dtype} {tuple(t.shape)}"
            )
    _same_device(query=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, context_lens=context_lens)
    return _empty(q)


def _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k):
    """Checks packed ``[heads, tokens, head_dim]`` q/k/v and int32/int64 offsets (their values
    are checked by the CPU kernel, before it runs)."""
    _check(q, "query", rank=3)
    _check(k, "key", rank=3, dtype=q.dtype)
    _check(v, "value", rank=3, dtype=q.dtype)
    if q.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"query: varlen_attention takes float32 or bfloat16, got {q.dtype}")
    if k.shape != v.shape or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"key/value: shapes {tuple(k.shape)}/{tuple(v.shape)} must be equal [kv_heads, total_k, {q.shape[2]}]"
        )
    if k.shape[0] == 0 or q.shape[0] % k.shape[0]:
        raise ValueError(f"key: {k.shape[0]} heads do not divide the query's {q.shape[0]} heads")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.dtype not in _INDEX_DTYPES or t.dim() != 1 or t.shape[0] == 0:
            raise ValueError(
                f"{name}: expected int32 or int64 offsets of shape (batch + 1,), got {t.dtype} {tuple(t.shape)}"
            )
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"cu_seqlens_q/cu_seqlens_k: shapes {tuple(cu_seqlens_q.shape)}/"
            f"{tuple(cu_seqlens_k.shape)} must be equal (batch + 1,)"
        )
    _same_device(query=q, key=k, value=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


@_fake("varlen_attention_fwd")
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale):
    _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return _empty(q), q.new_empty((*q.shape[:2], 1), dtype=torch.float32)


@_fake("varlen_attention_bwd")
def _(q, k, v, grad_out, cu_seqlens_q, cu_seqlens_k, is_causal, scale, out=None, lse=None):
    _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out: shape {tuple(grad_out.shape)} differs from query's {tuple(q.shape)}")
    _same_device(query=q, grad_out=grad_out)
    return _empty(q), _empty(k), _empty(v)


@_fake("varlen_attention")
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal=False, scale=None):
    _varlen_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return _empty(q)


# ---- autograd kernels ------------------------------------------------------------------

_below_autograd = torch._C._AutoDispatchBelowAutograd


def _differentiable(name, setup_context, backward):
    """Registers the autograd kernel of ``tessera::name`` with an ``autograd.Function``
    that runs the op below autograd (``setup_context`` saves what ``backward`` needs)."""
    op = getattr(torch.ops.tessera, name).default

    def forward(*args):
        with _below_autograd():
            return op(*args)

    function = type(
        f"{name}_function",
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
        },
    )
    _autograd_kernel(name, function)


def _autograd_kernel(name, function=None):
    """Registers the autograd kernel of ``tessera::name``: ``function.apply`` when a
    tensor argument requires grad and grad mode is on, else (and always for an op without
    gradients, ``function=None``) a redispatch of the call's keyset below autograd (as
    ``torch.library``'s own autograd kernels do: cheaper than entering a guard and calling
    the op again). Errors of the native kernel become their Python exceptions here."""
    op = getattr(torch.ops.tessera, name).default
    # The dispatcher leaves trailing defaulted arguments out; the function gets them all.
    defaults = tuple(a.default_value for a in op._schema.arguments)

    below_autograd = torch._C._after_autograd_keyset
    redispatch = op._handle.redispatch_boxed
    grad_enabled = torch.is_grad_enabled

    def kernel(keyset, *args):
        try:
            if function is not None and grad_enabled():
                for a in args:
                    if isinstance(a, torch.Tensor) and a.requires_grad:
                        return function.apply(*args, *defaults[len(args) :])
            return redispatch(keyset & below_autograd, *args)
        except RuntimeError as e:
            raise _python_error(e) from None

    _lib.impl(name, kernel, "Autograd", with_keyset=True)
    _PYTHON_AUTOGRAD.append(name)


_PYTHON_AUTOGRAD = []


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# The PyTorch math of the row-wise ops: their backward differentiates it (in f32) on the
# saved inputs. The number is how many leading arguments are tensors.
_REFERENCES = {
    "softmax": (1, lambda x: torch.softmax(x, -1)),
    "rms_norm": (2, lambda x, w, eps=1e-5: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w),
    "layer_norm": (3, lambda x, w, b, eps=1e-5: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)),
    "swiglu": (2, lambda a, b: torch.nn.functional.silu(a) * b),
    "rope": (3, lambda x, cos, sin: x * cos + _rotate_half(x) * sin),
}


def _reference_autograd(name, n_tensors, reference):
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

    _differentiable(name, setup, backward)


for _name, (_n, _reference) in _REFERENCES.items():
    _reference_autograd(_name, _n, _reference)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx, grad):
    x, y = ctx.saved_tensors
    grad = grad.to(x.dtype)
    return torch.ops.tessera.matmul(grad, y.t()), torch.ops.tessera.matmul(x.t(), grad)


_differentiable("matmul", _save_inputs, _matmul_backward)


def _attention_backward(ctx, grad_out, *grad_lse):
    q, k, v, out, lse, *mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.tessera.flash_attention_bwd(
        q, k, v, grad_out, ctx.is_causal, ctx.scale, out, lse, ctx.window, ctx.softcap, *mask
    )
    return dq, dk, dv, None, None, None, None, None


def _no_mask_gradient(mask):
    """The kernels give no gradient for a score mask: one that needs it is refused."""
    if mask is not None and mask.requires_grad:
        raise ValueError(
            "mask: flash_attention gives no gradient for the score mask; "
            "detach it (or use scaled_dot_product_attention for a learned bias)"
        )
    return () if mask is None else (mask,)


def _attention_fwd_setup(ctx, inputs, output):
    q, k, v, is_causal, scale, window, softcap, mask = inputs
    ctx.save_for_backward(q, k, v, *output, *_no_mask_gradient(mask))
    ctx.is_causal, ctx.scale, ctx.window, ctx.softcap = is_causal, scale, window, softcap
    ctx.mark_non_differentiable(output[1])


_differentiable("flash_attention_fwd", _attention_fwd_setup, _attention_backward)


class _Attention(torch.autograd.Function):
    """``flash_attention`` with gradients: the forward keeps its log-sum-exp for the
    backward (which then does not run the forward again)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, window, softcap, mask):
        ctx.is_causal, ctx.window, ctx.softcap = is_causal, window, softcap
        ctx.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        with _below_autograd():
            out, lse = torch.ops.tessera.flash_attention_fwd.default(
                q, k, v, is_causal, ctx.scale, window, softcap, mask
            )
        ctx.save_for_backward(q, k, v, out, lse, *_no_mask_gradient(mask))
        return out

    backward = staticmethod(_attention_backward)


_autograd_kernel("flash_attention", _Attention)


def _varlen_backward(ctx, grad_out, *grad_lse):
    q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tessera.varlen_attention_bwd(
        q, k, v, grad_out, cu_q, cu_k, ctx.is_causal, ctx.scale, out, lse
    )
    return dq, dk, dv, None, None, None, None


def _varlen_fwd_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)
    ctx.is_causal, ctx.scale = is_causal, scale
    ctx.mark_non_differentiable(output[1])


_differentiable("varlen_attention_fwd", _varlen_fwd_setup, _varlen_backward)


class _VarlenAttention(torch.autograd.Function):
    """``varlen_attention`` with gradients (the forward's log-sum-exp is kept for the
    backward kernels)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, is_causal, scale):
        ctx.is_causal = is_causal
        ctx.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        with _below_autograd():
            out, lse = torch.ops.tessera.varlen_attention_fwd.default(q, k, v, cu_q, cu_k, is_causal, ctx.scale)
        ctx.save_for_backward(q, k, v, cu_q, cu_k, out, lse)
        return out

    backward = staticmethod(_varlen_backward)


_autograd_kernel("varlen_attention", _VarlenAttention)


_autograd_kernel("flash_attention_bwd")  # no gradients of gradients
_autograd_kernel("varlen_attention_bwd")
_autograd_kernel("paged_attention")  # decoding: no gradients


def autograd_kernels() -> str:
    """What runs the ops' autograd step on CPU tensors: ``"native"`` (C++: a call that
    needs no gradient enters no Python; one that does goes on to the Python kernel) or
    ``"python"`` (the Python kernels alone)."""
    return _autograd_kernels


# The Python kernels above cost ~2.4 us a call, most of a small op's cost. The native ones
# (built against this PyTorch's headers) take their place on CPU tensors unless
# TESSERA_NATIVE_AUTOGRAD=0 or they cannot load (another PyTorch than the build's).
_autograd_kernels = "python"
# The release the native kernels must have been built for (`2.13.0`, no local tag).
_TORCH_RELEASE = torch.__version__.split("+")[0]
if config.get("TESSERA_NATIVE_AUTOGRAD", "1") != "0":
    try:
        if _tessera.register_native_autograd(_PYTHON_AUTOGRAD, _TORCH_RELEASE):
            _autograd_kernels = "native"
    except RuntimeError as _e:
        warnings.warn(f"tessera: the ops' autograd kernels stay in Python: {_e}", stacklevel=2)


# ---- scaled_dot_product_attention override ---------------------------------------

_original_sdpa = None


def _sdpa_supported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    """Why this SDPA call cannot go to tessera, or None when it can."""
    tensors = (query, key, value)
    if attn_mask is not None and (is_causal or attn_mask.requires_grad):
        return "attn_mask with is_causal, or one that requires grad"
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
    try:
        _attention_mask(query, key, attn_mask)
    except ValueError as e:
        return str(e)
    return None


def enable_sdpa_override():
    """Routes CPU `torch.nn.functional.scaled_dot_product_attention` calls that tessera
    supports (a mask the same for every head included) to `torch.ops.tessera.flash_attention`;
    every other call (a mask per head, dropout, other devices or dtypes) goes to PyTorch's
    own kernel."""
    global _original_sdpa
    if _original_sdpa is not None:
        return
    _original_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        reason = _sdpa_supported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        if reason is None:
            return torch.ops.tessera.flash_attention(query, key, value, is_causal, scale, mask=attn_mask)
        record_fallback("scaled_dot_product_attention", reason)
        return _original_sdpa(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    torch.nn.functional.scaled_dot_product_attention = sdpa


def disable_sdpa_override():
    """Restores PyTorch's own `scaled_dot_product_attention`."""
    global _original_sdpa
    if _original_sdpa is not None:
        torch.nn.functional.scaled_dot_product_attention = _original_sdpa
        _original_sdpa = None


# ---- the op tracer: tessera.trace_ops() ----------------------------------------------

from .trace import OpTrace, record_fallback, trace_ops  # noqa: E402

# ---- DTensor sharding rules (tensor parallelism) --------------------------------------

if torch.distributed.is_available():
    try:
        from . import distributed  # noqa: E402, F401
    except ImportError as e:  # DTensor's experimental API moved: the ops still work
        import warnings

        warnings.warn(f"tessera: no DTensor sharding rules ({e}): DTensor calls of the ops will fail", stacklevel=2)

# ---- user op libraries: tessera.load_library(path) ----------------------------------

# ---- graph mode: torch.compile(model, backend="tessera") ----------------------------
from .graph import explain_graph, export, graph_stats, reset_graph_stats, tessera_backend  # noqa: E402
from .library import load_library  # noqa: E402


def _register_backend():
    """Registers the Dynamo backend ``tessera`` (unless Dynamo found the package's
    ``torch_dynamo_backends`` entry point, through which it registers it itself)."""
    from torch._dynamo.backends import registry

    if "tessera" not in registry._COMPILER_FNS and registry._BACKENDS.get("tessera") is None:
        registry.register_backend(tessera_backend, name="tessera")


_register_backend()

# ---- Hugging Face Transformers: attn_implementation="tessera" -------------------------

from . import hf  # noqa: E402

if "transformers" in sys.modules:  # importing it here would cost seconds
    try:
        hf.register()
    except ImportError as _e:  # a Transformers without AttentionInterface
        warnings.warn(f"tessera: attn_implementation='tessera' is not registered: {_e}", stacklevel=2)
