"""Which kernels a graph takes under ``kernels="auto"`` (the default on the Inductor
path): a kernel family is substituted only where it makes the compiled graph faster.

Each family the passes would substitute in a graph is tried in the passes' order: the
graph with it added to the families already taken is compiled by Inductor and raced
against the graph without it (calls alternating on the example inputs, medians); it is
kept when it is faster by more than :data:`MARGIN`. Families that only win inside a
fusion Inductor would have made, or lose to Inductor's own code, are left out.

The decision is stored per graph (its code and input types), machine and Tessera
version in the cache directory (``graph-choices/``; ``TESSERA_TUNE=off`` ignores it), so
a later process compiles the chosen graph only. ``graph_stats()["choices"]`` gives each
graph's kernels, how they were chosen and the timings.
"""

import json
import operator
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import _tessera, config
from . import patterns

#: A family is kept when the graph with it is this much faster than without.
MARGIN = 0.03
#: Each race runs at least this many rounds, and more until this many seconds passed.
ROUNDS, BUDGET_S, MAX_ROUNDS = 5, 0.4, 60


@dataclass
class Choice:
    """The kernels one graph takes, and why."""

    kernels: frozenset
    how: str  # "measured", "stored", or why nothing was measured
    ms: dict = field(default_factory=dict)  # candidate ("none", "+rms_norm", ...) -> median ms

    def record(self) -> dict:
        """The entry of ``graph_stats()["choices"]``."""
        return {"kernels": sorted(self.kernels), "how": self.how, "ms": dict(self.ms)}


def choose(
    gm: torch.fx.GraphModule,
    example_inputs,
    present: list,
    compile_with: Callable[[frozenset], Callable],
    log: Callable[[str], None],
) -> Choice:
    """The families of ``present`` (those the passes substitute in ``gm``) that earn
    their place. ``compile_with(kernels)`` compiles the graph with ``kernels``
    substituted."""
    every = frozenset(present)
    if not present:
        return Choice(every, "nothing to substitute")
    why_not = _unmeasurable(gm, example_inputs)
    if why_not:
        return Choice(every, f"not measured ({why_not}): every kernel taken")
    key = _key(gm, example_inputs, present)
    stored = _stored(key)
    if stored is not None:
        return stored
    inputs = [_concrete(a) for a in example_inputs]
    taken, ms = frozenset(), {}
    log(f"measuring which of {', '.join(present)} to substitute ({len(present) + 1} compiles)")
    best = compile_with(taken)
    for family in present:
        candidate = compile_with(taken | {family})
        without, with_it = _race([best, candidate], inputs)
        ms.setdefault("none", round(without, 4))
        ms[f"+{family}"] = round(with_it, 4)
        log(f"{'+'.join(sorted(taken)) or 'none'}: {without:.3f} ms; with {family}: {with_it:.3f} ms")
        if with_it < without * (1 - MARGIN):
            taken, best = taken | {family}, candidate
    choice = Choice(taken, "measured", ms)
    _store(key, choice)
    return choice


def _unmeasurable(gm: torch.fx.GraphModule, example_inputs) -> str:
    """Why running the graph a few more times would be wrong or impossible ('' if not)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is operator.setitem:
            return "the graph writes into a tensor"
        name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
        if n.op in ("call_function", "call_method") and isinstance(name, str) and name.endswith("_"):
            return f"the graph writes in place ({name})"
    for a in example_inputs:
        if isinstance(a, torch.SymInt) and a.node.hint is None:
            return "a size without a value"
        if isinstance(a, torch._subclasses.FakeTensor):
            return "fake inputs"
    return ""


def _concrete(a):
    return a.node.hint if isinstance(a, torch.SymInt) else a


def _race(runs: list, inputs: list) -> list:
    """Median milliseconds of each of ``runs`` on ``inputs``: alternating calls (the order
    turns every round), without gradients, the random state restored afterwards."""
    times = [[] for _ in runs]
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for run in runs:
            run(*inputs)
            run(*inputs)
        start, rounds = time.perf_counter(), 0
        while rounds < MAX_ROUNDS and (rounds < ROUNDS or time.perf_counter() - start < BUDGET_S):
            order = range(len(runs)) if rounds % 2 == 0 else reversed(range(len(runs)))
            for i in order:
                t0 = time.perf_counter()
                runs[i](*inputs)
                times[i].append(time.perf_counter() - t0)
            rounds += 1
    return [1e3 * statistics.median(t) for t in times]


def _key(gm: torch.fx.GraphModule, example_inputs, present: list) -> str:
    """What a stored choice is kept under: the graph's code, its inputs' types, the
    families it could take and the PyTorch version (the machine and Tessera's version
    are added by the store)."""
    inputs = [
        (tuple(a.shape), a.stride(), str(a.dtype), a.requires_grad) if isinstance(a, torch.Tensor) else repr(a)
        for a in example_inputs
    ]
    return "\n".join([gm.code, repr(inputs), ",".join(present), torch.__version__, str(torch.get_num_threads())])


def _stored(key: str):
    if config.get("TESSERA_TUNE") == "off":
        return None
    try:
        text = _tessera.stored_graph_choice(key)
    except ValueError as e:  # a corrupt entry, dropped: measure again
        warnings.warn(f"tessera: {e}", stacklevel=2)
        return None
    if text is None:
        return None
    entry = json.loads(text)
    return Choice(frozenset(entry["kernels"]), "stored", entry["ms"])


def _store(key: str, choice: Choice) -> None:
    try:
        _tessera.store_graph_choice(key, json.dumps({"kernels": sorted(choice.kernels), "ms": choice.ms}))
    except OSError as e:
        warnings.warn(f"tessera: the kernel choice is not kept ({e}): it is measured again next time", stacklevel=2)


def families(gm: torch.fx.GraphModule, substituted: Callable[[frozenset], dict]) -> list:
    """The kernel families the passes substitute in ``gm``, in the passes' order;
    ``substituted(kernels)`` gives what the passes of ``kernels`` substitute in a copy."""
    ordered = list(dict.fromkeys(kernel for kernel, _ in patterns.PASSES))
    return [k for k in ordered if substituted(frozenset({k}))]
