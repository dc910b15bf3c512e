"""The ``onednn_matmul`` family: float32 matrix products run by oneDNN instead of the
BLAS PyTorch calls (MKL).

Where MKL runs a code path narrower than the CPU's vectors (MKL on AMD CPUs runs its
AVX2 kernels on AVX-512 parts), oneDNN's JIT-generated kernels use the full width. On
the EPYC this was measured on, a 256x256x512 product took 335 us in ``torch.mm`` and
175 us in oneDNN, in the forward and both backward products; for a single row, MKL
wins (8 us against 15). Whether the family is taken is measured per graph (``choose``).

The pass runs on the ATen graphs AOTAutograd gives Inductor (forward and backward), so
the products of both are taken and no autograd formula is needed: each ``mm(a, b)``
and ``addmm(bias, a, b)`` (a vector bias, no scaling) of float32 CPU matrices becomes
``tessera_graph.onednn_matmul(a, b.t(), bias)``, which Inductor calls as an extern
kernel. Inductor's own oneDNN lowering is not used: it takes constant (frozen) weights
only, and a backend must not assume that weights never change.
"""

import operator
from typing import Optional

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

#: The family's name in ``kernels`` options and ``graph_stats()``.
FAMILY = "onednn_matmul"

_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_aten = torch.ops.aten

#: The ``tessera_graph`` op library (ops graph mode inserts that are not library kernels).
lib = torch.library.Library("tessera_graph", "DEF")
lib.define(
    "onednn_matmul(Tensor a, Tensor w, Tensor? bias) -> Tensor",
    tags=(torch.Tag.pt2_compliant_tag,),
)


def available() -> bool:
    """Whether this PyTorch has oneDNN's linear (x86 builds with mkldnn)."""
    return _LINEAR is not None and torch.backends.mkldnn.is_available()


def _onednn_matmul(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    if a.shape[1] == 0:  # oneDNN has no primitive for an empty contraction
        out = a.new_zeros((a.shape[0], w.shape[0]))
        return out if bias is None else out + bias
    return _LINEAR.default(a, w, bias, "none", [], "")


def _fake(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return a.new_empty((a.shape[0], w.shape[0]))


lib.impl("onednn_matmul", _onednn_matmul, "CPU")
torch.library.register_fake("tessera_graph::onednn_matmul", _fake, lib=lib)
torch.ops.tessera_graph.onednn_matmul.__doc__ = (
    "onednn_matmul(a, w, bias) = a @ w.T (+ bias): a [M, K] and w [N, K] float32 CPU matrices"
    " of any strides, bias None or [N]; oneDNN's linear, for graph mode's onednn_matmul family."
)

#: Graph-level calls that become ``mm``/``addmm`` after AOTAutograd.
_PRODUCTS = {
    operator.matmul,
    torch.nn.functional.linear,
    torch._C._nn.linear,
    torch.matmul,
    torch.mm,
    torch.addmm,
    torch.Tensor.matmul,
    torch.Tensor.mm,
    torch.Tensor.addmm,
}
_PRODUCT_METHODS = {
    f.__name__ for f in (torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.addmm, torch.Tensor.__matmul__)
}


def present(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo's graph ``gm`` has a float32 product the pass could take."""
    if not available():
        return False
    for n in gm.graph.nodes:
        method = n.op == "call_method" and n.target in _PRODUCT_METHODS
        if not (method or (n.op == "call_function" and n.target in _PRODUCTS)):
            continue
        value = n.meta.get("example_value")
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and value.device.type == "cpu":
            return True
    return False


def _matrix(n) -> bool:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return isinstance(v, torch.Tensor) and v.dim() == 2 and v.dtype == torch.float32 and v.device.type == "cpu"


def _operands(n: torch.fx.Node):
    """``(a, b, bias)`` of a product the pass takes (``a @ b + bias``), or None."""
    if n.target is _aten.mm.default:
        a, b = n.args
        bias = None
    elif n.target is _aten.addmm.default:
        bias, a, b = n.args[:3]
        scaled = [s for s in (*n.args[3:], *n.kwargs.values()) if s != 1]
        v = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        columns = b.meta["val"].shape[1] if _matrix(b) else None
        if scaled or not (isinstance(v, torch.Tensor) and v.dim() == 1 and v.dtype == torch.float32):
            return None
        if columns is None or not statically_known_true(v.shape[0] == columns):
            return None
    else:
        return None
    return (a, b, bias) if _matrix(a) and _matrix(b) else None


def substitute(gm: torch.fx.GraphModule) -> int:
    """Replaces the float32 ``mm``/``addmm`` of the ATen graph ``gm`` in place by
    ``onednn_matmul``; returns how many."""
    if not available():
        return 0
    graph, taken = gm.graph, 0
    for n in list(graph.nodes):
        operands = _operands(n) if n.op == "call_function" else None
        if operands is None:
            continue
        a, b, bias = operands
        with graph.inserting_before(n):
            w = graph.call_function(_aten.permute.default, (b, [1, 0]))
            w.meta["val"] = b.meta["val"].permute(1, 0)
            product = graph.call_function(torch.ops.tessera_graph.onednn_matmul.default, (a, w, bias))
        product.meta.update(n.meta)
        n.replace_all_uses_with(product)
        graph.erase_node(n)
        taken += 1
    if taken:
        graph.lint()
        gm.recompile()
    return taken
