"""Graph mode's ``onednn_matmul`` family: the op against ``torch.mm`` over shapes and
strides, the ATen pass (what it takes and what it must leave), and a training step
through it against eager gradients."""

import pytest
import torch
from helpers import fresh_graph_mode  # noqa: F401 - autouse: Dynamo reset around each test
from torch.fx.experimental.proxy_tensor import make_fx

import tessera
from tessera.graph import onednn

pytestmark = pytest.mark.skipif(not onednn.available(), reason="this PyTorch has no oneDNN")
aten = torch.ops.aten


@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (1, 64, 7), (3, 5, 2), (17, 33, 65), (128, 256, 96), (0, 4, 3), (2, 0, 3)]
)
@pytest.mark.parametrize("bias", [False, True])
def test_op_matches_mm_for_any_shape_and_weight_strides(m, k, n, bias):
    torch.manual_seed(m * k + n)
    a, w = torch.randn(m, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    # Against a float64 product: float32 sums in another order differ by rounding only.
    want = (a.double() @ w.double().t() + (b.double() if bias else 0)).float()
    for left, weight in [
        (a, w),  # rows contiguous
        (a, w.t().contiguous().t()),  # a transposed weight (the input gradient's)
        (a.t().contiguous().t(), w),  # a transposed left operand (the weight gradient's)
    ]:
        got = torch.ops.tessera_graph.onednn_matmul(left, weight, b)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k**0.5)


def test_op_fake_kernel_gives_the_product_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.tessera_graph.onednn_matmul(torch.empty(5, 3), torch.empty(4, 3), None)
    assert out.shape == (5, 4) and out.dtype == torch.float32


def _aten_graph(fn, *args):
    return make_fx(fn)(*args)


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_pass_takes_float32_mm_and_addmm_and_keeps_the_result():
    a, b, bias = torch.randn(6, 5), torch.randn(5, 3), torch.randn(3)

    def fn(a, b, bias):
        return torch.mm(a, b) + torch.addmm(bias, a, b)

    gm = _aten_graph(fn, a, b, bias)
    assert onednn.substitute(gm) == 2
    targets = _targets(gm)
    assert aten.mm.default not in targets and aten.addmm.default not in targets
    assert targets.count(torch.ops.tessera_graph.onednn_matmul.default) == 2
    torch.testing.assert_close(gm(a, b, bias), fn(a, b, bias))


def test_pass_leaves_scaled_broadcast_and_other_dtypes_to_aten():
    a, b = torch.randn(6, 5), torch.randn(5, 3)
    cases = [
        (lambda a, b, c: torch.addmm(c, a, b, beta=0.5), (a, b, torch.randn(3))),  # scaled bias
        (lambda a, b, c: torch.addmm(c, a, b, alpha=2.0), (a, b, torch.randn(3))),  # scaled product
        (lambda a, b, c: torch.addmm(c, a, b), (a, b, torch.randn(6, 3))),  # a matrix bias
        (lambda a, b, c: torch.addmm(c, a, b), (a, b, torch.randn(1))),  # a broadcast bias
        (lambda a, b, c: torch.mm(a, b) + c, (a.double(), b.double(), torch.zeros(()))),  # float64
        (lambda a, b, c: torch.bmm(a[None], b[None]) + c, (a, b, torch.zeros(()))),  # batched
    ]
    for fn, args in cases:
        gm = _aten_graph(fn, *args)
        assert onednn.substitute(gm) == 0, gm.code
        assert torch.ops.tessera_graph.onednn_matmul.default not in _targets(gm)


def test_family_is_present_only_where_a_float32_product_is():
    found = []

    def backend(gm, example_inputs):
        found.append(onednn.present(gm))
        return gm.forward

    linear = torch.nn.Linear(8, 4)
    torch.compile(linear, backend=backend)(torch.randn(2, 8))
    torch.compile(lambda x: x.relu() + 1, backend=backend)(torch.randn(2, 8))
    doubles = torch.randn(2, 8, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    torch.compile(lambda x, y: x @ y, backend=backend)(*doubles)
    assert found == [True, False, False]


def test_training_step_takes_the_family_forward_and_backward_and_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 33), torch.nn.GELU(), torch.nn.Linear(33, 5))
    x = torch.randn(3, 7, 12, requires_grad=True)
    model(x).square().mean().backward()
    want = [p.grad.clone() for p in [x, *model.parameters()]]
    for p in [x, *model.parameters()]:
        p.grad = None
    compiled = torch.compile(model, backend="tessera", options={"kernels": "onednn_matmul"})
    compiled(x).square().mean().backward()
    for got, expected in zip([x.grad, *(p.grad for p in model.parameters())], want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # Forward: the two linears; backward: each one's input and weight gradients.
    assert tessera.graph_stats()["kernels"] == {"onednn_matmul": 6}, tessera.graph_stats()
