"""How a graph runs under ``kernels="auto"`` (the default on the Inductor path): which
kernel families are substituted, how Inductor compiles it, or whether it runs eagerly
after all. Every choice is measured; nothing is taken that does not make the graph
faster.

1. Kernels. Each family that applies to a graph is tried in :func:`families`'
   order: the graph with it added to the families already taken is compiled by
   Inductor and raced against the graph without it (calls alternating on the example
   inputs, medians); it is kept when it is faster by more than :data:`MARGIN`. What was
   kept must then win a second race, against the graph with no kernels, by the same
   margin, or nothing is taken. Families that only win inside a fusion Inductor would
   have made, or lose to Inductor's own code, are left out.
2. Inductor's layout optimization, for a graph with convolutions: Inductor turns their
   activations channels-last, which on some CPUs is slower than the contiguous layout
   (the zoo's ResNet-18: 1.45x eager's time). The graph compiled without it races the
   graph with it, and is taken when faster by the margin.
3. Eager. The compiled graph races the graph run eagerly (no kernels, no compiler); it
   is compiled only when it is faster by the margin. Eager is what the user had: a
   compiled graph that merely ties with it is not worth the risk (a ResNet-18 training
   step, compiled after winning its race, ran at 0.96-1.18x eager across processes).

The races run the graph many times: what a run may change (the inputs and
attributes it writes in place, every input that is not a parameter) is saved before
and put back after. A graph compiled with gradients on and inputs that require them
(training) is timed forward and backward (the gradients of its outputs for those inputs); any other graph,
forward only.

The decision is stored per graph (its code and input types), machine and Tessera
version in the cache directory (``graph-choices/``; ``TESSERA_TUNE=off`` ignores it), so
a later process compiles the chosen graph only. ``graph_stats()["choices"]`` gives each
graph's kernels, compiler, Inductor settings, how they were chosen and the timings.
"""

import contextlib
import json
import operator
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import _tessera, config
from . import onednn, patterns

#: A family is kept when the graph with it is this much faster than without.
MARGIN = 0.03
#: Each race runs at least this many rounds, and more until this many seconds passed.
ROUNDS, BUDGET_S, MAX_ROUNDS = 7, 1.0, 100


@dataclass
class Choice:
    """How one graph runs, and why."""

    kernels: frozenset
    how: str  # "measured", "stored", or why nothing was measured
    # per race, its two candidates' medians (ms): "+family" without and with the family
    # (added to those taken before it), "confirm" nothing and everything taken,
    # "-layout_optimization" with and without Inductor's layout optimization, "eager"
    # compiled and eager
    ms: dict = field(default_factory=dict)
    compiler: str = "inductor"  # or "eager"
    inductor: dict = field(default_factory=dict)  # Inductor config settings it compiles with
    training: bool = False  # the races timed forward and backward

    def record(self) -> dict:
        """The entry of ``graph_stats()["choices"]``."""
        return {
            "kernels": sorted(self.kernels),
            "compiler": self.compiler,
            "inductor": dict(self.inductor),
            "training": self.training,
            "how": self.how,
            "ms": dict(self.ms),
        }


def choose(
    gm: torch.fx.GraphModule,
    example_inputs,
    present: list,
    compile_with: Callable[[frozenset, dict], Callable],
    log: Callable[[str], None],
) -> Choice:
    """How ``gm`` runs fastest: the families of ``present`` (those the passes substitute
    in ``gm``) that earn their place, Inductor's settings, or eager.
    ``compile_with(kernels, settings)`` compiles the graph with ``kernels`` substituted
    under Inductor config ``settings``."""
    every = frozenset(present)
    why_not = _unmeasurable(gm, example_inputs)
    if why_not:
        return Choice(every, f"not measured ({why_not}): every kernel taken")
    key = _key(gm, example_inputs, present)
    stored = _stored(key, every)
    if stored is not None:
        return stored
    inputs = [_concrete(a) for a in example_inputs]
    # A graph compiled with gradients on (training) is timed forward and backward.
    wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad] if torch.is_grad_enabled() else []
    step = (lambda run: _with_backward(run, wrt)) if wrt else (lambda run: run)
    log(f"measuring how to run the graph ({', '.join(present) or 'no kernels to substitute'})")
    with torch.set_grad_enabled(bool(wrt)), _restored(_state(gm, inputs)):
        compile_step = lambda kernels, settings: step(compile_with(kernels, settings))  # noqa: E731
        taken, settings, best, ms = _compiled(gm, present, inputs, compile_step, log)
        compiled, eager = _race([best, step(gm.forward)], inputs)
    ms["eager"] = [round(compiled, 4), round(eager, 4)]
    log(f"compiled: {compiled:.3f} ms; eager: {eager:.3f} ms")
    if compiled < eager * (1 - MARGIN):
        choice = Choice(taken, "measured", ms, "inductor", settings, bool(wrt))
    else:
        choice = Choice(frozenset(), "measured", ms, "eager", training=bool(wrt))
    _store(key, choice)
    return choice


def _compiled(gm: torch.fx.GraphModule, present: list, inputs: list, compile_with, log) -> tuple:
    """How the graph is compiled best (steps 1 and 2 of the module's doc): the kernels
    taken, the Inductor settings, the graph compiled so, and the races' medians."""
    taken, best, ms = _kernels(present, inputs, compile_with, log)
    best, settings = best or compile_with(taken, {}), {}
    if _has_convolution(gm):
        plain = {"layout_optimization": False}
        candidate = compile_with(taken, plain)
        with_it, without = _race([best, candidate], inputs)
        ms["-layout_optimization"] = [round(with_it, 4), round(without, 4)]
        log(f"layout optimization: {with_it:.3f} ms; without: {without:.3f} ms")
        if without < with_it * (1 - MARGIN):
            best, settings = candidate, plain
    return taken, settings, best, ms


def _with_backward(run: Callable, wrt: list) -> Callable:
    """``run``, then the gradients of its outputs (ones as theirs) for ``wrt``."""

    def step(*inputs):
        outputs = [
            o for o in torch.utils._pytree.tree_leaves(run(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad
        ]
        if outputs:
            torch.autograd.grad(outputs, wrt, [torch.ones_like(o) for o in outputs], allow_unused=True)

    return step


def _kernels(present: list, inputs: list, compile_with, log) -> tuple:
    """The families of ``present`` that win their race and the confirming one (step 1
    of the module's doc), the graph compiled with them (None if nothing was compiled),
    and the races' medians."""
    taken, ms = frozenset(), {}
    if not present:
        return taken, None, ms
    plain = best = compile_with(taken, {})
    for family in present:
        candidate = compile_with(taken | {family}, {})
        without, with_it = _race([best, candidate], inputs)
        ms[f"+{family}"] = [round(without, 4), round(with_it, 4)]
        log(f"{'+'.join(sorted(taken)) or 'none'}: {without:.3f} ms; with {family}: {with_it:.3f} ms")
        if with_it < without * (1 - MARGIN):
            taken, best = taken | {family}, candidate
    if taken:
        # A second, independent race of the choice against no kernels at all: a win
        # that was the machine's noise rarely wins twice.
        without, with_them = _race([plain, best], inputs)
        ms["confirm"] = [round(without, 4), round(with_them, 4)]
        log(f"none: {without:.3f} ms; with {'+'.join(sorted(taken))}: {with_them:.3f} ms")
        if not with_them < without * (1 - MARGIN):
            taken, best = frozenset(), plain
    return taken, best, ms


def _has_convolution(gm: torch.fx.GraphModule) -> bool:
    """Whether Inductor's layout optimization (channels-last convolutions) applies."""
    names = (str(_name(n)) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
    return any(name.startswith("conv") and not name.startswith("convert") for name in names)


def _unmeasurable(gm: torch.fx.GraphModule, example_inputs) -> str:
    """Why running the graph a few more times is impossible ('' if not): its inputs
    are not real."""
    for a in example_inputs:
        if isinstance(a, torch.SymInt) and a.node.hint is None:
            return "a size without a value"
        if isinstance(a, torch._subclasses.FakeTensor):
            return "fake inputs"
    return ""


def _state(gm: torch.fx.GraphModule, inputs: list) -> list:
    """The tensors running the graph may change: those it writes in place (inputs and
    attributes: a cache, a step counter) and every input that is not a parameter
    (buffers, such as batch norm's running statistics, which an op updates without
    saying so in its name)."""
    value_of = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), inputs))
    state = [t for t in inputs if not isinstance(t, torch.nn.Parameter)]
    for n in gm.graph.nodes:
        written = _written_input(n)
        if written is not None and written.op == "get_attr":
            state.append(operator.attrgetter(written.target)(gm))
        elif written is not None:
            state.append(value_of.get(written))
    # Each tensor once: a buffer the graph also writes in place is saved a single time.
    return list({id(t): t for t in state if isinstance(t, torch.Tensor)}.values())


@contextlib.contextmanager
def _restored(tensors: list):
    """Runs the body, then puts ``tensors``' values back as they were before it: the
    races run the graph many times, and what a run writes must not stay."""
    with torch.no_grad():
        saved = [t.clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in zip(tensors, saved):
                t.copy_(value)


#: Ops whose result may share its input's memory.
_VIEWS = {
    "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "select", "narrow", "t",
    "flatten", "unflatten", "view_as", "expand_as", "reshape_as", "as_strided", "diagonal", "split", "chunk",
    "unbind", "getitem", "__getitem__", "contiguous", "detach", "to", "type_as", "movedim", "swapaxes",
}  # fmt: skip


def _name(n: torch.fx.Node) -> str:
    return n.target if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))


def _written_input(n: torch.fx.Node):
    """The graph input or attribute that ``n`` writes in place, through views; None if
    it writes nothing of them."""
    if n.op not in ("call_function", "call_method"):
        return None
    name = _name(n)
    if not (n.target is operator.setitem or (isinstance(name, str) and name.endswith("_") and not name.endswith("__"))):
        return None
    root = n.args[0] if n.args else None
    while isinstance(root, torch.fx.Node) and root.op in ("call_function", "call_method") and _name(root) in _VIEWS:
        root = root.args[0]
    if isinstance(root, torch.fx.Node) and root.op in ("placeholder", "get_attr"):
        return root
    return None


def _concrete(a):
    return a.node.hint if isinstance(a, torch.SymInt) else a


def _race(runs: list, inputs: list) -> list:
    """Median milliseconds of each of ``runs`` on ``inputs``: alternating calls (the order
    turns every round), the random state restored afterwards."""
    times = [[] for _ in runs]
    with torch.random.fork_rng(devices=[]):
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
    families it could take, the PyTorch version, thread count and whether gradients are
    on (the machine and Tessera's version are added by the store)."""
    inputs = [
        (tuple(a.shape), a.stride(), str(a.dtype), a.requires_grad) if isinstance(a, torch.Tensor) else repr(a)
        for a in example_inputs
    ]
    versions = [torch.__version__, str(torch.get_num_threads()), f"grad={torch.is_grad_enabled()}"]
    return "\n".join([gm.code, repr(inputs), ",".join(present), *versions])


def _stored(key: str, every: frozenset):
    """The choice stored under ``key`` (of the families in ``every``), if there is one."""
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
    kernels = frozenset(entry["kernels"]) & every
    compiler, settings = entry.get("compiler", "inductor"), entry.get("inductor", {})
    return Choice(kernels, "stored", entry["ms"], compiler, settings, entry.get("training", False))


def _store(key: str, choice: Choice) -> None:
    entry = {k: v for k, v in choice.record().items() if k != "how"}
    try:
        _tessera.store_graph_choice(key, json.dumps(entry))
    except OSError as e:
        warnings.warn(f"tessera: the kernel choice is not kept ({e}): it is measured again next time", stacklevel=2)


def families(gm: torch.fx.GraphModule, substituted: Callable[[frozenset], dict]) -> list:
    """The kernel families that apply to ``gm``: oneDNN's products first (they take
    most of a transformer's time, so the others are raced on the graph as it will
    mostly run), then those the passes substitute, in the passes' order;
    ``substituted(kernels)`` gives what the passes of ``kernels`` substitute in a copy."""
    ordered = list(dict.fromkeys(kernel for kernel, _ in patterns.PASSES))
    return [onednn.FAMILY] * onednn.present(gm) + [k for k in ordered if substituted(frozenset({k}))]
