"""ATen graph -> StableHLO text, with Tessera ops as custom calls.

torch-mlir imports the graph (a maintained importer, not a table of ATen ops here). Each
``torch.ops.tessera.*`` node arrives as a ``torch.operator``; before torch-mlir's
pipelines run, it is replaced by ``stablehlo.custom_call @tessera_op`` (reshaping
operands to the kernel's shapes and results back), whose ``backend_config`` names the
library op and its parameters. On CPU that target is the native kernel registered as
an XLA FFI handler (``runtime::custom_call``).

Two details of torch-mlir shape the code: its Python bindings do not register the
``torch_c`` dialect, so ``builtin.unrealized_conversion_cast`` stands in for the casts
around the call until the torch backend form, then becomes the ``torch_c`` casts (built
unregistered) and the StableHLO pipeline runs in ``torch-mlir-opt``. Every edit of the
module goes through MLIR's Python bindings: torch-mlir's, and jaxlib's for the ``sdy``
ops of a sharded TPU export.
"""

import collections
import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from .. import _tessera, config, dtypes, library, ops

TARGET = "tessera_op"
# The custom call `op` of user library ops (the runner finds them by namespace).
USER_OP = "user_op"

# Torch dialect element types -> builtin ones (MLIR's two spellings of the runtime's
# elements: signed integers are `si32` in the torch dialect, `i32` in builtin types).
_ELEMENT = {
    "f32": "f32",
    "f64": "f64",
    "bf16": "bf16",
    "f16": "f16",
    "si64": "i64",
    "si32": "i32",
    "si16": "i16",
    "si8": "i8",
    "ui8": "ui8",
    "i1": "i1",
}


class LoweringError(Exception):
    """The graph cannot be lowered to StableHLO; the message says which op and why."""


@dataclass
class KernelCall:
    """How one Tessera op node becomes a custom call."""

    kernel: str  # library op name
    params: dict[str, object]  # its parameters: library ops' typed (int, float, bool, str, None)
    inputs: list[tuple[int, list]]  # (tensor operand index, shape the kernel wants)
    outputs: list[tuple[list, str]]  # (shape, element type) of each kernel output
    results: list[int]  # node result i -> kernel output results[i]
    # How it splits over devices: the split dim of each input and output (None: whole)
    # and the parameters the split divides; None when it runs whole on every device.
    split: Optional[tuple[list, list, list]] = None

    def params_text(self) -> str:
        """The params as the custom call's comma-separated ``name=value`` text."""
        return ",".join(ops.param_items(self.params))

    @property
    def label(self) -> str:
        """The op's name in graph stats: the library op, or ``namespace::op``."""
        if self.kernel == USER_OP:
            return f"{self.params['namespace']}::{self.params['op']}"
        return self.kernel


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def kernel_call(node: torch.fx.Node) -> KernelCall:
    """The custom call for a ``torch.ops.tessera.*`` (or loaded user library's) node of an
    ATen graph: the op's plan (the eager op's checks and kernel parameters) on the
    node's argument values."""
    if node.target.namespace != "tessera":
        params, ins, outs = library.call_params(node)
        return KernelCall(USER_OP, params, ins, outs, list(range(len(outs))))
    name = node.target._opname
    named = _named_args(node, list(node.args))
    args = list(named.values())
    try:
        plan = ops.plan(name, [_val(a) if isinstance(a, torch.fx.Node) else a for a in args])
    except ValueError as e:
        raise LoweringError(f"tessera.{name}: {e}") from None
    # The custom call's operands are the node's tensor arguments, in order.
    operand = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.fx.Node):
            operand[i] = len(operand)
    ins = [(operand[arg], list(shape)) for arg, shape, _, _ in plan["inputs"]]
    outs = [(list(shape), dtype) for shape, dtype in plan["outputs"]]
    spec = ops.SPECS[name]
    split = _split(spec, plan, list(named), [_val(a) for a in args])
    return KernelCall(plan["kernel"], dict(plan["params"]), ins, outs, list(range(spec["returns"])), split)


def _split(spec: dict, plan: dict, names: list, values: list):
    """The op's first declared split that divides kernel parameters, in the kernel's
    view: each operand's split dim (an operand the kernel sees reshaped, as the row-wise
    ops see ``[rows, cols]``, splits its first dim), each output's, and the parameters."""
    split = next((s for s in spec["splits"] if s["divides"]), None)
    if split is None:
        return None
    axes = dict(split["args"])
    ins = []
    for arg, shape, _, _ in plan["inputs"]:
        axis = axes.get(names[arg])
        if axis is None or axis == "mask_batch":
            ins.append(None)
        else:
            same_view = values[arg] is not None and list(values[arg].shape) == list(shape)
            ins.append(axis if isinstance(axis, int) and same_view else 0)
    outs = [0 if p == "same" else p for p in split["outputs"]][: len(plan["outputs"])]
    return ins, outs, split["divides"]


_ATTENTION = ("flash_attention", "flash_attention_fwd", "flash_attention_bwd")


def kernel_masks(gm: torch.fx.GraphModule):
    """Gives every attention node's score mask the form the kernel takes, f32 ``[batch or
    1, 1, q_len, kv_len]`` (additive; a boolean mask's hidden keys ``-inf``), with ATen
    nodes before it that XLA fuses; masks already in that form are left alone."""
    graph = gm.graph
    for node in list(graph.nodes):
        if (
            node.op != "call_function"
            or getattr(node.target, "namespace", None) != "tessera"
            or node.target._opname not in _ATTENTION
        ):
            continue
        named = _named_args(node, list(node.args))
        mask = named["mask"]
        if not isinstance(mask, torch.fx.Node):
            continue
        m = _val(mask)
        values = [_val(a) if isinstance(a, torch.fx.Node) else a for a in named.values()]
        shape = next(shape for _, shape, _, is_mask in ops.plan(node.target._opname, values)["inputs"] if is_mask)
        if m.dtype == torch.float32 and list(m.shape) == shape:
            continue

        # Called within this iteration only: `node` and `m` are the current ones.
        def add(target, *args, **kwargs):
            with graph.inserting_before(node):  # noqa: B023
                new = graph.call_function(target, args, kwargs)
            with getattr(m, "fake_mode", None) or contextlib.nullcontext():  # noqa: B023
                new.meta["val"] = target(*[_val(a) if isinstance(a, torch.fx.Node) else a for a in args], **kwargs)
            new.meta["tensor_meta"] = _extract_tensor_metadata(new.meta["val"])
            return new

        aten = torch.ops.aten
        if m.dtype == torch.bool:
            additive = add(aten.where.Scalar, mask, 0.0, float("-inf"))
        else:
            additive = add(aten._to_copy.default, mask, dtype=torch.float32)
        formed = add(aten.expand.default, additive, shape) if list(m.shape) != shape else additive
        if formed.meta["val"].shape != tuple(shape) or not formed.meta["val"].is_contiguous():
            formed = add(aten.clone.default, formed, memory_format=torch.contiguous_format)
        node.replace_input_with(mask, formed)


def _named_args(node: torch.fx.Node, args: list) -> dict:
    """Every argument of a Tessera op node by its schema name, defaults filled in."""
    return ops.named_args(node.target._opname, args, node.kwargs)


def lift_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Turns tensor ``get_attr`` nodes into trailing inputs (a compiled module then
    holds no weights or buffers, and its cache key does not depend on their values);
    returns their values."""
    constants = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    for n in list(gm.graph.nodes):
        if n.op != "get_attr":
            continue
        value = getattr(gm, n.target)
        if not isinstance(value, torch.Tensor):
            continue
        if last is None:
            with gm.graph.inserting_before(next(iter(gm.graph.nodes))):
                p = gm.graph.placeholder(f"_const_{len(constants)}")
        else:
            with gm.graph.inserting_after(last):
                p = gm.graph.placeholder(f"_const_{len(constants)}")
        p.meta["val"] = value
        p.meta["tensor_meta"] = _extract_tensor_metadata(value)  # what torch-mlir reads
        n.replace_all_uses_with(p)
        gm.graph.erase_node(n)
        last = p
        constants.append(value)
    gm.graph.lint()
    gm.recompile()
    return constants


def _dense_literals():
    """torch-mlir importer hooks that import a tensor literal (a constant not lifted to
    an input) as ``dense<...>`` elements, as torch-mlir does for one-element tensors;
    its ``dense_resource`` blobs for larger ones are rejected by XLA."""
    from torch_mlir import ir
    from torch_mlir.extras import fx_importer as importer

    class DenseLiterals(importer.FxImporterHooks):
        def resolve_literal(self, gni, literal, info):
            if not isinstance(literal, torch.Tensor) or literal.dtype not in importer.TORCH_DTYPE_TO_NPY_TYPE:
                return None  # torch-mlir's own import
            array = np.array(literal.tolist()).astype(importer.TORCH_DTYPE_TO_NPY_TYPE[literal.dtype])
            element = importer.TORCH_DTYPE_TO_MLIR_TYPE[literal.dtype]()
            dims = ",".join(str(d) for d in literal.shape)
            vtensor = ir.Type.parse(f"!torch.vtensor<[{dims}],{importer.TORCH_DTYPE_TO_MLIR_TYPE_ASM[literal.dtype]}>")
            value = ir.DenseElementsAttr.get(array, type=element, shape=array.shape)
            return ir.Operation.create("torch.vtensor.literal", results=[vtensor], attributes={"value": value}).result

    return DenseLiterals()


def _parse_vtensor(torch_type: str) -> tuple[list[int], str]:
    """Dims and builtin element type of a ``!torch.vtensor<[d0,d1],et>``."""
    m = re.fullmatch(r"!torch\.vtensor<\[([\d,]*)\],(\w+)>", torch_type)
    if not m or m.group(2) not in _ELEMENT:
        raise LoweringError(f"operand type {torch_type} is not supported")
    dims, element = m.groups()
    return [int(d) for d in dims.split(",") if d], _ELEMENT[element]


def _tensor_type(shape, element) -> str:
    return f"tensor<{''.join(f'{d}x' for d in shape)}{element}>"


def _builtin_type(torch_type: str) -> str:
    return _tensor_type(*_parse_vtensor(torch_type))


def _walk(op, out):
    for region in op.regions:
        for block in region.blocks:
            for o in block.operations:
                out.append(o)
                _walk(o, out)
    return out


def _custom_call(ir, call: KernelCall, operands, target: str):
    """The custom call running ``call``: ``tessera_op`` (CPU: the native kernel through
    XLA FFI) or ``tpu_custom_call`` (TPU: the kernel's Mosaic body)."""
    results = [ir.Type.parse(_tensor_type(s, e)) for s, e in call.outputs]
    if target == "cpu":
        config = {"op": ir.StringAttr.get(call.kernel), "params": ir.StringAttr.get(call.params_text())}
        attributes = {
            "call_target_name": ir.StringAttr.get(TARGET),
            "api_version": ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 4),
            "backend_config": ir.DictAttr.get(config),
        }
    else:
        try:
            config, name = _tessera.tpu_custom_call_config(call.kernel, ops.param_items(call.params), len(call.inputs))
        except ValueError as e:
            raise LoweringError(f"TPU: {e}") from None

        def layouts(shapes):
            return ir.ArrayAttr.get(
                [
                    ir.Attribute.parse(
                        f"dense<[{', '.join(str(d) for d in reversed(range(len(s))))}]> : tensor<{len(s)}xindex>"
                    )
                    for s in shapes
                ]
            )

        attributes = {
            "call_target_name": ir.StringAttr.get("tpu_custom_call"),
            "backend_config": ir.StringAttr.get(config),
            "kernel_name": ir.StringAttr.get(name),
            "operand_layouts": layouts([s for _, s in call.inputs]),
            "result_layouts": layouts([s for s, _ in call.outputs]),
        }
    return ir.Operation.create("stablehlo.custom_call", results=results, operands=operands, attributes=attributes)


def _replace_operators(module, calls: list[KernelCall], target: str):
    """Replaces the i-th ``torch.operator`` with the i-th custom call."""
    from torch_mlir import ir

    ops = [o for o in _walk(module.operation, []) if o.operation.name == "torch.operator"]
    if len(ops) != len(calls):
        kernels = {"tessera"} | library.namespaces()
        names = collections.Counter(ir.StringAttr(o.operation.attributes["name"]).value for o in ops)
        failed = [f"{n} (x{c})" if c > 1 else n for n, c in names.items() if n.split(".")[1] not in kernels]
        raise LoweringError(f"torch-mlir could not import these ops: {', '.join(failed)}")
    for o, call in zip(ops, calls):
        name = ir.StringAttr(o.operation.attributes["name"]).value
        if name.split(".")[1] not in {"tessera"} | library.namespaces():
            raise LoweringError(f"torch-mlir could not import {name}")
        with ir.InsertionPoint(o), o.location:
            tensors = [v for v in o.operands if str(v.type).startswith("!torch.vtensor")]
            operands = []
            for index, shape in call.inputs:
                v = tensors[index]
                dims, element = _parse_vtensor(str(v.type))
                builtin = ir.Type.parse(_tensor_type(dims, element))
                cast = ir.Operation.create("builtin.unrealized_conversion_cast", results=[builtin], operands=[v])
                value = cast.result
                want = _tensor_type(shape, element)
                if dims != list(shape):
                    value = ir.Operation.create(
                        "stablehlo.reshape", results=[ir.Type.parse(want)], operands=[value]
                    ).result
                operands.append(value)
            custom = _custom_call(ir, call, operands, target)
            for result, j in zip(o.results, call.results):
                value = custom.results[j]
                builtin = _builtin_type(str(result.type))
                if str(value.type) != builtin:
                    value = ir.Operation.create(
                        "stablehlo.reshape", results=[ir.Type.parse(builtin)], operands=[value]
                    ).result
                back = ir.Operation.create(
                    "builtin.unrealized_conversion_cast", results=[result.type], operands=[value]
                )
                result.replace_all_uses_with(back.result)
        o.operation.erase()


def _opt_binary() -> str:
    from torch_mlir import _mlir_libs

    return os.path.join(os.path.dirname(_mlir_libs.__file__), "torch-mlir-opt")


def _torch_c_casts(module, ir) -> None:
    """Each ``builtin.unrealized_conversion_cast`` (how :func:`_replace_operators` joins
    torch and builtin tensor types while torch-mlir's in-process passes run) becomes the
    ``torch_c`` cast of its direction, which ``torch-mlir-opt``'s StableHLO pipeline
    takes. (The ``torch_c`` dialect is not in the Python bindings: the ops are created
    unregistered and printed in generic form.)"""
    module.context.allow_unregistered_dialects = True
    for o in _walk(module.operation, []):
        if o.operation.name != "builtin.unrealized_conversion_cast":
            continue
        source = o.operands[0]
        to_builtin = str(source.type).startswith("!torch.vtensor")
        name = "torch_c.to_builtin_tensor" if to_builtin else "torch_c.from_builtin_tensor"
        with ir.InsertionPoint(o), o.location:
            cast = ir.Operation.create(name, results=[o.results[0].type], operands=[source])
        o.results[0].replace_all_uses_with(cast.result)
        o.operation.erase()


def _stablehlo_pipeline(text: str) -> str:
    pipeline = "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"
    r = subprocess.run([_opt_binary(), f"-pass-pipeline={pipeline}"], input=text, capture_output=True, text=True)
    if r.returncode != 0:
        raise LoweringError(_first_line_of_interest(r.stderr))
    return r.stdout


def to_stablehlo(gm: torch.fx.GraphModule, target: str = "cpu", mesh: int = 1) -> tuple[str, list[str]]:
    """The StableHLO text of a functional ATen graph whose inputs are all tensors, and
    the op name of each custom call in it (``KernelCall.label``). ``target`` is ``cpu`` (Tessera ops
    as ``tessera_op`` FFI calls) or ``tpu`` (as ``tpu_custom_call``s); for ``tpu`` with
    ``mesh`` devices, each call runs on its shard in a manual-sharding region
    (:func:`shard_calls`)."""
    from torch_mlir import fx, ir
    from torch_mlir._mlir_libs import _stablehlo
    from torch_mlir.compiler_utils import OutputType, lower_mlir_module, run_pipeline_with_repro_report
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras.fx_importer import FxImporter

    kernel_namespaces = {"tessera"} | library.namespaces()
    kernel_masks(gm)
    calls = [
        kernel_call(n)
        for n in gm.graph.nodes
        if n.op == "call_function" and getattr(n.target, "namespace", None) in kernel_namespaces
    ]
    context = ir.Context()
    torch_d.register_dialect(context)
    diagnostics = []

    def collect(d):
        diagnostics.append(str(d))
        return True

    context.attach_diagnostic_handler(collect)
    _stablehlo.register_dialect(context)
    try:
        importer = FxImporter(context=context, hooks=_dense_literals())
        module = fx.stateless_fx_import(gm, output_type="raw", fx_importer=importer)
        if calls:
            _replace_operators(module, calls, target)
        run_pipeline_with_repro_report(
            module,
            "builtin.module(func.func(torch-match-quantized-custom-ops), "
            "torchdynamo-export-to-torch-backend-pipeline{ extra-library=})",
            "Lowering TorchFX IR -> Torch Backend IR",
        )
        if calls:
            _torch_c_casts(module, ir)
            lowered = _stablehlo_pipeline(module.operation.get_asm(print_generic_op_form=True))
            module = ir.Module.parse(lowered, context)
        else:
            module = lower_mlir_module(False, OutputType.STABLEHLO, module)
        _stable_constants(module, ir)
        text = str(module)
    except LoweringError:
        raise
    except Exception as e:  # torch-mlir reports unsupported ops as exceptions of its own
        raise LoweringError(_first_line_of_interest("\n".join(diagnostics) + "\n" + str(e))) from None
    if "dense_resource" in text:
        raise LoweringError("the graph embeds a tensor constant XLA cannot take (dense_resource)")
    if mesh > 1 and target == "tpu":
        text = shard_calls(text, calls, mesh)
    return text, [c.label for c in calls]


# ---- sharded TPU export: each Tessera call in a manual-sharding region ----------------

MESH_AXIS = "model"


def _sharded_dims(call: KernelCall, mesh: int):
    """How ``call`` splits over ``mesh`` devices: the sharded dim of each input and
    output (``None``: replicated) and the parameters of the local kernel; ``None`` when
    it does not split (it then runs whole on every device)."""
    if call.split is None:
        return None
    ins, outs, divides = call.split
    p = dict(call.params)
    for name in divides:
        if p[name] % mesh:
            return None
        p[name] //= mesh
    return ins, outs, p


def _local_type(ir, t, dim, mesh: int):
    """``t`` with dim ``dim`` (``None``: none) divided over ``mesh`` devices."""
    t = ir.RankedTensorType(t)
    shape = list(t.shape)
    if dim is not None:
        shape[dim] //= mesh
    return ir.RankedTensorType.get(shape, t.element_type)


def _sharding(ir, sdy, t, dim):
    """``t`` sharded over the mesh axis on dim ``dim`` (``None``: replicated)."""
    t = ir.RankedTensorType(t)
    axes = [[sdy.AxisRefAttr.get(MESH_AXIS)] if d == dim else [] for d in range(t.rank)]
    dims = [sdy.DimensionShardingAttr.get(a, is_closed=True) for a in axes]
    return sdy.TensorShardingAttr.get(ir.FlatSymbolRefAttr.get("mesh"), dims, replicated_axes=[], unreduced_axes=[])


def _manual_region(ir, sdy, op, call: KernelCall, split, mesh: int) -> None:
    """Replaces the ``tpu_custom_call`` ``op`` by an ``sdy.manual_computation`` whose
    body runs ``call``'s kernel built for the local shapes of ``split``."""
    ins, outs, params = split
    in_types = [v.type for v in op.operands]
    out_types = [r.type for r in op.results]
    try:
        config, name = _tessera.tpu_custom_call_config(call.kernel, ops.param_items(params), len(call.inputs))
    except ValueError as e:
        raise LoweringError(f"TPU: {e}") from None
    shardings = lambda types, dims: sdy.TensorShardingPerValueAttr.get(  # noqa: E731
        [_sharding(ir, sdy, t, d) for t, d in zip(types, dims)]
    )
    with ir.InsertionPoint(op), op.location:
        region = sdy.ManualComputationOp(
            out_types,
            list(op.operands),
            shardings(in_types, ins),
            shardings(out_types, outs),
            sdy.ManualAxesAttr.get([ir.StringAttr.get(MESH_AXIS)]),
        )
        block = ir.Block.create_at_start(region.body, [_local_type(ir, t, d, mesh) for t, d in zip(in_types, ins)])
        attributes = {name: op.attributes[name] for name in op.attributes}
        attributes["backend_config"] = ir.StringAttr.get(config)
        if "kernel_name" in attributes:
            attributes["kernel_name"] = ir.StringAttr.get(name)
        with ir.InsertionPoint(block):
            local = ir.Operation.create(
                "stablehlo.custom_call",
                results=[_local_type(ir, t, d, mesh) for t, d in zip(out_types, outs)],
                operands=list(block.arguments),
                attributes=attributes,
            )
            sdy.ReturnOp(list(local.results))
    for old, new in zip(op.results, region.results):
        old.replace_all_uses_with(new)
    op.operation.erase()


def shard_calls(text: str, calls: list[KernelCall], mesh: int) -> str:
    """Wraps each ``tpu_custom_call`` of ``calls`` (in order) that splits over ``mesh``
    devices in an ``sdy.manual_computation`` over the mesh axis ``model`` (what JAX's
    ``shard_map`` emits; custom calls cannot be partitioned automatically): its operands
    sharded as the op's sharding rule says, the kernel built for the local shapes. The
    module gets the mesh and ``mhlo.num_partitions``; XLA's partitioner shards the rest.
    The edit goes through jaxlib's MLIR bindings (torch-mlir's have no ``sdy`` dialect)."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import sdy
    except ImportError as e:
        raise LoweringError(f"a sharded export needs jaxlib's MLIR bindings: {e}") from None

    with jax_mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        customs = [
            o
            for o in _walk(module.operation, [])
            if o.operation.name == "stablehlo.custom_call"
            and ir.StringAttr(o.attributes["call_target_name"]).value == "tpu_custom_call"
        ]
        if len(customs) != len(calls):
            raise LoweringError(f"sharded export: {len(customs)} tpu_custom_calls for {len(calls)} Tessera calls")
        for index, (op, call) in enumerate(zip(customs, calls), 1):
            named = ir.StringAttr(op.attributes["kernel_name"]).value if "kernel_name" in op.attributes else None
            if call.kernel != USER_OP and named and not call.kernel.startswith(named.split("_")[0]):
                raise LoweringError(f"sharded export: call {index} is {named}, expected {call.kernel}")
            split = _sharded_dims(call, mesh)
            if split is not None:
                _manual_region(ir, sdy, op, call, split, mesh)
        with ir.InsertionPoint.at_block_begin(module.body):
            sdy.MeshOp("mesh", sdy.MeshAttr.get([sdy.MeshAxisAttr.get(MESH_AXIS, mesh)], []))
        i32 = ir.IntegerType.get_signless(32)
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, mesh)
        module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
        return str(module)


def _stable_constants(module, ir) -> None:
    """torch-mlir leaves some tensor constants as ``arith.constant``; StableHLO's
    portable form (what TPU compilers read) takes only ``stablehlo.constant``."""
    for o in _walk(module.operation, []):
        if o.operation.name != "arith.constant" or not isinstance(o.results[0].type, ir.RankedTensorType):
            continue
        with ir.InsertionPoint(o), o.location:
            constant = ir.Operation.create(
                "stablehlo.constant", results=[o.results[0].type], attributes={"value": o.attributes["value"]}
            )
        o.results[0].replace_all_uses_with(constant.result)
        o.operation.erase()


def _first_line_of_interest(message: str) -> str:
    """The op torch-mlir could not lower, or its first error line (all of torch-mlir's
    diagnostics go to stderr under ``TESSERA_LOG=debug``)."""
    if config.debug_log():
        print(message, file=sys.stderr)
    names = []
    for m in re.finditer(r"failed to legalize operation '([\w.]+)'(.*)", message):
        name = m.group(1)
        if name == "torch.operator":
            op = re.search(r'name = "torch\.([\w.]+)"', m.group(2))
            name = op.group(1) if op else name
        names.append(name.removeprefix("torch."))
    if names:  # an ATen op is the cause; constants that feed it fail after it
        name = next((n for n in names if n.startswith("aten.")), names[0])
        return f"torch-mlir cannot lower {name} to StableHLO"
    for line in message.splitlines():
        if "error" in line:
            return line.strip()
    return message.strip().splitlines()[0] if message.strip() else "torch-mlir failed"


def element_name(dtype: torch.dtype) -> Optional[str]:
    """The runtime's element name of a torch dtype (None: not supported)."""
    return dtypes.ELEMENT.get(dtype)
