"""The library ops are declared once (Rust ``kernels::OpSpec``) and everything else is
derived from the registry: these tests walk it and name the op that misses a piece."""

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
