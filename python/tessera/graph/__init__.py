"""Graph mode: ``torch.compile(model, backend="tessera")``.

After substitution the graph goes to Inductor (the default on CPU: Tessera's ops are its
extern kernels, the rest Inductor's generated code and caches, the float32 matrix
products of its forward and backward graphs oneDNN's, see ``onednn``; by default a
kernel family is substituted only where it makes the graph faster, see ``choose``) or, with
``options={"compiler": "xla"}`` (or ``TESSERA_GRAPH_COMPILER=xla``), down the XLA path
below, which TPU export shares.

Dynamo -> kernel substitution (``patterns``: attention, norms, softmax, SwiGLU become
``torch.ops.tessera.*``) -> AOTAutograd (forward and backward graphs, core ATen) ->
torch-mlir -> StableHLO with the Tessera ops as ``tessera_op`` custom calls (``lower``)
-> XLA through the two-tier compilation cache, on jaxlib's in-process CPU client
(``jaxlib_xla``: tensors in and out by DLPack) or the PJRT plugin
(``TESSERA_XLA_CLIENT=plugin``: inputs aliased where PJRT allows, outputs copied once
into tensors allocated here) -> a runner called with the tensors.

The backend never raises on a graph it cannot take: whatever fails (substitution,
AOTAutograd, lowering, compiling, a run) makes the graph run eagerly with one warning
naming the cause (``TESSERA_GRAPH_STRICT=1`` makes it an error). A graph with dynamic
shapes goes to Inductor with its symbolic sizes on the Inductor path; otherwise it is
compiled for each shape it is called with, up to a bound.
"""

import copy
import itertools
import os
import time
import warnings
from dataclasses import dataclass

import torch
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .. import _tessera, config, library
from ..trace import record_fallback
from . import choose, decompositions, jaxlib_xla, lower, onednn, patterns
from .lower import LoweringError

__all__ = ["GraphModeError", "explain_graph", "export", "graph_stats", "reset_graph_stats", "tessera_backend"]


class GraphModeError(RuntimeError):
    """Raised instead of falling back to eager when ``TESSERA_GRAPH_STRICT=1``."""


def _empty_stats() -> dict:
    return {
        "graphs": 0,
        "cache_hits": {"memory": 0, "disk": 0},
        "kernels": {},
        "fallbacks": {},
        "shapes": {},
        "choices": {},
        "inductor_cache": {counter: 0 for counter in _INDUCTOR_COUNTERS.values()},
    }


# Inductor's cache counters (torch._dynamo.utils.counters) -> their names in graph_stats().
_INDUCTOR_COUNTERS = {
    ("inductor", "fxgraph_cache_hit"): "fx_graph_hits",
    ("inductor", "fxgraph_cache_miss"): "fx_graph_misses",
}


_stats = _empty_stats()
_graph_ids = itertools.count()
_warned = set()


def graph_stats() -> dict:
    """``graphs`` (graphs compiled: forward and backward count apart on the XLA path, as
    one on Inductor's), ``cache_hits`` (the XLA path's ``{"memory": n, "disk": n}``),
    ``inductor_cache`` (the Inductor path's FX graph cache hits and misses), ``kernels``
    (``{kernel: calls in compiled graphs}``), ``fallbacks`` (``{op or pattern:
    reason}``), ``shapes`` (``{graph: shapes compiled}`` for graphs with
    dynamic shapes, ``"dynamic"`` when Inductor compiled it once for all), ``choices``
    (``{graph: {"kernels", "compiler", "inductor", "training", "how", "ms"}}``: how
    ``kernels="auto"`` runs each graph (its kernels; ``"inductor"`` or ``"eager"``; the
    Inductor settings it compiles with), whether the races timed forward and backward,
    how that was chosen, and each race's median milliseconds:
    ``"+family"`` without and with the family added to those taken before, ``"confirm"``
    none against all taken, ``"-layout_optimization"`` with and without Inductor's layout
    optimization, ``"eager"`` compiled against eager; see :mod:`tessera.graph.choose`)."""
    return copy.deepcopy(_stats)


def reset_graph_stats() -> None:
    """Zeroes :func:`graph_stats`."""
    global _stats
    _stats = _empty_stats()


def _debug(message: str) -> None:
    config.debug(f"graph: {message}")


def _fallback(what: str, reason: str) -> None:
    """Records that ``what`` runs eagerly; warns once; raises under strict mode."""
    _stats["fallbacks"][what] = reason
    record_fallback(what, reason)
    if config.get("TESSERA_GRAPH_STRICT") == "1":
        raise GraphModeError(f"tessera graph mode: {what}: {reason}")
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        warnings.warn(f"tessera graph mode: {what} runs eagerly: {reason}", stacklevel=3)


def _dump(name: str, text: str) -> None:
    directory = config.get("TESSERA_DUMP")
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)


# ---- the runner -----------------------------------------------------------------------


class _Runner:
    """Calls a compiled graph: tensors in, tensors out (``None`` where the graph returns
    ``None``, as backward graphs do for inputs without gradients). If a run fails, the
    graph runs eagerly from then on (with one warning naming the cause)."""

    def __init__(self, run, outputs: list, constants: list[torch.Tensor], eager, name: str):
        self.run = run  # contiguous input tensors (arguments, then constants) -> results
        self.outputs = outputs  # per graph output: (shape, dtype, element) or None
        self.constants = [c.contiguous() for c in constants]
        self.eager, self.name, self.failed = eager, name, False

    def __call__(self, *args):
        if self.failed:
            return self.eager(list(args))
        try:
            results = iter(self.run([a.contiguous() for a in args] + self.constants))
        except Exception as e:  # noqa: BLE001 - a failed run (a kernel's error included) runs eagerly
            self.failed = True
            _fallback(self.name, f"running the compiled graph failed: {_cause(e)}")
            return self.eager(list(args))
        return [None if o is None else next(results) for o in self.outputs]


def _plugin_runner(exe, elements: list[str], outputs: list):
    """``run(inputs) -> results`` on the PJRT plugin's executable ``exe``: the results
    are allocated here and written by the program."""

    def run(inputs: list) -> list:
        results = [torch.empty(o[0], dtype=o[1]) for o in outputs if o is not None]
        exe.run(
            [(t.data_ptr(), list(t.shape), e) for t, e in zip(inputs, elements)],
            [(t.data_ptr(), list(t.shape), o[2]) for t, o in zip(results, (o for o in outputs if o is not None))],
        )
        return results

    return run


def _xla_compile(text: str, elements: list[str], outputs: list):
    """``(run, client, source, ms)``: module ``text`` compiled (or loaded from the cache)
    on jaxlib's in-process CPU client, or on the PJRT plugin (``TESSERA_XLA_CLIENT``)."""
    if config.get("TESSERA_XLA_CLIENT", "jaxlib") == "jaxlib":
        if not jaxlib_xla.unavailable():
            run, source, ms = jaxlib_xla.compile_module(text)
            return run, "jaxlib", source, ms
        _debug(f"XLA on the plugin: {jaxlib_xla.unavailable()}")
    exe, source, ms = _tessera.graph_compile(text)
    return _plugin_runner(exe, elements, outputs), "plugin", source, ms


def _prepare(gm: torch.fx.GraphModule):
    """Checks the graph's inputs and outputs, drops ``None`` outputs from it, and returns
    the runner's input element names and output specs; raises ``LoweringError`` for what
    XLA cannot take."""
    elements = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise LoweringError(f"input {n.name} is a {type(v).__name__}, not a tensor")
        if lower.element_name(v.dtype) is None:
            raise LoweringError(f"input {n.name} has dtype {v.dtype}")
        if v.device.type != "cpu":
            raise LoweringError(f"input {n.name} is on {v.device} (graph mode runs CPU tensors)")
        elements.append(lower.element_name(v.dtype))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0]
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    specs = []
    for v in values:
        if v is None:
            specs.append(None)
            continue
        if not isinstance(v, torch.fx.Node) or not isinstance(v.meta.get("val"), torch.Tensor):
            raise LoweringError(f"graph output {v} is not a tensor")
        t = v.meta["val"]
        if lower.element_name(t.dtype) is None:
            raise LoweringError(f"output {v.name} has dtype {t.dtype}")
        specs.append((list(t.shape), t.dtype, lower.element_name(t.dtype)))
    output.args = (tuple(v for v in values if v is not None),)
    gm.recompile()
    return elements, specs


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm``'s graph over the same parameters and constants (no tensor is
    copied, so it is safe under AOTAutograd's fake mode, where copying a real constant
    raises)."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _cause(e: BaseException) -> str:
    """One line naming an unexpected failure: its type and first message line."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _compile(gm: torch.fx.GraphModule, example_inputs, *, name: str):
    """AOTAutograd's forward/backward compiler: lowers, compiles (or loads) and returns
    a boxed runner; ``gm`` itself, run eagerly, if anything fails. ``gm`` is never
    modified: the lowering works on a copy."""
    eager = make_boxed_func(gm.forward)
    t0 = time.perf_counter()
    try:
        with unset_fake_temporarily():
            work = _copy(gm)
            constants = lower.lift_constants(work)
            elements, specs = _prepare(work)
            text, kernels = lower.to_stablehlo(work)
            t1 = time.perf_counter()
            run, client, source, compile_ms = _xla_compile(text, elements, specs)
    except LoweringError as e:
        _fallback(name, str(e))
        return eager
    except Exception as e:  # noqa: BLE001 - a backend must not raise on a graph it cannot take
        _fallback(name, _cause(e))
        return eager
    _stats["graphs"] += 1
    if source in ("memory", "disk"):
        _stats["cache_hits"][source] += 1
    for k in kernels:
        _stats["kernels"][k] = _stats["kernels"].get(k, 0) + 1
    ops = text.count(" = stablehlo.") + text.count(' = "stablehlo.')
    summary = (
        f"{name}: {ops} StableHLO ops, {len(kernels)} Tessera kernels "
        f"({', '.join(sorted(set(kernels))) or 'none'}), import {1e3 * (t1 - t0):.0f} ms, "
        f"XLA ({client}) {compile_ms:.0f} ms ({source})"
    )
    _debug(summary)
    _dump(f"{name}.stablehlo.mlir", text)
    _dump(f"{name}.summary.txt", summary + "\n")
    return make_boxed_func(_Runner(run, specs, constants, eager, name))


# ---- the backend ----------------------------------------------------------------------


def _buffer_values(gm: torch.fx.GraphModule, example_inputs):
    """Values of placeholders that hold buffers (constant masks come from these)."""
    values = {}
    for n, v in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs):
        if isinstance(v, torch.Tensor) and not v.requires_grad and "_buffers_" in n.name:
            values[n] = v
    return values


def _constant_evaluator(gm: torch.fx.GraphModule, example_inputs):
    """``evaluate(node)``: the node's value if it depends only on buffers and constants
    (whatever the structure of its arguments: tuples, lists and slices of nodes, as
    Transformers indexes its masks), else None. A node's ancestors are evaluated in
    graph order, each once (no recursion, however deep the graph)."""
    known = _buffer_values(gm, example_inputs)
    position = {n: i for i, n in enumerate(gm.graph.nodes)}

    def one(node):
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            return value if isinstance(value, torch.Tensor) else None
        if node.op not in ("call_function", "call_method") or _random_or_in_place(node):
            return None
        if any(known.get(n) is None for n in node.all_input_nodes):
            return None
        args = torch.fx.node.map_arg(node.args, known.get)
        kwargs = torch.fx.node.map_arg(node.kwargs, known.get)
        try:
            with torch.no_grad():
                if node.op == "call_method":
                    return getattr(args[0], node.target)(*args[1:], **kwargs)
                return node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not evaluable here: not a constant
            return None

    def evaluate(node):
        if not isinstance(node, torch.fx.Node):
            return node
        todo, pending = [node], set()
        while todo:
            n = todo.pop()
            if n not in known and n not in pending:
                pending.add(n)
                todo.extend(n.all_input_nodes)
        for n in sorted(pending, key=position.__getitem__):
            known[n] = one(n)
        return known[node]

    return evaluate


_RANDOM = {
    "rand",
    "randn",
    "randint",
    "rand_like",
    "randn_like",
    "randint_like",
    "randperm",
    "bernoulli",
    "multinomial",
    "normal",
    "dropout",
    "uniform_",
    "normal_",
}


def _random_or_in_place(node: torch.fx.Node) -> bool:
    """Whether ``node`` draws random numbers or writes in place (never a constant)."""
    if node.op == "call_method":
        return node.target in _RANDOM or node.target.endswith("_")
    return getattr(node.target, "__name__", "") in _RANDOM


def _dynamic(example_inputs) -> bool:
    for t in example_inputs:
        if isinstance(t, torch.SymInt):
            return True
        if isinstance(t, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in t.shape):
            return True
    return False


COMPILERS = ("inductor", "xla")
#: Every kernel family graph mode may substitute: the passes' before AOTAutograd, and
#: on the Inductor path oneDNN's matrix products after it.
FAMILIES = patterns.KERNELS | {onednn.FAMILY}


@dataclass(frozen=True)
class Options:
    """What ``torch.compile(..., backend="tessera", options=...)`` asked for."""

    compiler: str  # after substitution: "inductor" or "xla" ("eager" when auto chose it)
    kernels: frozenset  # the kernels graph mode may substitute
    auto: bool = False  # substitute only those that make the graph faster (measured)
    inductor: tuple = ()  # Inductor config settings, as (name, value) pairs


def _options(options) -> Options:
    """The backend's options: ``options`` of ``torch.compile``, else the
    ``TESSERA_GRAPH_COMPILER`` and ``TESSERA_GRAPH_KERNELS`` variables, else Inductor and
    ``"auto"`` (the kernels that make the graph faster; on the XLA path, every kernel)."""
    options = dict(options or {})
    unknown = set(options) - {"compiler", "kernels"}
    if unknown:
        raise GraphModeError(f"unknown options {sorted(unknown)}: the tessera backend takes 'compiler' and 'kernels'")
    name = options.get("compiler") or config.get("TESSERA_GRAPH_COMPILER", "inductor")
    if name not in COMPILERS:
        raise GraphModeError(f"compiler {name!r}: expected one of {', '.join(COMPILERS)}")
    client = config.get("TESSERA_XLA_CLIENT", "jaxlib")
    if name == "xla" and client not in ("jaxlib", "plugin"):
        raise GraphModeError(f"TESSERA_XLA_CLIENT={client!r}: expected 'jaxlib' or 'plugin'")
    kernels = options.get("kernels", config.get("TESSERA_GRAPH_KERNELS", "auto"))
    if kernels == "auto":
        return Options(name, FAMILIES, auto=name == "inductor")
    if isinstance(kernels, str):
        kernels = {"all": FAMILIES, "none": ()}.get(kernels, [k for k in kernels.split(",") if k])
    kernels = frozenset(kernels)
    if kernels - FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise GraphModeError(f"kernels {sorted(kernels - FAMILIES)}: expected 'auto', 'all', 'none' or some of {known}")
    return Options(name, kernels)


def tessera_backend(gm: torch.fx.GraphModule, example_inputs, options=None, **kwargs):
    """The ``torch.compile`` backend ``"tessera"``. After substitution the graph goes to
    Inductor (``options={"compiler": "inductor"}``, the default: Tessera's ops as extern
    kernels) or to XLA (``"xla"``, the path TPU export shares). It never raises on a graph it cannot take (unless
    ``TESSERA_GRAPH_STRICT=1``): the graph then runs eagerly, with one warning naming
    the cause. A graph Dynamo traced with dynamic shapes goes to Inductor as it is (one
    compile for every shape) when that compiler is chosen and takes it, else is compiled
    for each shape it is called with (:class:`_PerShape`)."""
    graph_id = next(_graph_ids)
    chosen = _options(options)
    if _dynamic(example_inputs):
        if chosen.compiler == "inductor":
            run = _symbolic(gm, example_inputs, f"g{graph_id}", chosen)
            if run is not None:
                return run
        return _PerShape(gm, f"g{graph_id}", chosen)
    return _static(gm, example_inputs, f"g{graph_id}", chosen)


def _symbolic(gm: torch.fx.GraphModule, example_inputs, name: str, chosen: Options):
    """The dynamic graph substituted and compiled by Inductor with its symbolic sizes,
    or None when that fails (it is then compiled per shape)."""
    try:
        run = _substitute_and_compile(_copy(gm), example_inputs, name, chosen)
    except GraphModeError:
        raise
    except Exception as e:  # noqa: BLE001 - the per-shape path still takes the graph
        _debug(f"{name}: dynamic shapes not compiled symbolically ({_cause(e)}); compiling per shape")
        return None
    _stats["shapes"][name] = "dynamic"
    return run


def _static(gm: torch.fx.GraphModule, example_inputs, name: str, chosen: Options):
    """Compiles a graph of static shapes, or returns it to run eagerly if anything fails."""
    original = gm
    try:
        original = _copy(gm)
        return _substitute_and_compile(gm, example_inputs, name, chosen)
    except GraphModeError:
        raise
    except Exception as e:  # noqa: BLE001 - a backend must not raise on a graph it cannot take
        _fallback(f"graph {name}", _cause(e))
        return original.forward


def _max_shapes() -> int:
    value = config.get("TESSERA_GRAPH_SHAPES", "8")
    try:
        return max(int(value), 0)
    except ValueError:
        raise GraphModeError(f"TESSERA_GRAPH_SHAPES={value!r}: expected a count of shapes") from None


class _PerShape:
    """A graph with dynamic shapes (``dynamic=True``, ``mark_dynamic``, or Dynamo's
    automatic dynamic after a recompile, as ``generate()``'s growing cache gets): each
    call's concrete shapes get their own static graph (symbolic sizes and the scalars
    Dynamo passes as 0-d tensors baked in, shapes propagated again, then substitution
    and compilation as for any graph), at most ``TESSERA_GRAPH_SHAPES`` (8) per graph;
    further shapes run eagerly, said once. ``graph_stats()["shapes"]`` counts the
    shapes compiled per graph."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, chosen: Options):
        self.gm, self.name, self.chosen, self.compiled = gm, name, chosen, {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # Inputs read only through .item() (floats Dynamo did not specialize): their
        # values are part of the shape key and baked into the graph.
        self.scalars = {
            i
            for i, n in enumerate(placeholders)
            if n.users and all(u.op == "call_method" and u.target == "item" for u in n.users)
        }

    def __call__(self, *args):
        key = (torch.is_grad_enabled(),) + tuple(
            a.item()
            if i in self.scalars
            else (tuple(a.shape), a.stride(), a.dtype, a.requires_grad)
            if isinstance(a, torch.Tensor)
            else a
            for i, a in enumerate(args)
        )
        run = self.compiled.get(key)
        if run is None:
            if len(self.compiled) < _max_shapes():
                run = self._specialize(args, f"{self.name}s{len(self.compiled)}")
                _stats["shapes"][self.name] = len(self.compiled) + 1
            else:
                _fallback(
                    f"graph {self.name}",
                    f"more than {_max_shapes()} shapes (TESSERA_GRAPH_SHAPES): further shapes run eagerly",
                )
                run = self.gm.forward
            self.compiled[key] = run
        return run(*args)

    def _specialize(self, args, name: str):
        """The graph for these arguments: integer arguments (symbolic sizes) and the
        scalars become constants and are dropped from the call."""
        gm = _copy(self.gm)
        keep = []
        for i, (node, a) in enumerate(zip([n for n in gm.graph.nodes if n.op == "placeholder"], args)):
            keep.append(isinstance(a, torch.Tensor) and i not in self.scalars)
            if keep[-1]:
                continue
            if i in self.scalars:
                for item in list(node.users):
                    _bake(gm.graph, item, a.item())
            _bake(gm.graph, node, a)
        gm.recompile()
        tensors = [a for a, k in zip(args, keep) if k]
        try:
            FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*tensors)
        except Exception as e:  # noqa: BLE001 - the graph still runs eagerly
            _fallback(f"graph {name}", f"propagating shapes failed: {_cause(e)}")
            return self.gm.forward
        for n in gm.graph.nodes:
            if "val" in n.meta:
                n.meta["example_value"] = n.meta["val"]
        if self.chosen.auto:  # measured once, on the first shape, for every shape
            self.chosen = _choose(gm, tensors, name, self.chosen)
        run = _static(gm, tensors, name, self.chosen)
        return lambda *call: run(*[a for a, k in zip(call, keep) if k])


def _bake(graph: torch.fx.Graph, node: torch.fx.Node, value) -> None:
    """Replaces every use of ``node`` by the constant ``value`` and erases it."""
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda n: value if n is node else n)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n: value if n is node else n)
    graph.erase_node(node)


def _substitute_and_compile(gm: torch.fx.GraphModule, example_inputs, name: str, chosen: Options):
    """Substitutes the chosen Tessera kernels into ``gm`` and hands it to Inductor, or to
    AOTAutograd with :func:`_compile` (XLA) as the forward and backward compilers."""
    from torch._dynamo.backends.common import aot_autograd

    if chosen.auto:
        chosen = _choose(gm, example_inputs, name, chosen)
    if chosen.compiler == "eager":
        _debug(f"{name}: runs eagerly (faster than compiled)")
        return gm.forward
    _dump(f"{name}.fx_before.py", gm.code)
    report = patterns.substitute(gm, _constant_evaluator(gm, example_inputs), chosen.kernels)
    _dump(f"{name}.fx_after.py", gm.code)
    _stats["fallbacks"].update(report.skipped)
    for what, reason in report.skipped.items():
        record_fallback(what, reason)
    shapes = [tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)]
    _debug(
        f"{name}: new graph for input shapes {shapes}; substituted {report.substituted or 'nothing'}"
        + (f"; kept {report.skipped}" if report.skipped else "")
    )

    if chosen.compiler == "inductor":
        return _inductor(gm, example_inputs, name, report, chosen)

    def xla(kind):
        return lambda g, ex: _compile(g, ex, name=f"{name}.{kind}")

    return aot_autograd(fw_compiler=xla("forward"), bw_compiler=xla("backward"), decompositions=decompositions.table())(
        gm, example_inputs
    )


def _choose(gm: torch.fx.GraphModule, example_inputs, name: str, chosen: Options) -> Options:
    """``chosen`` with the kernels, compiler and Inductor settings that make ``gm``
    fastest (:func:`choose.choose`), recorded in ``graph_stats()["choices"]``; every
    kernel under Inductor's defaults if measuring fails."""
    from torch._inductor.compile_fx import compile_fx

    def substituted(kernels):
        """A copy of ``gm`` with ``kernels`` substituted, and what was."""
        work = _copy(gm)
        return work, patterns.substitute(work, _constant_evaluator(work, example_inputs), kernels).substituted

    def compile_with(kernels, settings):
        work, _ = substituted(kernels)
        # The backward is compiled now: a race that runs it must not compile it inside
        # the compile of the graph the race is for.
        with torch._functorch.config.patch(enable_autograd_cache=False, force_non_lazy_backward_lowering=True):
            return compile_fx(work, example_inputs, inner_compile=_inner_compile(settings, kernels))

    try:
        present = choose.families(gm, lambda kernels: substituted(kernels)[1])
        choice = choose.choose(gm, example_inputs, present, compile_with, lambda m: _debug(f"{name}: {m}"))
    except Exception as e:  # noqa: BLE001 - the graph is still compiled, with every kernel
        choice = choose.Choice(chosen.kernels, f"not measured ({_cause(e)}): every kernel taken")
    _stats["choices"][name] = choice.record()
    _debug(f"{name}: {choice.compiler}, kernels {sorted(choice.kernels) or 'none'} ({choice.how})")
    return Options(choice.compiler, choice.kernels, inductor=tuple(sorted(choice.inductor.items())))


def _inner_compile(settings: dict, kernels: frozenset, seen=None):
    """Inductor's ``compile_fx_inner`` under config ``settings``, for the forward graph
    now and the backward at its first run (outside the caller's config patch), after
    the ATen-level family of ``kernels`` (``onednn``) is substituted; ``seen(graph)`` is
    called with each graph as it is compiled."""
    from torch._inductor.compile_fx import compile_fx_inner

    def inner(graph_module, *args, **kwargs):
        if onednn.FAMILY in kernels:
            onednn.substitute(graph_module)
        if seen is not None:
            seen(graph_module.graph)
        with torch._inductor.config.patch(settings):
            return compile_fx_inner(graph_module, *args, **kwargs)

    return inner


def _inductor(gm: torch.fx.GraphModule, example_inputs, name: str, report, chosen: Options):
    """The substituted graph compiled by Inductor under the chosen config settings, run
    eagerly from then on if a run fails. The kernels are counted in the forward and
    backward graphs Inductor compiles; its FX graph cache serves them (hits and misses
    in ``graph_stats()["inductor_cache"]``), while AOTAutograd's cache, which would skip
    those graphs, is off for these compiles."""
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    def count_kernels(graph: torch.fx.Graph):
        # Called for the forward now and for the backward at its first run.
        for op, n in _kernel_nodes(graph).items():
            _stats["kernels"][op] = _stats["kernels"].get(op, 0) + n

    inner = _inner_compile(dict(chosen.inductor), chosen.kernels, count_kernels)
    eager = _copy(gm).forward

    def count_cache(graph_module, *args, **kwargs):
        before = {key: counters[key[0]][key[1]] for key in _INDUCTOR_COUNTERS}
        compiled = inner(graph_module, *args, **kwargs)
        for key, stat in _INDUCTOR_COUNTERS.items():
            _stats["inductor_cache"][stat] += counters[key[0]][key[1]] - before[key]
        return compiled

    with torch._functorch.config.patch(enable_autograd_cache=False):
        run = compile_fx(gm, example_inputs, inner_compile=count_cache)
    _stats["graphs"] += 1
    _debug(f"{name}: compiled by Inductor; substituted {report.substituted or 'nothing'}")
    state = {"run": run}

    def guarded(*args):
        try:
            return state["run"](*args)
        except GraphModeError:
            raise
        except Exception as e:  # noqa: BLE001 - a backend must not raise on a graph it cannot run
            if state["run"] is eager:
                raise
            state["run"] = eager
            _fallback(f"graph {name}", f"running the compiled graph failed: {_cause(e)}")
            return eager(*args)

    return guarded


def _kernel_nodes(graph: torch.fx.Graph) -> dict[str, int]:
    """The Tessera kernel calls in an ATen graph, named as on the XLA path (a forward op
    by its kernel, a user library op as ``namespace::op``)."""
    found = {}
    namespaces = {"tessera", "tessera_graph"} | library.namespaces()
    for n in graph.nodes:
        # OpOverloads after AOTAutograd, packets (torch.ops.tessera.x) as substituted.
        target = n.target
        if isinstance(target, torch._ops.OpOverload):
            qualified = target.name()
        elif isinstance(target, torch._ops.OpOverloadPacket):
            qualified = target._qualified_op_name
        else:
            continue
        namespace, _, op = qualified.partition("::")
        op = op.split(".")[0]
        if n.op != "call_function" or namespace not in namespaces:
            continue
        label = op.removesuffix("_fwd") if namespace in ("tessera", "tessera_graph") else f"{namespace}::{op}"
        found[label] = found.get(label, 0) + 1
    return found


def explain_graph(model, *args, **kwargs) -> dict:
    """Prints (and returns) what graph mode would substitute in ``model(*args)`` and why
    each recognised pattern was not, without compiling anything. Lists the passes that
    run before AOTAutograd; oneDNN's products (``onednn_matmul``), substituted in the
    graphs AOTAutograd makes, are counted in ``graph_stats()`` once compiled."""
    found = {"substituted": {}, "kept": {}}

    def backend(gm, example_inputs):
        report = patterns.substitute(gm, _constant_evaluator(gm, example_inputs))
        for op, n in report.substituted.items():
            found["substituted"][op] = found["substituted"].get(op, 0) + n
        found["kept"].update(report.skipped)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(*args, **kwargs)
    torch._dynamo.reset()
    for op, n in sorted(found["substituted"].items()):
        print(f"substituted: {op} x{n}")
    for pattern, why in sorted(found["kept"].items()):
        print(f"kept as plain StableHLO: {pattern}: {why}")
    return found


def export(model, *args, target: str = "tpu", path=None, mesh: int = 1) -> str:
    """The whole-model StableHLO of ``model(*args)`` (inference, one graph) with the
    substituted Tessera kernels as ``tpu_custom_call``s carrying their Mosaic bodies
    (``target="tpu"``) or as ``tessera_op`` calls to the native kernels (``"cpu"``).
    The module's arguments are the model's parameters and buffers (in
    ``named_parameters()``/``named_buffers()`` order as Dynamo lifts them), then
    ``args``. Written to ``path`` if given. A Tessera op the TPU rules reject, or an op
    torch-mlir cannot lower, raises ``GraphModeError`` naming it.

    ``mesh=N`` (TPU) exports for N devices on one mesh axis (``model``): each Tessera
    call that splits (attention over heads, row-wise ops over rows) sits in a
    manual-sharding region (``sdy.manual_computation``, as JAX's ``shard_map``) running
    its kernel on the local shard; XLA's partitioner shards the rest."""
    from torch._dynamo.backends.common import aot_autograd

    if target not in ("tpu", "cpu"):
        raise ValueError(f"export: target must be 'tpu' or 'cpu', got {target!r}")
    if not isinstance(mesh, int) or mesh < 1 or (mesh > 1 and target != "tpu"):
        raise ValueError(f"export: mesh must be a device count >= 1 (more than 1 for TPU only), got {mesh!r}")
    texts = []

    def forward_compiler(gm, example_inputs):
        try:
            lower.lift_constants(gm)
            _prepare(gm)
            texts.append(lower.to_stablehlo(gm, target, mesh)[0])
        except LoweringError as e:
            raise GraphModeError(f"export: {e}") from None
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        patterns.substitute(gm, _constant_evaluator(gm, example_inputs))
        return aot_autograd(fw_compiler=forward_compiler, decompositions=decompositions.table())(gm, example_inputs)

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, fullgraph=True)(*args)
    except Exception as e:
        cause, seen = e, set()
        while cause is not None and id(cause) not in seen:  # Dynamo wraps backend errors
            if isinstance(cause, GraphModeError):
                raise cause from None
            seen.add(id(cause))
            cause = getattr(cause, "inner_exception", None) or cause.__cause__ or cause.__context__
        raise
    finally:
        torch._dynamo.reset()
    if len(texts) != 1:
        raise GraphModeError(f"export: expected one graph, Dynamo produced {len(texts)}")
    if path is not None:
        with open(path, "w") as f:
            f.write(texts[0])
    return texts[0]
