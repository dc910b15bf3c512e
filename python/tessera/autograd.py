"""Autograd for the library ops: attention through its backward kernels (the forward's
log-sum-exp kept), the row-wise ops through PyTorch's math of them, matmul through two
matmuls; ``paged_attention`` and the backward ops have no gradients.

Each op's autograd kernel is registered here in Python; a native (C++) one takes its
place on CPU tensors when it loads (:func:`autograd_kernels` says which runs).
"""

import math
import warnings

import torch

from . import _tessera, config, ops

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
            raise ops.python_error(e) from None

    ops.lib.impl(name, kernel, "Autograd", with_keyset=True)
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
#: The release the native kernels must have been built for (``2.13.0``, no local tag).
TORCH_RELEASE = torch.__version__.split("+")[0]
if config.get("TESSERA_NATIVE_AUTOGRAD", "1") != "0":
    try:
        if _tessera.register_native_autograd(_PYTHON_AUTOGRAD, TORCH_RELEASE):
            _autograd_kernels = "native"
    except RuntimeError as _e:
        warnings.warn(f"tessera: the ops' autograd kernels stay in Python: {_e}", stacklevel=2)
