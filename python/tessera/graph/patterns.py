"""Kernel substitution: FX passes over Dynamo's graph (before autograd) that replace the
ATen patterns Tessera has kernels for with ``torch.ops.tessera.*`` calls.

Running before AOTAutograd means the ops' own autograd formulas are traced into the
backward graph (attention's backward is the FlashAttention backward kernels). Each
pass records what it substituted and, for a pattern it recognised but could not take
(a mask that is not causal, an unsupported dtype), the reason.

Patterns:
- scaled-dot-product attention: ``is_causal``; a constant lower-triangular boolean or
  additive mask (folded into ``is_causal``, as the reference backend does: the mask
  must come from constants or buffers, which are assumed not to change); ``scale``;
  GQA through ``enable_gqa``, ``repeat_interleave(n, dim=1)`` or the ``repeat_kv``
  ``[:, :, None].expand(..).reshape(..)`` of k/v.
- RMSNorm: ``torch.rms_norm``/``F.rms_norm``/``nn.RMSNorm`` and the hand-written
  ``x * rsqrt(mean(x^2, -1, keepdim) + eps) * w``.
- ``layer_norm`` over the last dim with weight and bias; ``softmax`` over the last dim;
  ``silu(a) * b``.
"""

import operator
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

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

    substituted: Dict[str, int] = field(default_factory=dict)  # tessera op -> count
    skipped: Dict[str, str] = field(default_factory=dict)      # pattern -> why not
    replaced: List[torch.fx.Node] = field(default_factory=list)  # operands of replaced nodes

    def hit(self, op: str):
        self.substituted[op] = self.substituted.get(op, 0) + 1

    def miss(self, pattern: str, why: str):
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
        if dim == 1 and isinstance(repeats, int) and sv is not None and nv is not None and sv.dim() == 4 \
                and nv.shape[1] == sv.shape[1] * repeats:
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
            (full, full, None), (full, full, None, Ellipsis), (full, full, None, full, full)):
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


def _causal_mask(mask, sq: int, sk: int, constants: Callable) -> Optional[str]:
    """None when ``mask`` is the causal mask for ``sq x sk``; else why not."""
    value = constants(mask)
    if value is None:
        return "attn_mask depends on the inputs (only constant causal masks are folded)"
    if value.dim() < 2 or tuple(value.shape[-2:]) != (sq, sk) or any(d != 1 for d in value.shape[:-2]):
        return f"attn_mask of shape {tuple(value.shape)} is not a [{sq}, {sk}] mask"
    m = value.reshape(sq, sk)
    tril = torch.ones(sq, sk, dtype=torch.bool).tril()
    if m.dtype == torch.bool:
        ok = torch.equal(m, tril)
    else:
        ok = bool((m[tril] == 0).all()) and bool((m[~tril] <= -1e4).all())
    return None if ok else "attn_mask is not lower-triangular (causal)"


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
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
    p = torch.softmax(scores, -1)
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
        qv = _val(q)
        k = _unrepeated_kv(k) or k
        v = _unrepeated_kv(v) or v
        kv, vv = _val(k), _val(v)
        why = None
        if any(t is None for t in (qv, kv, vv)):
            why = "shapes unknown"
        elif dropout:
            why = "dropout_p is not 0"
        elif qv.dim() != 4 or kv.dim() != 4 or vv.dim() != 4:
            why = "q/k/v are not 4-D [batch, heads, seq, head_dim]"
        elif qv.dtype not in (torch.float32, torch.bfloat16) or kv.dtype != qv.dtype or vv.dtype != qv.dtype:
            why = f"dtype {qv.dtype} (float32 or bfloat16 only)"
        elif kv.shape != vv.shape or qv.shape[-1] > 256 or qv.shape[1] % kv.shape[1]:
            why = "k/v shapes differ, head dim above 256, or kv heads do not divide q heads"
        elif isinstance(scale, torch.fx.Node) or isinstance(is_causal, torch.fx.Node):
            why = "scale or is_causal is not a constant"
        elif mask is not None:
            if is_causal:
                why = "both attn_mask and is_causal"
            else:
                why = _causal_mask(mask, qv.shape[2], kv.shape[2], constants)
                is_causal = why is None
        if why:
            report.miss("scaled_dot_product_attention", why)
            with graph.inserting_after(n):
                plain = graph.call_function(sdpa_math, n.args, n.kwargs)
            plain.meta.update(n.meta)
            n.replace_all_uses_with(plain)
            graph.erase_node(n)
            continue
        _replace(graph, n, torch.ops.tessera.flash_attention, (q, k, v, bool(is_causal), scale),
                 report, "flash_attention")


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


def _hand_written_rms_norm(graph, report):
    """``x * rsqrt(mean(x^2, -1, keepdim=True) + eps) * w``."""
    for r in list(graph.nodes):
        if not _is(r, {torch.rsqrt}, "rsqrt"):
            continue
        add = r.args[0]
        if not _is(add, _ADD, "add") or not isinstance(add.args[1], float):
            continue
        mean = add.args[0]
        if not _is(mean, {torch.mean}, "mean") or _arg(mean, 1, "dim") not in (-1, [-1], (-1,)) \
                or not mean.kwargs.get("keepdim", False):
            continue
        sq = mean.args[0]
        if _is(sq, {torch.pow}, "pow") and sq.args[1] == 2:
            x = sq.args[0]
        elif _is(sq, _MUL, "mul") and sq.args[0] is sq.args[1]:
            x = sq.args[0]
        else:
            continue
        users = list(r.users)
        if len(users) != 1 or not _is(users[0], _MUL, "mul") or x not in users[0].args:
            continue
        normed = users[0]
        outer = list(normed.users)
        if len(outer) != 1 or not _is(outer[0], _MUL, "mul"):
            continue
        final = outer[0]
        w = final.args[1] if final.args[0] is normed else final.args[0]
        why = _float_rows(x)
        if why is None and (not _vector(w, _val(x).shape[-1]) or _val(w).dtype != _val(x).dtype):
            why = "weight is not a [cols] vector of the input's dtype"
        if why is None and _val(final).shape != _val(x).shape:
            why = "result shape differs from the input's"
        if why:
            report.miss("rms_norm (hand-written)", why)
            continue
        _replace(graph, final, torch.ops.tessera.rms_norm, (x, w, add.args[1]), report, "rms_norm")


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
        if why is None and _arg(n, 2, "dtype") is not None:
            why = "dtype argument"
        if why:
            report.miss("softmax", why)
            continue
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


def substitute(gm: torch.fx.GraphModule, constants: Callable) -> Report:
    """Runs every pass on ``gm`` in place. ``constants(node)`` gives a node's value when
    it depends only on constants and buffers (else None)."""
    report = Report()
    graph = gm.graph
    _attention(graph, report, constants)
    _rms_norm(graph, report)
    _layer_norm(graph, report)
    _softmax(graph, report)
    _swiglu(graph, report)
    _prune(graph, report.replaced)
    graph.lint()
    gm.recompile()
    return report
