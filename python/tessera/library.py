"""User op libraries: kernels written in another crate, as torch ops in one call.

A Rust ``cdylib`` exports ops with ``tessera::export_ops!`` (each op: a torch schema and
a function that builds its kernel for the argument types); ``load_library(path)``
registers them as ``torch.ops.<namespace>.<op>`` with a CPU kernel (the op's kernel on
Tessera's backends, the same path as the library ops) and a fake kernel (output types
from the kernel the library builds), so they work under ``torch.compile`` and
``torch.library.opcheck``. Autograd is optional: ``torch.library.register_autograd`` on
the op with a PyTorch formula, or a backward op from the same library.
"""

import os
import threading
import warnings

import torch

from . import _tessera, dtypes
from .autograd import TORCH_RELEASE, autograd_kernels

# PyTorch's index tensors are int64: kernels see them as int32 (range-checked).
_DTYPE_NAMES = {**dtypes.KERNEL, torch.int64: "i32"}
_TORCH_DTYPES = dtypes.TORCH
_INT32 = torch.iinfo(torch.int32)
_SCALAR_TYPES = {"float", "int", "bool"}

# Library id -> the torch.library fragment holding its ops (kept alive).
_fragments = {}
# Namespace -> {op name: parsed schema} and namespace -> library id, for graph mode.
_schemas = {}
_ids = {}
_lock = threading.Lock()


def namespaces():
    """The namespaces of the loaded op libraries."""
    return set(_schemas)


def call_params(node):
    """The custom-call parameters of an FX node calling a user op in graph mode:
    ``(params, [(tensor operand index, shape)], [(shape, dtype name)])``."""
    op = _schemas[node.target.namespace][node.target._opname]
    args = [a.meta.get("val") if hasattr(a, "meta") else a for a in node.args]
    kwargs = {k: (v.meta.get("val") if hasattr(v, "meta") else v) for k, v in node.kwargs.items()}
    request, tensors = _request(op, _bind(op, args, kwargs))
    lib = _ids[node.target.namespace]
    name = node.target._opname
    outputs = [(shape, d) for d, shape in _tessera.user_output_types(lib, name, request)]
    params = {"namespace": node.target.namespace, "op": name, "request": request.encode().hex()}
    return params, [(i, list(t.shape)) for i, (_, t) in enumerate(tensors)], outputs


def load_library(path):
    """Loads the op library at ``path`` and registers its ops; returns the namespace
    (``torch.ops.<namespace>``). Loading the same file again returns the same ops."""
    path = os.path.abspath(os.fspath(path))
    lib, namespace, schemas = _tessera.load_library(path)
    with _lock:
        if lib not in _fragments:
            parsed = [_parse(path, namespace, s) for s in schemas]
            fragment = torch.library.Library(namespace, "FRAGMENT")
            python_kernels = [_register(fragment, lib, namespace, s, op) for s, op in zip(schemas, parsed)]
            _register_kernels(fragment, lib, namespace, parsed, python_kernels)
            _fragments[lib] = fragment
            _schemas[namespace] = {op.name.split("::", 1)[1]: op for op in parsed}
            _ids[namespace] = lib
    return getattr(torch.ops, namespace)


def _parse(path, namespace, schema):
    """The parsed schema of one exported op, checked against what Tessera can call."""
    try:
        op = torch._C.parse_schema(f"{namespace}::{schema}")
    except RuntimeError as e:
        raise ValueError(f"{path}: op schema `{schema}` is malformed: {e}") from None
    name = op.name.split("::", 1)[1]
    for a in op.arguments:
        if str(a.type) != "Tensor" and str(a.type) not in _SCALAR_TYPES:
            raise ValueError(
                f"{path}: op `{name}` argument `{a.name}` has type {a.type}; "
                "op libraries take Tensor, float, int and bool arguments"
            )
    if not op.returns or any(str(r.type) != "Tensor" for r in op.returns):
        raise ValueError(f"{path}: op `{name}` must return one or more Tensors")
    return op


def _bind(op, args, kwargs):
    """The op's arguments in schema order: ``[(argument, value)]``."""
    if len(args) > len(op.arguments):
        raise TypeError(f"{op.name}: takes {len(op.arguments)} arguments, got {len(args)}")
    bound = []
    for i, a in enumerate(op.arguments):
        if i < len(args):
            value = args[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        elif a.has_default_value():
            value = a.default_value
        else:
            raise TypeError(f"{op.name}: missing argument `{a.name}`")
        bound.append((a, value))
    return bound


def _request(op, bound):
    """The build request (one ``name value`` line per argument) and the tensor inputs."""
    lines, tensors = [], []
    for a, value in bound:
        if str(a.type) == "Tensor":
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{op.name}: {a.name}: expected a tensor, got {type(value).__name__}")
            if value.dtype not in _DTYPE_NAMES:
                raise ValueError(
                    f"{op.name}: {a.name}: dtype {value.dtype} is not supported "
                    f"({', '.join(str(d) for d in _DTYPE_NAMES)})"
                )
            shape = ", ".join(str(int(d)) for d in value.shape)
            lines.append(f"{a.name} {_DTYPE_NAMES[value.dtype]}[{shape}]")
            tensors.append((a.name, value))
        else:
            lines.append(f"{a.name} {float(value)!r}")
    return "\n".join(lines) + "\n", tensors


def _as_int32(op, arg, t):
    """``t``, with an int64 tensor converted to int32 (``IndexError`` naming the first
    value int32 cannot hold, as the native kernels say)."""
    if t.dtype != torch.int64:
        return t
    bad = ((t < _INT32.min) | (t > _INT32.max)).flatten().nonzero()
    if len(bad):
        i = int(bad[0])
        raise IndexError(
            f"{op.name}: {arg}: int64 value {int(t.flatten()[i])} (element {i}) is out of "
            "the int32 range Tessera's kernels index with"
        )
    return t.to(torch.int32)


def _register_kernels(fragment, lib, namespace, ops, python_kernels):
    """Registers the CPU kernels of ``ops``: native (Rust, as the library ops' are, behind
    the native autograd kernels, which give their errors' Python type) when this build
    has them, else ``python_kernels``."""
    names = [op.name.split("::", 1)[1] for op in ops]
    if autograd_kernels() == "native":
        try:
            _tessera.register_native_autograd(names, TORCH_RELEASE, namespace)
            _tessera.register_user_kernels(
                lib, namespace, [(n, [(a.name, str(a.type)) for a in op.arguments]) for n, op in zip(names, ops)]
            )
            return
        except (ValueError, RuntimeError) as e:
            warnings.warn(f"tessera: {namespace}: the ops' CPU kernels stay in Python: {e}", stacklevel=2)
    for name, kernel in zip(names, python_kernels):
        fragment.impl(name, kernel, "CPU")


def _register(fragment, lib, namespace, schema, op):
    """Defines ``op`` with its fake kernel; returns its Python CPU kernel."""
    name = op.name.split("::", 1)[1]
    fragment.define(schema)

    def output_types(request):
        return [(_TORCH_DTYPES[d], shape) for d, shape in _tessera.user_output_types(lib, name, request)]

    def kernel(*args, **kwargs):
        request, tensors = _request(op, _bind(op, args, kwargs))
        for arg, t in tensors:
            if t.device.type != "cpu":
                raise ValueError(f"{op.name}: {arg}: Tessera ops run on CPU tensors, got device {t.device}")
        inputs = [_as_int32(op, arg, t).contiguous() for arg, t in tensors]
        outputs = [torch.empty(shape, dtype=dtype) for dtype, shape in output_types(request)]
        _tessera.run_user(
            lib,
            name,
            request,
            [(t.data_ptr(), list(t.shape), _DTYPE_NAMES[t.dtype]) for t in inputs],
            [(t.data_ptr(), list(t.shape), _DTYPE_NAMES[t.dtype]) for t in outputs],
            _tessera.current_backend(),
        )
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def fake(*args, **kwargs):
        request, tensors = _request(op, _bind(op, args, kwargs))
        devices = {t.device for _, t in tensors}
        if len(devices) > 1:
            raise ValueError(f"{op.name}: tensor arguments are on different devices: {sorted(map(str, devices))}")
        device = devices.pop() if devices else torch.device("cpu")
        outputs = [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in output_types(request)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    torch.library.register_fake(f"{namespace}::{name}", fake, lib=fragment)
    return kernel
