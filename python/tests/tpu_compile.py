"""Checks a whole-model StableHLO module exported for TPU (``tessera.export(...,
target="tpu")``): the module and every ``tpu_custom_call`` body parse and verify with
jaxlib's ``tpu`` dialect (``lowering/tests/check_mosaic.py``), then libtpu compiles the
whole module for a device-free TPU target.

    tpu_compile.py MODULE [TOPOLOGY]     # TOPOLOGY defaults to v5e:2x2

Prints one line; exits 1 on failure.
"""

import os
import pathlib
import re
import sys

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "lowering" / "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from check_mosaic import context, custom_calls  # noqa: E402
from jax._src import compiler  # noqa: E402
from jax._src.lib import xla_client as xc  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402
from jax.experimental import topologies  # noqa: E402


def compile_only_client(topology):
    """The compile-only TPU client jax uses for a device-free topology, and a device."""
    device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
    probe = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    lowered = jax.jit(lambda x: x + 1).trace(probe).lower()
    return lowered._lowering.compile_args["backend"], device


def main(path, topology="v5e:2x2"):
    text = pathlib.Path(path).read_text()
    bodies = custom_calls(text)
    backend, device = compile_only_client(topology)
    # A module exported for a mesh says how many devices it partitions over.
    partitions = int((re.search(r"mhlo.num_partitions = (\d+)", text) or [None, 1])[1])
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[:partitions]
    with context():
        module = ir.Module.parse(text)
        options = compiler.get_compile_options(num_replicas=1, num_partitions=partitions)
        backend.compile(module, executable_devices=xc.DeviceList(tuple(devices)), compile_options=options)
    print(
        f"compiled {pathlib.Path(path).name} ({len(bodies)} Mosaic kernels) for {topology}"
        + (f" partitioned over {partitions} devices" if partitions > 1 else "")
    )


if __name__ == "__main__":
    try:
        main(*sys.argv[1:])
    except Exception as e:  # one clear line for the test that runs this
        print(f"FAILED: {type(e).__name__}: {e}")
        sys.exit(1)
