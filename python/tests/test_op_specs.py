"""The library ops are declared once (Rust ``kernels::OpSpec``) and everything else is
derived from the registry: these tests walk it and name the op that misses a piece."""

import pathlib
import re
import subprocess

import pytest
import torch
from test_boundary import OPS as BOUNDARY_OPS
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

import tessera
from tessera import autograd, ops
from tessera.graph import lower

NAMES = sorted(ops.SPECS)


def test_every_op_is_defined_with_its_schema_and_doc():
    assert NAMES, "the extension declares no ops"
    for name, spec in ops.SPECS.items():
        packet = getattr(torch.ops.tessera, name)
        assert packet.default._schema.name == f"tessera::{name}"
        assert spec["doc"] in packet.__doc__, name
        assert len(spec["outputs"]) >= spec["returns"] >= 1, name


@pytest.mark.parametrize("name", NAMES)
def test_every_op_has_an_autograd_kernel_and_a_sharding_rule(name):
    assert name in autograd._PYTHON_AUTOGRAD, f"{name}: no autograd kernel (tessera/autograd.py)"
    rules = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    assert getattr(torch.ops.tessera, name).default in rules, f"{name}: no sharding rule (tessera/distributed.py)"


# Ops whose boundaries (bad arguments, empty sizes, index tensors) have tests of their
# own, since the sweep's random float tensors cannot make their index arguments.
SWEPT_ELSEWHERE = {
    "flash_attention_fwd": "flash_attention's entry (both run one plan: kernels/src/attention/ops.rs)",
    "paged_attention": "test_ops.py::test_paged_attention_*",
    "varlen_attention": "test_ops.py::test_varlen_attention_*",
    "varlen_attention_fwd": "test_ops.py::test_varlen_attention_* (its forward under autograd)",
    "varlen_attention_bwd": "test_ops.py::test_varlen_attention_* (its backward under autograd)",
}


def test_the_boundary_sweep_covers_every_op():
    swept = {op.name for op in BOUNDARY_OPS} | set(SWEPT_ELSEWHERE)
    assert not set(NAMES) - swept, f"not in test_boundary.OPS: {sorted(set(NAMES) - swept)}"


class _Calls(TorchDispatchMode):
    """Records every Tessera op call's arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "tessera":
            self.calls.append((func._opname, ops.schema_args(func._opname, args, kwargs or {})))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", BOUNDARY_OPS, ids=[op.name for op in BOUNDARY_OPS])
def test_eager_and_graph_mode_launch_the_same_problem(op):
    """The plan graph mode's custom call carries is what the eager op launches (so both
    find the blocks ``tessera tune`` stored)."""
    with tessera.trace_ops() as trace, _Calls() as recorded:
        op.call(**op.tensors())
    launched = [line.split(" ", 1) for line in trace.launches]
    assert recorded.calls and launched, op.name
    for name, args in recorded.calls:
        plan = ops.plan(name, args)
        call = lower.KernelCall(plan["kernel"], dict(plan["params"]), [], [], [])
        assert [call.kernel, call.params_text()] in launched, (launched, plan)


def test_the_recipe_lists_every_file_that_names_an_op():
    """ARCHITECTURE's "To add a library op" lists every file with per-op code: no source
    file outside it (and outside the kernels crate, tests and examples) names an op."""
    root = pathlib.Path(__file__).resolve().parents[2]
    text = (root / "ARCHITECTURE.md").read_text()
    recipe = text[text.index("### To add a library op end to end") :]
    recipe = recipe[: recipe.index("\nGraph mode (")]
    listed = set(re.findall(r"`((?:python|benches|aten-bindings)/[\w/.]+\.(?:rs|py))`", recipe))
    assert "python/tessera/autograd.py" in listed and "benches/src/torch_baseline.rs" in listed
    sources = subprocess.run(
        ["git", "ls-files", "*.rs", "*.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    skipped = ("kernels/", "tests/", "examples/", "benches/benches/", "python/benches/", "kernel-ir/fuzz/")
    strays = {}
    for path in sources:
        if path.startswith(skipped) or "/tests/" in path or path.split("/")[-1].startswith("test_"):
            continue
        body = (root / path).read_text()
        body = body.split("mod tests {")[0]  # a Rust file's unit tests
        named = [n for n in NAMES if f'"{n}"' in body]
        if named and path not in listed:
            strays[path] = named
    assert not strays, f"per-op code outside the recipe in ARCHITECTURE.md: {strays}"
