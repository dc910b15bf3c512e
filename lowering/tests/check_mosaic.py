"""Checks Tessera's Mosaic TPU output with the real `tpu` dialect that jaxlib ships.

    check_mosaic.py DIR                      # every *.mosaic.mlir file in DIR
    check_mosaic.py --compare-pallas FILE    # FILE: tessera's 256^3 matmul (128 blocks)
    check_mosaic.py --compile TOPOLOGY DIR   # compile each kernel with libtpu (v5e:2x2...)

For each StableHLO module with `stablehlo.custom_call @tpu_custom_call`:
  1. the StableHLO module parses and verifies;
  2. the custom call's backend_config is JSON whose base64 body parses and verifies
     as a Mosaic module (tpu, vector, arith, math, scf, memref, func dialects);
  3. the body survives the versioned form JAX stores: mosaic-serde{serialize=true},
     written as bytecode, parsed back, mosaic-serde{serialize=false}, verified;
  4. the kernel function has one window_params entry per operand and as many
     iteration_bounds and dimension_semantics as grid arguments.
--compare-pallas lowers the same matmul with JAX Pallas and compares the grid,
window parameters, index maps, memref types and semantics with tessera's.
--compile hands each kernel body to JAX's tpu_custom_call (which stores it in the
versioned form) and compiles it with libtpu's Mosaic compiler for a device-free TPU
target (no TPU needed), with the operand and result types of the tessera wrapper.
Prints one line per module; exits 1 on the first failure.
"""

import base64
import io
import json
import os
import pathlib
import re
import sys

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax
import jax.numpy as jnp
from jax._src.interpreters import mlir
from jax._src.lib import tpu
from jax._src.lib.mlir import ir, passmanager
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def context():
    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    return ctx


def tensor_struct(t, sharding=None):
    """A ShapeDtypeStruct for an MLIR tensor type."""
    dtypes = {"f32": jnp.float32, "bf16": jnp.bfloat16, "i32": jnp.int32, "i1": jnp.bool_}
    parts = str(t)[len("tensor<"):-1].split("x")
    return jax.ShapeDtypeStruct(tuple(int(p) for p in parts[:-1]), dtypes[parts[-1]], sharding=sharding)


def custom_calls(stablehlo_text, with_types=False):
    """Parses and verifies the StableHLO module; returns each tpu_custom_call's body
    (with its operand and result types when `with_types`)."""
    with context():
        module = ir.Module.parse(stablehlo_text)
        if not module.operation.verify():
            raise AssertionError("the StableHLO module does not verify")
        bodies = []

        def walk(op):
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        if inner.operation.name == "stablehlo.custom_call":
                            target = ir.StringAttr(inner.attributes["call_target_name"]).value
                            assert target == "tpu_custom_call", target
                            config = json.loads(ir.StringAttr(inner.attributes["backend_config"]).value)
                            cfg = config["custom_call_config"]
                            assert "serialization_format" not in cfg, "tessera stores the text form"
                            body = base64.b64decode(cfg["body"]).decode()
                            if with_types:
                                types = ([v.type for v in inner.operands], [r.type for r in inner.results])
                                bodies.append((body, [str(t) for t in types[0]], [str(t) for t in types[1]]))
                            else:
                                bodies.append(body)
                        walk(inner.operation)

        walk(module.operation)
        return bodies


def kernel_func(module):
    for op in module.body.operations:
        if "window_params" in op.attributes:
            return op
    raise AssertionError("no kernel function with window_params")


def check_body(text):
    """Parses, verifies and round-trips a Mosaic module through its stored form."""
    with context() as ctx:
        module = ir.Module.parse(text)
        if not module.operation.verify():
            raise AssertionError("the Mosaic module does not verify")
        func = kernel_func(module)
        n_grid = len(ir.DenseI64ArrayAttr(func.attributes["iteration_bounds"]))
        n_sem = len(ir.ArrayAttr(func.attributes["dimension_semantics"]))
        n_windows = len(ir.ArrayAttr(func.attributes["window_params"]))
        scratch = ir.IntegerAttr(func.attributes["scratch_operands"]).value
        prefetch = ir.IntegerAttr(func.attributes["scalar_prefetch"]).value
        n_args = len(func.regions[0].blocks[0].arguments)
        assert n_sem == n_grid, f"{n_sem} dimension_semantics for a rank-{n_grid} grid"
        assert n_args == n_grid + prefetch + n_windows + scratch, (n_args, n_grid, prefetch, n_windows, scratch)
        ctx.allow_unregistered_dialects = True  # the versioned form has unregistered ops
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=true})").run(module.operation)
        stored = io.BytesIO()
        module.operation.write_bytecode(stored)
    with context() as ctx:
        ctx.allow_unregistered_dialects = True
        decoded = ir.Module.parse(stored.getvalue())
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(decoded.operation)
        if not decoded.operation.verify():
            raise AssertionError("the decoded bytecode does not verify")
    return n_grid, n_windows


def check_dir(directory):
    files = sorted(pathlib.Path(directory).glob("*.mosaic.mlir"))
    if not files:
        raise SystemExit(f"no *.mosaic.mlir files in {directory}")
    for path in files:
        for body in custom_calls(path.read_text()):
            grid, windows = check_body(body)
            print(f"ok {path.name}: grid rank {grid}, {windows} windows")


def pallas_matmul_body():
    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    def call(x, y):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
            grid=(2, 2, 2),
            in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                      pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, y)

    x = jnp.zeros((256, 256), jnp.float32)
    return stored_body(call, x, x)


def pallas_prefetch_gather_body():
    """JAX Pallas's Mosaic body of kernel_ir::testing::prefetch_gather(4, 5, 8, 128): a
    scalar-prefetch table places each program's input block."""
    def kernel(table_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + table_ref[pl.program_id(0)].astype(jnp.float32)

    def call(table, x):
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(5,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, table: (table[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, table: (i, 0)))
        return pl.pallas_call(
            kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((40, 128), jnp.float32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(table, x)

    return stored_body(call, jnp.zeros((5,), jnp.int32), jnp.zeros((32, 128), jnp.float32))


def stored_body(call, *args):
    """The Mosaic body of the one `tpu_custom_call` JAX emits for `call(*args)`, decoded
    from its stored (versioned bytecode) form."""
    text = jax.jit(call).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    config = re.search(r'backend_config = "(.*?)"(, | \})', text).group(1)
    config = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda g: chr(int(g.group(1), 16)), config))
    stored = base64.b64decode(config["custom_call_config"]["body"])
    with context() as ctx:
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse(stored)
        passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        return str(module)


def block_argument(value):
    """`argN` for a block argument, `const` for anything else."""
    try:
        return f"arg{ir.BlockArgument(value).arg_number}"
    except (TypeError, ValueError):
        return "const"


def summary(text):
    """What must agree: grid, semantics, windows, memref types, index maps."""
    with context():
        module = ir.Module.parse(text)
        func = kernel_func(module)
        out = {
            key: str(func.attributes[key])
            for key in ["dimension_semantics", "iteration_bounds", "scalar_prefetch", "scratch_operands"]
        }
        windows = ir.ArrayAttr(func.attributes["window_params"])
        out["window_bounds"] = [str(ir.DictAttr(w)["window_bounds"]) for w in windows]
        out["arg_types"] = [str(a.type) for a in func.regions[0].blocks[0].arguments]
        maps = []
        for op in module.body.operations:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if name.startswith("transform_"):
                ret = op.regions[0].blocks[0].operations[-1]
                maps.append([block_argument(v) for v in ret.operands])
        out["index_maps"] = maps
        return out


PALLAS_BODIES = {"matmul": pallas_matmul_body, "prefetch_gather": pallas_prefetch_gather_body}


def compare_pallas(name, ours_file):
    ours_bodies = custom_calls(pathlib.Path(ours_file).read_text())
    assert len(ours_bodies) == 1, "one kernel expected"
    ours, theirs = summary(ours_bodies[0]), summary(PALLAS_BODIES[name]())
    for key in theirs:
        if ours[key] != theirs[key]:
            raise AssertionError(f"{key}: tessera {ours[key]} vs pallas {theirs[key]}")
        print(f"same {key}: {ours[key]}")


def compile_dir(topology, directory):
    from jax._src import tpu_custom_call
    from jax.experimental import topologies

    device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    files = sorted(pathlib.Path(directory).glob("*.mosaic.mlir"))
    if not files:
        raise SystemExit(f"no *.mosaic.mlir files in {directory}")
    for path in files:
        for body, ins, outs in custom_calls(path.read_text(), with_types=True):
            with context(), ir.Location.unknown():
                module = ir.Module.parse(body)
                out_type = [tensor_struct(t) for t in outs]
                kernel = tpu_custom_call.as_tpu_kernel(module, out_type[0] if len(out_type) == 1 else out_type)
            args = [tensor_struct(t, sharding) for t in ins]
            jax.jit(kernel).trace(*args).lower().compile()
            print(f"compiled {path.name} for {topology}")


if __name__ == "__main__":
    try:
        if sys.argv[1] == "--compare-pallas":
            compare_pallas(sys.argv[2], sys.argv[3])
        elif sys.argv[1] == "--compile":
            compile_dir(sys.argv[2], sys.argv[3])
        else:
            check_dir(sys.argv[1])
    except Exception as e:  # one clear line for the Rust test that runs this
        print(f"FAILED: {type(e).__name__}: {e}")
        sys.exit(1)
