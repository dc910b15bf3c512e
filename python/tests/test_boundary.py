"""The Python boundary, swept: every op and every tensor argument with the wrong dtype,
device, rank and shape (a ValueError naming the argument), and with zero-size,
non-contiguous, overlapping, NaN/inf and requires_grad variants (the result and the
gradients PyTorch's own math gives). Nothing may crash, hang or return silently wrong
values. Also: ops called from several threads at once give the serial results."""

import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tessera

ops = torch.ops.tessera


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _sdpa(q, k, v, is_causal=False, scale=None, backend=SDPBackend.FLASH_ATTENTION):
    """PyTorch's SDPA. Its CPU flash and math kernels differ on some infinite inputs:
    tessera's forward follows the flash kernel (rows without a finite score give 0,
    where the math kernel's additive mask gives NaN), its backward the math kernel."""
    if k.shape[2] == 0:
        return q * 0.0
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)


@dataclass
class Op:
    """One op: how to call it, its tensor arguments (name as in the errors, shape) for
    a valid call, its PyTorch reference, and the calls that must be rejected."""

    name: str
    call: Callable
    args: dict  # argument name -> shape
    reference: Callable
    # (description, {arg: shape}) calls with a bad rank or shape: ValueError naming arg
    bad_shapes: list = field(default_factory=list)
    # shapes (all args) with a zero-size dimension that must run
    empty: list = field(default_factory=list)
    differentiable: bool = True
    # arguments converted to the first argument's dtype instead of rejected
    converted: tuple = ()

    def tensors(self, shapes=None, dtype=torch.float32, seed=0):
        g = torch.Generator().manual_seed(seed)
        shapes = shapes or self.args
        return {n: torch.randn(s, generator=g).to(dtype) for n, s in shapes.items()}


OPS = [
    Op(
        "softmax",
        lambda x: ops.softmax(x),
        {"x": (5, 13)},
        lambda x: torch.softmax(x, -1),
        bad_shapes=[("x rank 0", {"x": ()})],
        empty=[{"x": (0, 13)}, {"x": (5, 0)}, {"x": (2, 0, 3)}],
    ),
    Op(
        "rms_norm",
        lambda x, weight: ops.rms_norm(x, weight, 1e-5),
        {"x": (5, 13), "weight": (13,)},
        lambda x, weight: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight,
        bad_shapes=[
            ("weight rank 2", {"x": (5, 13), "weight": (1, 13)}),
            ("weight size", {"x": (5, 13), "weight": (12,)}),
            ("x rank 0", {"x": (), "weight": (1,)}),
        ],
        empty=[{"x": (0, 13), "weight": (13,)}, {"x": (5, 0), "weight": (0,)}],
    ),
    Op(
        "layer_norm",
        lambda x, weight, bias: ops.layer_norm(x, weight, bias, 1e-5),
        {"x": (5, 13), "weight": (13,), "bias": (13,)},
        lambda x, weight, bias: F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5),
        bad_shapes=[
            ("bias size", {"x": (5, 13), "weight": (13,), "bias": (14,)}),
            ("weight rank 0", {"x": (5, 13), "weight": (), "bias": (13,)}),
        ],
        empty=[{"x": (0, 13), "weight": (13,), "bias": (13,)}],
    ),
    Op(
        "swiglu",
        lambda gate, up: ops.swiglu(gate, up),
        {"gate": (5, 13), "up": (5, 13)},
        lambda gate, up: F.silu(gate) * up,
        bad_shapes=[("up shape", {"gate": (5, 13), "up": (5, 12)}), ("up rank", {"gate": (5, 13), "up": (1, 5, 13)})],
        empty=[{"gate": (0, 13), "up": (0, 13)}],
    ),
    Op(
        "matmul",
        lambda x, y: ops.matmul(x, y),
        {"x": (7, 13), "y": (13, 5)},
        lambda x, y: x @ y,
        bad_shapes=[
            ("x rank 3", {"x": (1, 7, 13), "y": (13, 5)}),
            ("y rank 1", {"x": (7, 13), "y": (13,)}),
            ("y rows", {"x": (7, 13), "y": (12, 5)}),
        ],
        empty=[{"x": (0, 13), "y": (13, 5)}, {"x": (7, 0), "y": (0, 5)}, {"x": (7, 13), "y": (13, 0)}],
    ),
    Op(
        "rope",
        lambda x, cos, sin: ops.rope(x, cos, sin),
        {"x": (1, 2, 9, 8), "cos": (9, 8), "sin": (9, 8)},
        lambda x, cos, sin: x * cos + _rotate_half(x) * sin,
        bad_shapes=[
            ("x rank 3", {"x": (2, 9, 8), "cos": (9, 8), "sin": (9, 8)}),
            ("cos shape", {"x": (1, 2, 9, 8), "cos": (8, 8), "sin": (9, 8)}),
            ("sin rank", {"x": (1, 2, 9, 8), "cos": (9, 8), "sin": (1, 9, 8)}),
        ],
        empty=[{"x": (1, 2, 0, 8), "cos": (0, 8), "sin": (0, 8)}, {"x": (0, 2, 9, 8), "cos": (9, 8), "sin": (9, 8)}],
    ),
    Op(
        "flash_attention",
        lambda query, key, value: ops.flash_attention(query, key, value, True),
        {"query": (1, 4, 9, 8), "key": (1, 2, 11, 8), "value": (1, 2, 11, 8)},
        lambda query, key, value: _sdpa(query, key, value, True),
        bad_shapes=[
            ("query rank 3", {"query": (4, 9, 8), "key": (1, 2, 11, 8), "value": (1, 2, 11, 8)}),
            ("key heads", {"query": (1, 4, 9, 8), "key": (1, 3, 11, 8), "value": (1, 3, 11, 8)}),
            ("value length", {"query": (1, 4, 9, 8), "key": (1, 2, 11, 8), "value": (1, 2, 10, 8)}),
            ("key head_dim", {"query": (1, 4, 9, 8), "key": (1, 2, 11, 4), "value": (1, 2, 11, 4)}),
            ("key no heads", {"query": (1, 4, 9, 8), "key": (1, 0, 11, 8), "value": (1, 0, 11, 8)}),
            ("query head_dim 0", {"query": (1, 4, 9, 0), "key": (1, 2, 11, 0), "value": (1, 2, 11, 0)}),
        ],
        empty=[
            {"query": (1, 4, 0, 8), "key": (1, 2, 11, 8), "value": (1, 2, 11, 8)},
            {"query": (1, 4, 9, 8), "key": (1, 2, 0, 8), "value": (1, 2, 0, 8)},
            {"query": (0, 4, 9, 8), "key": (0, 2, 11, 8), "value": (0, 2, 11, 8)},
        ],
    ),
    Op(
        "flash_attention_bwd",
        lambda query, key, value, grad_out: ops.flash_attention_bwd(query, key, value, grad_out, False, 0.5),
        {"query": (1, 2, 9, 8), "key": (1, 1, 11, 8), "value": (1, 1, 11, 8), "grad_out": (1, 2, 9, 8)},
        lambda query, key, value, grad_out: torch.autograd.grad(
            _sdpa(query, key, value, False, 0.5, SDPBackend.MATH), (query, key, value), grad_out, materialize_grads=True
        ),
        bad_shapes=[
            (
                "grad_out shape",
                {"query": (1, 2, 9, 8), "key": (1, 1, 11, 8), "value": (1, 1, 11, 8), "grad_out": (1, 2, 8, 8)},
            ),
            (
                "grad_out rank",
                {"query": (1, 2, 9, 8), "key": (1, 1, 11, 8), "value": (1, 1, 11, 8), "grad_out": (2, 9, 8)},
            ),
        ],
        empty=[
            {"query": (1, 2, 0, 8), "key": (1, 1, 11, 8), "value": (1, 1, 11, 8), "grad_out": (1, 2, 0, 8)},
            {"query": (1, 2, 9, 8), "key": (1, 1, 0, 8), "value": (1, 1, 0, 8), "grad_out": (1, 2, 9, 8)},
        ],
        differentiable=False,
        converted=("grad_out",),
    ),
]
IDS = [op.name for op in OPS]


def reference(op, tensors):
    """PyTorch's result in f32 (float64 for the references that need autograd)."""
    with torch.enable_grad():
        leaves = {n: t.detach().double().requires_grad_() for n, t in tensors.items()}
        out = op.reference(**leaves)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(o.detach().float() for o in outs)


def check(op, tensors, got):
    """`got` equals PyTorch's result: same shapes, non-finite exactly where PyTorch's
    is (NaN and inf may differ there: IEEE gives either depending on the order of
    operations), close elsewhere."""
    want = reference(op, tensors)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) >= len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{op.name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        g = g.float()
        finite = w.isfinite()
        assert torch.equal(g.isfinite(), finite), f"{op.name} output {i}: non-finite elements differ"
        torch.testing.assert_close(g[finite], w[finite], rtol=1e-4, atol=1e-4)


# ---- bad arguments: a ValueError that names the argument ---------------------------


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool, torch.complex64])
def test_wrong_dtype_names_the_argument(op, dtype):
    for name in op.args:
        tensors = op.tensors()
        tensors[name] = tensors[name].to(dtype)
        with pytest.raises(ValueError, match=f"^{name}: dtype"):
            op.call(**tensors)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_mixed_dtypes_name_the_argument(op):
    names = list(op.args)
    for name in names[1:]:
        tensors = op.tensors()
        tensors[name] = tensors[name].to(torch.bfloat16)
        if name in op.converted:
            check(op, tensors, op.call(**tensors))
            continue
        with pytest.raises(ValueError, match=f"^{name}: dtype torch.bfloat16 differs"):
            op.call(**tensors)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_meta_tensors_give_shapes_and_mixed_devices_are_rejected(op):
    real = op.call(**op.tensors())
    meta = op.call(**{n: t.to("meta") for n, t in op.tensors().items()})
    for r, m in zip(real if isinstance(real, tuple) else (real,), meta if isinstance(meta, tuple) else (meta,)):
        assert m.device.type == "meta" and m.shape == r.shape and m.dtype == r.dtype
    for name in list(op.args)[: len(op.args) if len(op.args) > 1 else 0]:
        tensors = op.tensors()
        tensors[name] = tensors[name].to("meta")
        with pytest.raises(ValueError, match=f"different devices: .*{name} on meta"):
            op.call(**tensors)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_bad_ranks_and_shapes_name_the_argument(op):
    assert op.bad_shapes, "every op lists its bad shapes"
    for what, shapes in op.bad_shapes:
        name = what.split()[0]
        with pytest.raises(ValueError, match=name):
            op.call(**op.tensors(shapes))


def test_non_tensor_arguments_are_rejected():
    with pytest.raises(NotImplementedError, match="no tensor arguments"):  # PyTorch's dispatcher
        ops.softmax(None)
    with pytest.raises(ValueError, match="weight: expected a tensor, got None"):
        ops.rms_norm(torch.randn(2, 3), None)
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor'"):
        ops.softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="eps: expected a finite number"):
        ops.rms_norm(torch.randn(2, 3), torch.randn(3), math.nan)
    with pytest.raises(ValueError, match="scale: expected a finite number"):
        ops.flash_attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), False, math.inf)


# ---- unusual but valid inputs: PyTorch's result ------------------------------------


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_zero_size_inputs_give_pytorchs_result(op):
    for shapes in op.empty:
        tensors = op.tensors(shapes)
        check(op, tensors, op.call(**tensors))


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_length_one_dims_give_pytorchs_result(op):
    shapes = {n: tuple(1 if d != 8 else d for d in s) for n, s in op.args.items()}
    tensors = op.tensors(shapes)
    check(op, tensors, op.call(**tensors))


def non_contiguous(t):
    """The same values through a strided view."""
    wide = torch.stack([t, torch.full_like(t, math.nan)], dim=-1)
    return wide[..., 0]


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_non_contiguous_and_overlapping_strides(op):
    for name in op.args:
        tensors = op.tensors()
        tensors[name] = non_contiguous(tensors[name])
        assert not tensors[name].is_contiguous()
        check(op, tensors, op.call(**tensors))
        # Overlapping memory: every row is the same storage (stride 0).
        tensors = op.tensors()
        t = tensors[name]
        tensors[name] = t[:1].expand_as(t) if t.dim() else t
        check(op, tensors, op.call(**tensors))


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_propagate_as_in_pytorch(op, special):
    for name in op.args:
        tensors = op.tensors()
        tensors[name].view(-1)[3] = special
        check(op, tensors, op.call(**tensors))


@pytest.mark.parametrize("op", [op for op in OPS if op.differentiable], ids=lambda op: op.name)
def test_every_requires_grad_combination(op):
    names = list(op.args)
    for k in range(len(names) + 1):
        for subset in itertools.combinations(names, k):
            tensors = op.tensors()
            for n in subset:
                tensors[n].requires_grad_()
            out = op.call(**tensors)
            assert out.requires_grad == bool(subset), subset
            if not subset:
                continue
            g = torch.randn_like(out)
            got = torch.autograd.grad(out, [tensors[n] for n in subset], g)
            with torch.enable_grad():
                leaves = {n: t.detach().double().requires_grad_(n in subset) for n, t in tensors.items()}
                want = torch.autograd.grad(op.reference(**leaves), [leaves[n] for n in subset], g.double())
            for n, a, b in zip(subset, got, want):
                torch.testing.assert_close(
                    a, b.float(), rtol=1e-4, atol=1e-4, msg=lambda m, n=n, subset=subset: f"{subset} d{n}: {m}"
                )


# ---- threads -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["native", "interp", "xla"])
def test_ops_from_several_threads_match_serial_runs(backend):
    jobs = [(op, seed) for seed in range(3) for op in OPS]

    def run(job):
        op, seed = job
        with tessera.backend(backend):
            out = op.call(**op.tensors(seed=seed))
        return out if isinstance(out, tuple) else (out,)

    serial = [run(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        concurrent = list(pool.map(run, jobs))
    for (op, seed), s, c in zip(jobs, serial, concurrent):
        for a, b in zip(s, c):
            assert torch.equal(a, b), f"{op.name} seed {seed} on {backend}: threads changed the result"


def test_an_array_that_cannot_be_allocated_is_a_memory_error():
    # 2^50 bytes: the interpreter's copy of the input cannot be allocated, which fails
    # before the (never dereferenced) buffer address is read.
    n = 1 << 24
    with pytest.raises(MemoryError, match=r"cannot allocate a copy of input 0 \(f32\[16777216, 16777216\]\)"):
        tessera._tessera.run(
            "softmax", [f"rows={n}", f"cols={n}"], [(8, [n, n], "f32")], [(8, [n, n], "f32")], "interp"
        )
