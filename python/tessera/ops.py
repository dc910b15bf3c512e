"""The library ops as torch ops, registered from the specs the extension declares.

Each op is declared once in Rust, beside its kernel (``kernels::OpSpec``): schema, doc,
result types and a plan that checks a call and says what the kernel takes. This module
defines ``torch.ops.tessera.*`` from those specs, registers their CPU kernels (Rust,
through PyTorch's stable C interface: an eager call runs no Python below autograd),
their docstrings and one generic fake kernel, and offers :func:`plan` (the same checks
and parameters) to graph mode and the SDPA override.
"""

import os
from typing import Optional

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint

from . import _tessera

#: Every library op's spec by name: ``{name, schema, doc, outputs, returns}``.
SPECS = {spec["name"]: spec for spec in _tessera.op_specs()}

#: The ``tessera`` op library (``torch.library``) holding the definitions.
lib = torch.library.Library("tessera", "DEF")
for _spec in SPECS.values():
    # The kernels read contiguous storage: the tag lets Inductor write each input
    # contiguous where it is made (a fused producer), rather than the op copying it.
    lib.define(_spec["schema"], tags=(torch.Tag.needs_contiguous_strides,))
_tessera.register_cpu_kernels(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))

for _name, _spec in SPECS.items():
    _packet = getattr(torch.ops.tessera, _name)
    _packet.__doc__ = f"{_spec['schema']}\n\n{_spec['doc']}"

_PYTHON_ERRORS = {"ValueError": ValueError, "IndexError": IndexError, "MemoryError": MemoryError}


def python_error(e: RuntimeError) -> Exception:
    """The exception a native kernel's error stands for: its message starts with the
    Python exception's name (C++ exceptions reach Python as RuntimeError)."""
    kind, sep, message = str(e).partition(": ")
    error = _PYTHON_ERRORS.get(kind)
    return error(message) if sep and error else e


#: Each op's arguments by name with their defaults, in schema order.
_DEFAULTS = {
    name: {a.name: a.default_value for a in getattr(torch.ops.tessera, name).default._schema.arguments}
    for name in SPECS
}


def param_items(params: dict) -> list[str]:
    """Kernel parameters (ints, floats, bools, strings, None) as the ``name=value``
    items the kernels parse, in the form they print them: ``causal=true``,
    ``scale=none``, ``eps=1e-6`` (a float's shortest repr, its exponent unpadded)."""

    def text(value) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return "none"
        if isinstance(value, float):
            mantissa, e, exponent = repr(value).partition("e")
            return mantissa + (f"e{int(exponent)}" if e else "")
        return str(value)

    return [f"{k}={text(v)}" for k, v in params.items()]


def named_args(name: str, args, kwargs: dict) -> dict:
    """The arguments of a call of ``tessera::name`` by name, in schema order, defaults
    filled in."""
    named = dict(_DEFAULTS[name])
    named.update(zip(named, args))
    named.update(kwargs)
    return named


def schema_args(name: str, args, kwargs: dict) -> list:
    """The arguments of a call of ``tessera::name`` in schema order, defaults filled in."""
    return list(named_args(name, args, kwargs).values())


def _concrete(t: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in t.shape)


def _size(s) -> int:
    """A size as an int; a symbolic one by its hint, without a guard (a graph traced
    with dynamic shapes stays dynamic; the CPU kernel checks each real call)."""
    return s if isinstance(s, int) else optimization_hint(s, fallback=1)


def plan(name: str, args: list) -> dict:
    """The plan of a call of library op ``name`` (arguments in schema order, defaults
    filled; tensors real or fake): the kernel, its parameters, the operands and outputs
    as the kernel sees them. Raises ``ValueError`` with the eager op's message for a bad
    call."""
    values = tuple(
        (tuple(_size(s) for s in a.shape), str(a.dtype), a.device.type) if isinstance(a, torch.Tensor) else a
        for a in args
    )
    return _tessera.op_plan(name, values)


def refusal(name: str, *args) -> Optional[str]:
    """Why library op ``name`` refuses these arguments (schema order; omitted trailing
    ones take their defaults), or None when it takes them."""
    try:
        plan(name, schema_args(name, args, {}))
    except ValueError as e:
        return str(e)
    return None


def _result(out: dict, args: list) -> torch.Tensor:
    """One result of a fake call, by its spec's rule (works on symbolic sizes)."""
    kind, rule = out["shape"]
    if kind == "like":
        shape = args[rule].shape
    else:
        shape = [1 if d is None else args[d[0]].shape[d[1]] for d in rule]
    dtype = torch.float32 if out["dtype"] == "float32" else args[out["dtype"]].dtype
    first = next(a for a in args if isinstance(a, torch.Tensor))
    return first.new_empty(shape, dtype=dtype)


def _register_fake(name: str, spec: dict) -> None:
    """The fake kernel of ``tessera::name``: the op's checks (when the shapes are
    concrete; with symbolic ones the CPU kernel checks at run time) and its results."""

    def fake(*args, **kwargs):
        full = schema_args(name, args, kwargs)
        if all(_concrete(a) for a in full if isinstance(a, torch.Tensor)):
            plan(name, full)
        results = [_result(out, full) for out in spec["outputs"][: spec["returns"]]]
        return results[0] if len(results) == 1 else tuple(results)

    torch.library.register_fake(f"tessera::{name}", lib=lib)(fake)


for _name, _spec in SPECS.items():
    _register_fake(_name, _spec)
