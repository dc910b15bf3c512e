"""Kernel substitution: FX passes over Dynamo's graph (before autograd) that replace the
ATen patterns Tessera has kernels for with ``torch.ops.tessera.*`` calls.

Running before AOTAutograd means the ops' own autograd formulas are traced into the
backward graph (attention's backward is the FlashAttention backward kernels). Each
pass records what it substituted and, for a pattern it recognised but could not take
(a mask that is not causal, an unsupported dtype), the reason.

Patterns:
- scaled-dot-product attention: ``is_causal``; a constant mask (from constants and
  buffers, which are assumed not to change; boolean or additive; the same for every
  batch entry and head) that is causal, sliding-window or all-visible, folded into
  ``is_causal`` and ``window``; any other mask that is the same for every head
  (padding, a decode step's cache mask, an additive bias) as the kernel's score mask;
  ``scale``; GQA through ``enable_gqa``,
  ``repeat_interleave(n, dim=1)`` or the ``repeat_kv`` ``[:, :, None].expand(..)
  .reshape(..)`` of k/v. Also attention written out (Transformers' eager form, with
  Gemma 2's soft-capping).
- RMSNorm: ``torch.rms_norm``/``F.rms_norm``/``nn.RMSNorm`` and the hand-written
  ``w * (x * rsqrt(mean(x^2, -1, keepdim) + eps))`` with the casts libraries add.
- ``layer_norm`` over the last dim with weight and bias; ``softmax`` over the last dim
  (with its ``dtype``); ``silu(a) * b``.
"""

import operator
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .. import ops

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_RMS_NORM = {torch.rms_norm, F.rms_norm}
_LAYER_NORM = {F.layer_norm, torch.layer_norm}
_SOFTMAX = {torch.softmax, F.softmax, torch.Tensor.softmax}
_SILU = {F.silu}
_MUL = {operator.mul, torch.mul, torch.Tensor.mul}
_ADD = {operator.add, torch.add, torch.Tensor.add}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Report:
    """What the passes did to one graph."""

    substituted: dict[str, int] = field(default_factory=dict)  # tessera op -> count
    skipped: dict[str, str] = field(default_factory=dict)  # pattern -> why not
    replaced: list[torch.fx.Node] = field(default_factory=list)  # operands of replaced nodes

    def hit(self, op: str):
        """Counts one substitution of ``op``."""
        self.substituted[op] = self.substituted.get(op, 0) + 1

    def miss(self, pattern: str, why: str):
        """Records why ``pattern`` was not substituted."""
        self.skipped[pattern] = why


def _val(n):
    if not isinstance(n, torch.fx.Node):
        return None
    return n.meta.get("example_value", n.meta.get("val"))


def _is(n, targets, method: Optional[str] = None) -> bool:
    """Whether ``n`` calls one of ``targets`` (or the tensor method ``method``)."""
    if not isinstance(n, torch.fx.Node):
        return False
    if n.op == "call_function":
        return n.target in targets
    return method is not None and n.op == "call_method" and n.target == method


def _arg(n, i: int, name: str, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _replace(graph, old, target, args, report, op):
    with graph.inserting_after(old):
        new = graph.call_function(target, tuple(args))
    new.meta.update(old.meta)
    old.replace_all_uses_with(new)
    report.replaced.extend(a for a in old.all_input_nodes)
    graph.erase_node(old)
    report.hit(op)
    return new


def _prune(graph, candidates):
    """Erases the nodes a substitution left unused (and their unused operands), never a
    placeholder or a node with side effects."""
    work, gone = list(candidates), set()
    while work:
        n = work.pop()
        if n in gone or n.users or n.op not in ("call_function", "call_method") or n.is_impure():
            continue
        if n.op == "call_method" and str(n.target).endswith("_"):
            continue
        work.extend(n.all_input_nodes)
        graph.erase_node(n)
        gone.add(n)


# ---- attention ------------------------------------------------------------------------


def _unrepeated_kv(n):
    """The k/v a GQA repeat was made from, or None. Recognises ``repeat_interleave(n,
    dim=1)`` and repeat_kv's ``x[:, :, None].expand(b, h, n, s, d).reshape(b, h*n, s, d)``."""
    if _is(n, {torch.repeat_interleave}, "repeat_interleave"):
        src, repeats, dim = n.args[0], _arg(n, 1, "repeats"), _arg(n, 2, "dim")
        sv, nv = _val(src), _val(n)
        if (
            dim == 1
            and isinstance(repeats, int)
            and sv is not None
            and nv is not None
            and sv.dim() == 4
            and nv.shape[1] == sv.shape[1] * repeats
        ):
            return src
        return None
    if not _is(n, {torch.reshape}, "reshape") and not _is(n, set(), "view"):
        return None
    expand = n.args[0]
    if not _is(expand, set(), "expand"):
        return None
    unsqueezed = expand.args[0]
    full = slice(None)
    if _is(unsqueezed, {operator.getitem}) and unsqueezed.args[1] in (
        (full, full, None),
        (full, full, None, Ellipsis),
        (full, full, None, full, full),
    ):
        src = unsqueezed.args[0]
    elif _is(unsqueezed, {torch.unsqueeze}, "unsqueeze") and _arg(unsqueezed, 1, "dim") == 2:
        src = unsqueezed.args[0]
    else:
        return None
    ev, sv, nv = _val(expand), _val(src), _val(n)
    if any(v is None for v in (ev, sv, nv)) or sv.dim() != 4 or ev.dim() != 5:
        return None
    b, h, s, d = sv.shape
    if tuple(ev.shape) != (b, h, ev.shape[2], s, d) or tuple(nv.shape) != (b, h * ev.shape[2], s, d):
        return None
    return src


def _visible(sq: int, sk: int, causal: bool, window: Optional[int]) -> torch.Tensor:
    """The ``[sq, sk]`` scores the attention kernel keeps: top-left causal (``j <= i``),
    and with a window ``w`` no key before ``i - w``."""
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= j + window >= i
    return keep


def mask_options(mask, sq: int, sk: int, constants: Callable):
    """``(is_causal, window)`` of the kernel call that hides exactly what the constant
    ``mask`` hides (causal, sliding-window or all-visible; boolean or additive; the same
    for every batch entry and head), or a string saying why there is none."""
    value = constants(mask)
    if not isinstance(value, torch.Tensor):
        return "attn_mask depends on the inputs (only constant causal and sliding-window masks are folded)"
    if value.dim() < 2 or tuple(value.shape[-2:]) != (sq, sk):
        return f"attn_mask of shape {tuple(value.shape)} is not a [..., {sq}, {sk}] mask"
    if value.dtype == torch.bool:
        keep = value
    elif not bool(((value == 0) | (value <= -1e4)).all()):
        return "attn_mask is an additive bias (values other than 0 and -inf)"
    else:
        keep = value == 0
    keep = keep.reshape(-1, sq, sk)
    if not bool((keep == keep[:1]).all()):
        return "attn_mask differs between batch entries or heads (a padding mask)"
    keep = keep[0]
    causal = not bool(keep.triu(1).any())
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    reach = int((i - j).masked_fill(~keep, 0).max().clamp(min=0)) if bool(keep.any()) else 0
    for window in (None, reach):
        if torch.equal(_visible(sq, sk, causal, window), keep):
            return causal, window
    return "attn_mask is not causal, sliding-window or all-visible"


def _kernel_options(q, k, v, out, mask, is_causal, constants):
    """``(is_causal, window, mask)`` of the flash attention call computing ``out`` from
    these q/k/v nodes and mask, or why the kernel cannot take it. A constant causal or
    sliding-window mask is folded into ``is_causal`` and ``window``; any other mask the
    kernel takes (padding, a decode step's cache mask, an additive bias; the same for
    every head) is passed on as its score mask."""
    qv, kv, vv, ov = _val(q), _val(k), _val(v), _val(out)
    if any(t is None for t in (qv, kv, vv, ov)):
        return "shapes unknown"
    if ov.dtype != qv.dtype or ov.shape != qv.shape:
        return f"the result ({ov.dtype} {tuple(ov.shape)}) is not shaped and typed like q"
    why = ops.refusal("flash_attention", qv, kv, vv)
    if why is not None:
        return why
    if mask is None:
        return bool(is_causal), None, None
    if is_causal:
        return "both attn_mask and is_causal"
    folded = mask_options(mask, qv.shape[2], kv.shape[2], constants)
    if not isinstance(folded, str):
        return (*folded, None)
    mv = _val(mask)
    if mv is None:
        return f"{folded}; its shape is unknown"
    if mv.requires_grad:
        return f"{folded}; it requires grad (the kernel gives the mask no gradient)"
    why = ops.refusal("flash_attention", qv, kv, vv, False, None, None, None, mv)
    if why is not None:
        return f"{folded}; {why}"
    return False, None, mask


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Scaled-dot-product attention in plain ops (what an unsubstituted SDPA call becomes,
    so its forward and backward lower to StableHLO)."""
    sq, sk = query.shape[-2], key.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], -3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], -3)
    scores = (query @ key.transpose(-2, -1)) * scale
    if is_causal:
        scores = scores.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # A row with every key masked gives 0 (as PyTorch's fused CPU kernel does), not NaN.
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    p = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    if dropout_p:
        p = F.dropout(p, dropout_p, training=True)
    return p @ value


def _attention(graph, report, constants):
    for n in list(graph.nodes):
        if not _is(n, _SDPA):
            continue
        q, k, v = n.args[:3]
        mask = _arg(n, 3, "attn_mask")
        dropout = _arg(n, 4, "dropout_p", 0.0)
        is_causal = _arg(n, 5, "is_causal", False)
        scale = _arg(n, 6, "scale")
        k, v = _unrepeated_kv(k) or k, _unrepeated_kv(v) or v
        window, why = None, None
        if dropout:
            why = "dropout_p is not 0"
        elif isinstance(scale, torch.fx.Node) or isinstance(is_causal, torch.fx.Node):
            why = "scale or is_causal is not a constant"
        else:
            options = _kernel_options(q, k, v, n, mask, is_causal, constants)
            if isinstance(options, str):
                why = options
            else:
                is_causal, window, mask = options
        if why:
            report.miss("scaled_dot_product_attention", why)
            with graph.inserting_after(n):
                plain = graph.call_function(sdpa_math, n.args, n.kwargs)
            plain.meta.update(n.meta)
            n.replace_all_uses_with(plain)
            graph.erase_node(n)
            continue
        args = (q, k, v, bool(is_causal), scale) + (() if window is None and mask is None else (window,))
        args += () if mask is None else (None, mask)
        _replace(graph, n, torch.ops.tessera.flash_attention, args, report, "flash_attention")


_MATMUL = {torch.matmul, operator.matmul, torch.bmm}
_DIV = {operator.truediv, torch.div, torch.Tensor.div}


def _no_op_dropout(n):
    """The input of a dropout that does nothing (``p=0`` or not training), else None."""
    if not _is(n, {F.dropout}):
        return None
    if _arg(n, 1, "p", 0.5) == 0 or _arg(n, 2, "training", True) is False:
        return n.args[0]
    return None


def _scaled_scores(s):
    """``(q, k, scale, softcap)`` when ``s`` is ``(q @ k^T) * scale`` (or ``/ d``, or
    unscaled: ``scale`` 1), optionally soft-capped as Gemma 2 writes it (``tanh(s / c) *
    c``); else None."""
    softcap = None
    if _is(s, _MUL, "mul") and len(s.args) == 2 and isinstance(s.args[1], (int, float)):
        t = s.args[0]
        if _is(t, {torch.tanh}, "tanh") and _is(t.args[0], _DIV, "div") and t.args[0].args[1] == s.args[1]:
            softcap, s = float(s.args[1]), t.args[0].args[0]
    scale = 1.0
    if _is(s, _MUL, "mul") and len(s.args) == 2 and isinstance(s.args[1], (int, float)):
        scale, s = float(s.args[1]), s.args[0]
    elif _is(s, _DIV, "div") and len(s.args) == 2 and isinstance(s.args[1], (int, float)):
        scale, s = 1.0 / float(s.args[1]), s.args[0]
    if not _is(s, _MATMUL, "matmul") or len(s.args) != 2:
        return None
    q, kt = s.args
    if not _is(kt, {torch.transpose}, "transpose") or sorted(d % 4 for d in kt.args[1:3] if isinstance(d, int)) != [
        2,
        3,
    ]:
        return None
    return q, kt.args[0], scale, softcap


def _eager_attention(graph, report, constants):
    """Attention written out as Transformers' eager implementation does (Gemma 2's
    default, for its soft-capping): ``softmax(q k^T * scale [capped] + mask, -1
    [, dtype]) [.to(dtype)] [dropout p=0] @ v``."""
    for out in list(graph.nodes):
        if not _is(out, _MATMUL, "matmul") or len(out.args) != 2:
            continue
        p, v = out.args
        while _no_op_dropout(p) is not None or _cast_of(p) is not None:
            p = _no_op_dropout(p) if _no_op_dropout(p) is not None else _cast_of(p)
        if _is(p, {F.dropout}) and _is(_uncast(p.args[0]), _SOFTMAX, "softmax"):
            report.miss("attention (eager form)", "attention dropout is active (p > 0 while training)")
            continue
        if not _is(p, _SOFTMAX, "softmax") or _arg(p, 1, "dim") not in (-1, 3):
            continue
        s, mask = p.args[0], None
        if _is(s, _ADD, "add") and len(s.args) == 2 and _val(s.args[1]) is not None:
            s, mask = s.args
        found = _scaled_scores(s)
        if found is None:
            continue
        q, k, scale, softcap = found
        k, v = _unrepeated_kv(k) or k, _unrepeated_kv(v) or v
        options = _kernel_options(q, k, v, out, mask, False, constants)
        why = options if isinstance(options, str) else None
        if why:
            report.miss("attention (eager form)", why)
            continue
        causal, window, mask = options
        args = (q, k, v, causal, scale, window, softcap) + (() if mask is None else (mask,))
        _replace(graph, out, torch.ops.tessera.flash_attention, args, report, "flash_attention")


# ---- norms, softmax, swiglu -----------------------------------------------------------


def _float_rows(x) -> Optional[str]:
    v = _val(x)
    if v is None:
        return "shape unknown"
    if v.dtype not in _FLOATS:
        return f"dtype {v.dtype}"
    if v.dim() < 1 or v.numel() == 0:
        return "empty or scalar input"
    return None


def _vector(w, cols) -> bool:
    v = _val(w)
    return v is not None and v.dim() == 1 and v.shape[0] == cols


def _rms_norm(graph, report):
    for n in list(graph.nodes):
        if not _is(n, _RMS_NORM):
            continue
        x, shape, w = n.args[0], _arg(n, 1, "normalized_shape"), _arg(n, 2, "weight")
        eps = _arg(n, 3, "eps")
        why = _float_rows(x)
        if why is None and (not isinstance(shape, (tuple, list)) or len(shape) != 1):
            why = "normalizes more than the last dim"
        if why is None and not _vector(w, _val(x).shape[-1]):
            why = "no weight (elementwise_affine=False)"
        if why is None and _val(w).dtype != _val(x).dtype:
            why = "weight dtype differs"
        if why:
            report.miss("rms_norm", why)
            continue
        eps = torch.finfo(_val(x).dtype).eps if eps is None else eps
        _replace(graph, n, torch.ops.tessera.rms_norm, (x, w, float(eps)), report, "rms_norm")
    _hand_written_rms_norm(graph, report)


_CASTS = {"to", "float", "type_as", "type", "bfloat16", "half"}


def _cast_of(n) -> Optional[torch.fx.Node]:
    """The node ``n`` casts (``x.to(dtype)``, ``x.float()``, ``x.type_as(y)``, ...; the
    shape unchanged), or None."""
    if not (isinstance(n, torch.fx.Node) and n.op == "call_method" and n.target in _CASTS):
        return None
    src = n.args[0]
    sv, nv = _val(src), _val(n)
    if sv is None or nv is None or sv.shape != nv.shape or sv.device != nv.device:
        return None
    return src


def _uncast(n):
    """``n`` with the casts applied to it peeled off."""
    while _cast_of(n) is not None:
        n = _cast_of(n)
    return n


def _only_user(n) -> Optional[torch.fx.Node]:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _other(n, operand):
    """The other operand of the binary node ``n``."""
    return n.args[1] if n.args[0] is operand else n.args[0]


def _hand_written_rms_norm(graph, report):
    """``w * (x * rsqrt(mean(x^2, -1, keepdim=True) + eps))`` with the casts libraries
    put around it (Transformers: ``x.to(float32)`` first, ``.to(input_dtype)`` before
    the weight; Gemma: ``* (1 + w)``, then ``.type_as(x)``)."""
    for r in list(graph.nodes):
        if not _is(r, {torch.rsqrt}, "rsqrt"):
            continue
        add = r.args[0]
        if not _is(add, _ADD, "add") or len(add.args) != 2:
            continue
        eps = next((a for a in add.args if isinstance(a, float)), None)
        mean = _other(add, eps) if eps is not None else None
        if (
            not _is(mean, {torch.mean}, "mean")
            or _arg(mean, 1, "dim") not in (-1, [-1], (-1,))
            or not _arg(mean, 2, "keepdim", False)
        ):
            continue
        sq = mean.args[0]
        if _is(sq, {torch.pow}, "pow") and sq.args[1] == 2:
            x = sq.args[0]
        elif _is(sq, _MUL, "mul") and sq.args[0] is sq.args[1]:
            x = sq.args[0]
        else:
            continue
        normed = _only_user(r)
        if normed is None or not _is(normed, _MUL, "mul") or x not in normed.args:
            continue
        scaled = normed
        while _only_user(scaled) is not None and _cast_of(_only_user(scaled)) is scaled:
            scaled = _only_user(scaled)
        final = _only_user(scaled)
        if final is None or not _is(final, _MUL, "mul") or len(final.args) != 2:
            continue
        w = _other(final, scaled)
        source = _uncast(x)
        after = _only_user(final)
        if after is not None and _cast_of(after) is final and _val(after).dtype == _val(source).dtype:
            final = after  # Gemma casts the weighted result back
        why = _float_rows(source)
        if why is None and not _vector(w, _val(source).shape[-1]):
            why = "weight is not a [cols] vector"
        elif why is None and not (_val(w).dtype == _val(source).dtype == _val(final).dtype):
            why = (
                f"weight dtype {_val(w).dtype}, input dtype {_val(source).dtype} and result dtype "
                f"{_val(final).dtype} differ"
            )
        elif why is None and _val(final).shape != _val(source).shape:
            why = "result shape differs from the input's"
        if why:
            report.miss("rms_norm (hand-written)", why)
            continue
        _replace(graph, final, torch.ops.tessera.rms_norm, (source, w, eps), report, "rms_norm")


def _layer_norm(graph, report):
    for n in list(graph.nodes):
        if not _is(n, _LAYER_NORM):
            continue
        x, shape = n.args[0], _arg(n, 1, "normalized_shape")
        w, b, eps = _arg(n, 2, "weight"), _arg(n, 3, "bias"), _arg(n, 4, "eps", 1e-5)
        why = _float_rows(x)
        if why is None and (not isinstance(shape, (tuple, list)) or len(shape) != 1):
            why = "normalizes more than the last dim"
        if why is None and not (_vector(w, _val(x).shape[-1]) and _vector(b, _val(x).shape[-1])):
            why = "no weight or bias"
        if why is None and (_val(w).dtype != _val(x).dtype or _val(b).dtype != _val(x).dtype):
            why = "weight/bias dtype differs"
        if why:
            report.miss("layer_norm", why)
            continue
        _replace(graph, n, torch.ops.tessera.layer_norm, (x, w, b, float(eps)), report, "layer_norm")


def _softmax(graph, report):
    for n in list(graph.nodes):
        if not _is(n, _SOFTMAX, "softmax"):
            continue
        x, dim = n.args[0], _arg(n, 1, "dim")
        why = _float_rows(x)
        if why is None and dim not in (-1, _val(x).dim() - 1):
            why = f"dim={dim} is not the last"
        dtype = _arg(n, 2, "dtype")
        if why is None and dtype is not None and dtype not in _FLOATS:
            why = f"dtype={dtype}"
        if why:
            report.miss("softmax", why)
            continue
        if dtype is not None and dtype != _val(x).dtype:  # softmax(x, dtype=d) is softmax(x.to(d))
            with graph.inserting_before(n):
                x = graph.call_method("to", (x, dtype))
            x.meta["val"] = _val(n)
            x.meta["example_value"] = _val(n)
        _replace(graph, n, torch.ops.tessera.softmax, (x,), report, "softmax")


def _swiglu(graph, report):
    for n in list(graph.nodes):
        if not _is(n, _MUL, "mul") or len(n.args) != 2:
            continue
        a, b = n.args
        if not _is(a, _SILU):
            a, b = b, a
        if not _is(a, _SILU) or _arg(a, 1, "inplace", False) or len(a.users) != 1:
            continue
        gate = a.args[0]
        why = _float_rows(gate)
        if why is None and (_val(b) is None or _val(b).shape != _val(gate).shape or _val(b).dtype != _val(gate).dtype):
            why = "operands differ in shape or dtype"
        if why:
            report.miss("silu(a) * b", why)
            continue
        _replace(graph, n, torch.ops.tessera.swiglu, (gate, b), report, "swiglu")


#: The passes, each with the kernel it substitutes, in the order they run.
PASSES = (
    ("flash_attention", lambda graph, report, constants: _attention(graph, report, constants)),
    ("flash_attention", lambda graph, report, constants: _eager_attention(graph, report, constants)),
    ("rms_norm", lambda graph, report, constants: _rms_norm(graph, report)),
    ("layer_norm", lambda graph, report, constants: _layer_norm(graph, report)),
    ("softmax", lambda graph, report, constants: _softmax(graph, report)),
    ("swiglu", lambda graph, report, constants: _swiglu(graph, report)),
)

#: Every kernel graph mode substitutes.
KERNELS = frozenset(kernel for kernel, _ in PASSES)


def substitute(gm: torch.fx.GraphModule, constants: Callable, kernels: frozenset = KERNELS) -> Report:
    """Runs the passes of ``kernels`` on ``gm`` in place. ``constants(node)`` gives a
    node's value when it depends only on constants and buffers (else None)."""
    report = Report()
    graph = gm.graph
    for kernel, run in PASSES:
        if kernel in kernels:
            run(graph, report, constants)
    _prune(graph, report.replaced)
    graph.lint()
    gm.recompile()
    return report
