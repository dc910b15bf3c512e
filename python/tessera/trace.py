"""``tessera.trace_ops()``: which ATen and Tessera ops ran, on which shapes Tessera's
kernels ran, and which calls fell back to PyTorch and why: the tool for finding silent
fallbacks (in distributed runs too).

    with tessera.trace_ops() as trace:
        loss = model(x).sum(); loss.backward()
    print(trace)            # counts, launches, fallbacks
    trace.tessera["tessera.flash_attention_fwd"], trace.launches[0], trace.fallbacks
"""

import collections
import contextlib
from dataclasses import dataclass, field

from torch.utils._python_dispatch import TorchDispatchMode

from . import _tessera, library


@dataclass
class OpTrace:
    """What ran inside one ``trace_ops()`` block."""

    aten: collections.Counter = field(default_factory=collections.Counter)
    """ATen and other PyTorch ops dispatched below autograd (``aten.mm.default``: count;
    collectives such as ``_c10d_functional.all_reduce.default`` too)."""
    tessera: collections.Counter = field(default_factory=collections.Counter)
    """``torch.ops.tessera.*`` (and loaded user library) ops dispatched."""
    launches: list = field(default_factory=list)
    """Every Tessera kernel run, as ``"kernel params"``: the shapes it ran on (under
    DTensor, the local shards')."""
    fallbacks: list = field(default_factory=list)
    """``(what, reason)`` for each call Tessera could have taken and PyTorch ran instead
    (the SDPA override's declined calls, graph mode's kept patterns and eager graphs)."""

    def __str__(self):
        lines = [f"tessera ops: {dict(self.tessera)}", f"kernel launches: {len(self.launches)}"]
        lines += [f"  {launch}" for launch in self.launches[:20]]
        if len(self.launches) > 20:
            lines.append(f"  ... {len(self.launches) - 20} more")
        top = ", ".join(f"{name} x{n}" for name, n in self.aten.most_common(10))
        lines.append(f"aten ops: {sum(self.aten.values())} ({top})")
        lines.append(f"fallbacks: {len(self.fallbacks)}")
        lines += [f"  {what}: {reason}" for what, reason in self.fallbacks]
        return "\n".join(lines)


_active = []


def record_fallback(what: str, reason: str) -> None:
    """Notes, in every active trace, that PyTorch ran ``what`` instead of Tessera."""
    for trace in _active:
        trace.fallbacks.append((what, reason))


class _Counter(TorchDispatchMode):
    def __init__(self, trace):
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace = getattr(func, "namespace", "")
        ours = namespace == "tessera" or namespace in library.namespaces()
        counts = self.trace.tessera if ours else self.trace.aten
        counts[f"{namespace}.{func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def trace_ops():
    """Traces the ops the block runs (on this process; traces do not nest) and yields
    the :class:`OpTrace`, filled in when the block ends."""
    trace = OpTrace()
    was_on = _tessera.trace_launches(True)
    _tessera.take_launches()
    _active.append(trace)
    try:
        with _Counter(trace):
            yield trace
    finally:
        _active.remove(trace)
        trace.launches.extend(_tessera.take_launches())
        _tessera.trace_launches(was_on)
