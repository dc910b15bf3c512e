"""torch.ops.tessera.* against PyTorch, torch.library.opcheck, autograd, errors."""

import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import python_frames_of, run_without_native_autograd
from torch.utils._python_dispatch import TorchDispatchMode

import tessera  # noqa: F401  (registers the ops)

ops = torch.ops.tessera
torch.manual_seed(0)


def close(got, want, dtype):
    tol = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 4e-2), torch.float16: (4e-3, 4e-3)}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 130), (2, 3, 33)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax(shape, dtype):
    x = torch.randn(shape, dtype=dtype) * 3
    close(ops.softmax(x), torch.softmax(x.float(), -1).to(dtype), dtype)


@pytest.mark.parametrize("shape", [(4, 9), (7, 64), (2, 3, 17)])
def test_norms(shape):
    x = torch.randn(shape)
    w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    close(ops.rms_norm(x, w, 1e-5), rms, torch.float32)
    close(ops.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (shape[-1],), w, b, 1e-5), torch.float32)


@pytest.mark.parametrize("shape", [(1, 1), (9, 33), (4, 5, 6)])
def test_swiglu(shape):
    a, b = torch.randn(shape), torch.randn(shape)
    close(ops.swiglu(a, b), F.silu(a) * b, torch.float32)


@pytest.mark.parametrize("mkn", [(1, 1, 1), (33, 17, 65), (128, 64, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul(mkn, dtype):
    m, k, n = mkn
    x, y = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    close(ops.matmul(x, y), (x.float() @ y.float()).to(dtype), dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_rope():
    b, h, s, d = 2, 3, 11, 16
    x = torch.randn(b, h, s, d)
    freqs = 10000 ** (-torch.arange(0, d, 2).float() / d)
    angles = torch.arange(s).float()[:, None] * freqs[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    close(ops.rope(x, cos, sin), x * cos + rotate_half(x) * sin, torch.float32)


def sdpa(q, k, v, is_causal, scale=None):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


def same_outputs_and_grads(out, ref, inputs):
    """``out`` matches ``ref`` (f32), and so do their gradients for one random output
    gradient."""
    close(out, ref, torch.float32)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 1), (4, 2)])
@pytest.mark.parametrize("sq,sk", [(1, 1), (33, 47), (64, 64), (70, 20)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_forward_and_grads(heads, kv_heads, sq, sk, is_causal):
    d = 32
    q = torch.randn(1, heads, sq, d, requires_grad=True)
    k = torch.randn(1, kv_heads, sk, d, requires_grad=True)
    v = torch.randn(1, kv_heads, sk, d, requires_grad=True)
    same_outputs_and_grads(ops.flash_attention(q, k, v, is_causal=is_causal), sdpa(q, k, v, is_causal), (q, k, v))


def test_flash_attention_scale_and_bf16():
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=torch.bfloat16) for _ in range(3))
    close(
        ops.flash_attention(q, k, v, False, 0.3),
        sdpa(q.float(), k.float(), v.float(), False, 0.3).bfloat16(),
        torch.bfloat16,
    )


def windowed_softcapped(q, k, v, is_causal, window, softcap):
    """PyTorch math for attention with a sliding window and logit soft-capping (GQA by
    repeating k/v); a query that sees no key gives 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
    if is_causal:
        visible &= j <= i
    if window is not None:
        visible &= j >= i - window
    p = torch.softmax(s.masked_fill(~visible, -math.inf), -1).nan_to_num(0.0)
    return p @ v


@pytest.mark.parametrize(
    "is_causal,window,softcap",
    [
        (True, 16, None),
        (False, 5, None),
        (True, 0, 2.0),
        (False, None, 1.5),
        (True, 40, 30.0),
    ],
)
def test_flash_attention_window_and_softcap(is_causal, window, softcap):
    q = torch.randn(1, 4, 70, 32, requires_grad=True)
    k = torch.randn(1, 2, 45, 32, requires_grad=True)
    v = torch.randn(1, 2, 45, 32, requires_grad=True)
    same_outputs_and_grads(
        ops.flash_attention(q, k, v, is_causal, None, window, softcap),
        windowed_softcapped(q, k, v, is_causal, window, softcap),
        (q, k, v),
    )


def test_flash_attention_window_and_softcap_errors():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="window: expected a non-negative integer, got -1"):
        ops.flash_attention(q, q, q, True, None, -1)
    with pytest.raises(ValueError, match="softcap: expected a positive number, got 0.0"):
        ops.flash_attention(q, q, q, True, None, None, 0.0)


def masked_reference(q, k, v, is_causal, mask):
    """SDPA with the mask (boolean or additive, GQA by repeating k/v) and the causal mask
    combined; a query that sees no key gives 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    bias = torch.zeros(()) if mask.dtype == torch.bool else mask
    hidden = ~mask if mask.dtype == torch.bool else torch.zeros((), dtype=torch.bool)
    if is_causal:
        hidden = hidden | torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril().logical_not()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    s = s.masked_fill(hidden, -math.inf)
    empty = s.amax(-1, keepdim=True) == -math.inf
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return p @ v


def padding_mask(lengths, sq, sk):
    """``[batch, 1, sq, sk]``: query rows see the first ``lengths[b]`` keys."""
    keys = torch.arange(sk)[None, :] < torch.tensor(lengths)[:, None]
    return keys[:, None, None, :].expand(len(lengths), 1, sq, sk)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "mask_of",
    [
        lambda b, sq, sk: padding_mask([sk, 3, 1][:b], sq, sk),  # per entry, boolean
        lambda b, sq, sk: torch.rand(sq, sk) > 0.3,  # shared, rank 2
        lambda b, sq, sk: torch.randn(b, 1, sq, sk),  # additive, per entry
        lambda b, sq, sk: torch.randn(1, 1, 1, sk).masked_fill(torch.rand(sk) < 0.3, -math.inf),  # broadcast rows
    ],
)
def test_flash_attention_score_mask(is_causal, mask_of):
    b, sq, sk = 3, 37, 45
    q = torch.randn(b, 4, sq, 32, requires_grad=True)
    k = torch.randn(b, 2, sk, 32, requires_grad=True)
    v = torch.randn(b, 2, sk, 32, requires_grad=True)
    mask = mask_of(b, sq, sk)
    same_outputs_and_grads(
        ops.flash_attention(q, k, v, is_causal, mask=mask), masked_reference(q, k, v, is_causal, mask), (q, k, v)
    )


def test_flash_attention_score_mask_errors():
    q = torch.randn(2, 4, 8, 16)
    with pytest.raises(ValueError, match=r"mask: shape \(2, 4, 8, 8\) has a mask per head"):
        ops.flash_attention(q, q, q, mask=torch.zeros(2, 4, 8, 8))
    with pytest.raises(ValueError, match=r"mask: shape \(3, 8\) does not broadcast to \(2, 4, 8, 8\)"):
        ops.flash_attention(q, q, q, mask=torch.zeros(3, 8))
    with pytest.raises(ValueError, match="mask: expected a boolean or floating mask, got torch.int64"):
        ops.flash_attention(q, q, q, mask=torch.zeros(8, 8, dtype=torch.long))
    learned = torch.zeros(8, 8, requires_grad=True)
    with pytest.raises(ValueError, match="mask: flash_attention gives no gradient for the score mask"):
        ops.flash_attention(q.requires_grad_(), q, q, mask=learned)


def paged_inputs(batch=3, heads=4, kv_heads=2, d=16, page_size=4, num_pages=9, max_pages=5, dtype=torch.float32):
    q = torch.randn(batch, heads, d, dtype=dtype)
    k_cache = torch.randn(kv_heads, num_pages, page_size, d, dtype=dtype)
    v_cache = torch.randn(kv_heads, num_pages, page_size, d, dtype=dtype)
    table = torch.stack([torch.randperm(num_pages)[:max_pages] for _ in range(batch)]).int()
    lens = torch.tensor([max_pages * page_size, 1, 6][:batch], dtype=torch.int32)
    table[1, 1:] = -1  # slots past a length are never read
    return q, k_cache, v_cache, table, lens


def paged_reference(q, k_cache, v_cache, table, lens):
    """The PyTorch way: gather each sequence's pages, then SDPA with GQA."""
    outs = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        used = table[b, : (n + k_cache.shape[2] - 1) // k_cache.shape[2]].long()
        k = k_cache[:, used].flatten(1, 2)[:, :n]
        v = v_cache[:, used].flatten(1, 2)[:, :n]
        outs.append(F.scaled_dot_product_attention(q[b, :, None].float(), k.float(), v.float(), enable_gqa=True)[:, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_matches_gathered_sdpa(dtype):
    args = paged_inputs(dtype=dtype)
    close(ops.paged_attention(*args), paged_reference(*args).to(dtype), dtype)
    torch.library.opcheck(ops.paged_attention, args)


def test_paged_attention_refuses_bad_tables_before_running():
    q, k, v, table, lens = paged_inputs()
    table[0, 2] = 9
    with pytest.raises(ValueError, match=r"block_table\[0, 2\] = 9 is outside the cache's 9 pages"):
        ops.paged_attention(q, k, v, table, lens)
    table[0, 2] = 0
    with pytest.raises(ValueError, match=r"context_lens\[2\] = 21: expected 0..=20"):
        ops.paged_attention(q, k, v, table, torch.tensor([20, 1, 21], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table: expected torch.int32 or torch.int64, got torch.float32"):
        ops.paged_attention(q, k, v, table.float(), lens)


def test_paged_attention_takes_int64_tables_as_pytorch_holds_them():
    q, k, v, table, lens = paged_inputs()
    close(
        ops.paged_attention(q, k, v, table.long(), lens.long()),
        ops.paged_attention(q, k, v, table, lens),
        torch.float32,
    )
    torch.library.opcheck(ops.paged_attention, (q, k, v, table.long(), lens.long()))
    with pytest.raises(IndexError, match=r"block_table: int64 value 4294967296 \(element 1\) is out of the int32"):
        ops.paged_attention(q, k, v, table.long().index_fill(1, torch.tensor([1]), 2**32), lens)


def offsets(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def varlen_inputs(lens_q, lens_k=None, heads=4, kv_heads=2, d=16, dtype=torch.float32, grad=False):
    lens_k = lens_q if lens_k is None else lens_k
    q = torch.randn(heads, sum(lens_q), d, dtype=dtype, requires_grad=grad)
    k = torch.randn(kv_heads, sum(lens_k), d, dtype=dtype, requires_grad=grad)
    v = torch.randn(kv_heads, sum(lens_k), d, dtype=dtype, requires_grad=grad)
    return q, k, v, offsets(lens_q), offsets(lens_k)


def varlen_reference(q, k, v, cu_q, cu_k, is_causal=False, scale=None):
    """The PyTorch way: SDPA (GQA) on each sequence's slice; no keys gives 0."""
    outs = []
    for b in range(len(cu_q) - 1):
        qs = q[:, cu_q[b] : cu_q[b + 1]]
        ks, vs = k[:, cu_k[b] : cu_k[b + 1]], v[:, cu_k[b] : cu_k[b + 1]]
        if ks.shape[1] == 0:
            outs.append(qs * 0.0)
            continue
        outs.append(
            F.scaled_dot_product_attention(
                qs[None], ks[None], vs[None], is_causal=is_causal, scale=scale, enable_gqa=True
            )[0]
        )
    return torch.cat(outs, 1)


@pytest.mark.parametrize(
    "lens_q,lens_k",
    [
        ([5, 1, 37, 12], None),
        ([1], None),
        ([130], None),
        ([3, 0, 20], None),
        ([9, 17, 4], [30, 2, 11]),
        ([40, 6], [0, 50]),
    ],
)
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1), (2, 2)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_varlen_attention_matches_sdpa_per_sequence_with_grads(lens_q, lens_k, heads, kv_heads, is_causal):
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, heads, kv_heads, grad=True)
    same_outputs_and_grads(
        ops.varlen_attention(q, k, v, cu_q, cu_k, is_causal),
        varlen_reference(q, k, v, cu_q, cu_k, is_causal),
        (q, k, v),
    )


def test_varlen_attention_bf16_scale_opcheck_and_compile():
    q, k, v, cu_q, cu_k = varlen_inputs([7, 1, 33], dtype=torch.bfloat16)
    want = varlen_reference(q.float(), k.float(), v.float(), cu_q, cu_k, True, 0.3).bfloat16()
    close(ops.varlen_attention(q, k, v, cu_q, cu_k, True, 0.3), want, torch.bfloat16)
    args = varlen_inputs([5, 0, 9], [4, 3, 8], grad=True)
    torch.library.opcheck(ops.varlen_attention, (*args, True))
    compiled = torch.compile(lambda *a: ops.varlen_attention(*a, True), fullgraph=True)
    close(compiled(*args), varlen_reference(*args, True), torch.float32)


def test_varlen_attention_takes_token_major_views_and_empty_batches():
    # [total, heads, head_dim] tensors (FlashAttention's layout) transposed: strided views.
    lens = [6, 2, 11]
    q, k, v = (torch.randn(19, h, 16).transpose(0, 1) for h in (4, 2, 2))
    close(
        ops.varlen_attention(q, k, v, offsets(lens), offsets(lens)),
        varlen_reference(q, k, v, offsets(lens), offsets(lens)),
        torch.float32,
    )
    # No tokens at all; queries without keys.
    q, k, v, cu_q, cu_k = varlen_inputs([0, 0])
    assert ops.varlen_attention(q, k, v, cu_q, cu_k).shape == (4, 0, 16)
    q, k, v, cu_q, cu_k = varlen_inputs([3, 2], [0, 0], grad=True)
    out = ops.varlen_attention(q, k, v, cu_q, cu_k)
    assert out.eq(0).all()
    out.sum().backward()
    assert q.grad.eq(0).all()


def test_varlen_attention_takes_int64_offsets_with_grads():
    q, k, v, cu_q, cu_k = varlen_inputs([5, 1, 9], grad=True)
    same_outputs_and_grads(
        ops.varlen_attention(q, k, v, cu_q.long(), cu_k.long(), True),
        varlen_reference(q, k, v, cu_q, cu_k, True),
        (q, k, v),
    )
    torch.library.opcheck(ops.varlen_attention, (q, k, v, cu_q.long(), cu_k.long(), True))


def test_varlen_attention_refuses_bad_offsets_before_running():
    q, k, v, cu_q, cu_k = varlen_inputs([5, 3, 4])
    bad = torch.tensor([0, 5, 3, 12], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] = 3 is below cu_seqlens_q\[1\] = 5"):
        ops.varlen_attention(q, k, v, bad, cu_k)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[3\] = 11: the last offset must be the 12"):
        ops.varlen_attention(q, k, v, cu_q, torch.tensor([0, 5, 8, 11], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] = -1: the offsets must start at 0"):
        ops.varlen_attention(q, k, v, torch.tensor([-1, 5, 8, 12], dtype=torch.int32), cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected torch.int32 or torch.int64, got torch.float32"):
        ops.varlen_attention(q, k, v, cu_q.float(), cu_k)
    with pytest.raises(ValueError, match=r"cu_seqlens_q/cu_seqlens_k: shapes \(4,\)/\(3,\) must be equal"):
        ops.varlen_attention(q, k, v, cu_q, cu_k[:3])
    with pytest.raises(ValueError, match=r"key/value: shapes \(2, 12, 16\)/\(2, 11, 16\) must be equal"):
        ops.varlen_attention(q, k, v[:, :11], cu_q, cu_k)
    with pytest.raises(ValueError, match="key: 3 heads do not divide the query's 4 heads"):
        ops.varlen_attention(q, k[:1].expand(3, -1, -1), v[:1].expand(3, -1, -1), cu_q, cu_k)
    with pytest.raises(ValueError, match="query: expected rank 3"):
        ops.varlen_attention(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="varlen_attention takes float32 or bfloat16"):
        ops.varlen_attention(q.half(), k.half(), v.half(), cu_q, cu_k)


def opcheck_args():
    x = torch.randn(5, 33, requires_grad=True)
    w, b = torch.randn(33, requires_grad=True), torch.randn(33, requires_grad=True)
    q, k, v = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 13, 16), torch.randn(1, 2, 13, 16)
    cos, sin = torch.randn(9, 16), torch.randn(9, 16)
    return [
        (ops.softmax, (x,)),
        (ops.rms_norm, (x, w, 1e-5)),
        (ops.layer_norm, (x, w, b, 1e-5)),
        (ops.swiglu, (x, torch.randn(5, 33, requires_grad=True))),
        (ops.matmul, (x, torch.randn(33, 7, requires_grad=True))),
        (ops.rope, (torch.randn(1, 4, 9, 16, requires_grad=True), cos, sin)),
        (ops.flash_attention, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), True, None)),
        (ops.flash_attention, (q, k, v, True, None, 3, 5.0)),
        (ops.flash_attention, (q, k, v, False, None, None, None, padding_mask([11], 9, 13))),
    ]


@pytest.mark.parametrize("op,args", opcheck_args(), ids=lambda a: getattr(a, "__name__", ""))
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


def test_bad_arguments_raise_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="weight: expected 4 elements"):
        ops.rms_norm(torch.randn(2, 4), torch.randn(5), 1e-5)
    with pytest.raises(ValueError, match="x: expected rank 2"):
        ops.matmul(torch.randn(2, 3, 4), torch.randn(4, 2))
    with pytest.raises(ValueError, match="dtype torch.float64 is not supported"):
        ops.softmax(torch.randn(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="key: 3 heads do not divide"):
        ops.flash_attention(torch.randn(1, 4, 8, 16), torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16))


def test_errors_below_autograd_keep_the_python_exception_in_their_message():
    # Under inference mode the native kernel is called directly: PyTorch turns its C++
    # exception into a RuntimeError, whose message starts with the exception it stands for.
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="^ValueError: x: dtype torch.float64 is not supported"):
            ops.softmax(torch.randn(3, 3, dtype=torch.float64))


def test_calls_without_gradients_enter_no_python_autograd_kernel():
    # This build has the C++ autograd kernels (src/autograd.cc) and registers them.
    assert tessera.autograd_kernels() == "native"
    assert re.search(r"AutogradCPU: registered at \S*autograd\.cc", torch._C._dispatch_dump_table("tessera::softmax"))
    x = torch.randn(4, 8)
    assert python_frames_of(lambda: ops.softmax(x), tessera.autograd.__file__) == []
    with torch.no_grad():
        leaf = x.clone().requires_grad_()
        assert python_frames_of(lambda: ops.softmax(leaf), tessera.autograd.__file__) == []
        assert not ops.softmax(leaf).requires_grad
    # A call that needs gradients goes on to the Python kernel, which records the graph.
    assert "kernel" in python_frames_of(lambda: ops.softmax(leaf), tessera.autograd.__file__)
    y = ops.softmax(leaf)
    assert type(y.grad_fn).__name__ == "softmax_functionBackward"
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(leaf.grad, torch.zeros_like(leaf), atol=1e-6, rtol=0)


def test_native_autograd_kernels_refuse_another_pytorch():
    with pytest.raises(
        RuntimeError, match=r"built for PyTorch \d+\.\d+\.\d+, this is 9\.9\.9 \(rebuild the extension\)"
    ):
        tessera._tessera.register_native_autograd(["softmax"], "9.9.9")


def test_python_autograd_kernels_on_request():
    script = (
        "import tessera, torch\n"
        "x = torch.randn(3, 5, requires_grad=True)\n"
        "torch.ops.tessera.softmax(x)[:, 0].sum().backward()\n"
        "ref = x.detach().clone().requires_grad_()\n"
        "torch.softmax(ref, -1)[:, 0].sum().backward()\n"
        "torch.testing.assert_close(x.grad, ref.grad)\n"
        "try:\n"
        "    torch.ops.tessera.softmax(torch.ones(2, dtype=torch.float64))\n"
        "except ValueError as e:\n"
        "    print(tessera.autograd_kernels(), e)\n"
    )
    out = run_without_native_autograd(script)
    assert out.startswith("python x: dtype torch.float64 is not supported"), out


def test_attention_backward_takes_the_forwards_saved_results():
    q, k, v = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 13, 16), torch.randn(1, 2, 13, 16)
    do = torch.randn_like(q)
    out, lse = ops.flash_attention_fwd(q, k, v, True, 0.25)
    recomputed = ops.flash_attention_bwd(q, k, v, do, True, 0.25)
    saved = ops.flash_attention_bwd(q, k, v, do, True, 0.25, out, lse)
    for a, b in zip(recomputed, saved):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="out/lse: pass both"):
        ops.flash_attention_bwd(q, k, v, do, True, 0.25, out)
    with pytest.raises(ValueError, match=r"out/lse: expected the forward's \(1, 4, 9, 16\) output"):
        ops.flash_attention_bwd(q, k, v, do, True, 0.25, out, lse[..., :8, :])


def test_non_contiguous_inputs_are_made_contiguous():
    x = torch.randn(8, 6).t()
    close(ops.softmax(x), torch.softmax(x, -1), torch.float32)


def test_backend_context_manager_and_explain():
    x = torch.randn(4, 8)
    with tessera.backend("interp"):
        assert tessera.explain("softmax", rows=4, cols=8)[0] == "interp"
        close(ops.softmax(x), torch.softmax(x, -1), torch.float32)
    backend, reasons = tessera.explain("softmax", rows=4, cols=8)
    assert backend in ("native", "xla", "interp")
    assert all(isinstance(r, str) for r in reasons)
    with pytest.raises(ValueError, match="expected interp, xla, native or auto"):
        with tessera.backend("tpu"):
            pass


def test_native_f32_ops_use_the_tensors_storage_in_place(capfd, monkeypatch):
    monkeypatch.setenv("TESSERA_LOG", "debug")
    x = torch.randn(13, 70)  # 13 rows: a ragged last block, padded through a copy
    close(ops.softmax(x), torch.softmax(x, -1), torch.float32)
    q, k, v = torch.randn(1, 2, 33, 16), torch.randn(1, 1, 47, 16), torch.randn(1, 1, 47, 16)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    close(ops.flash_attention(q, k, v), want, torch.float32)
    err = capfd.readouterr().err
    assert "native @softmax: running in place on the caller's buffers" in err, err
    assert "native @flash_attention_fwd: running in place" in err, err
    # The backward's chain (delta, then the fused kernel) also runs on the tensors.
    q, k, v = (torch.randn(1, h, 64, 16, requires_grad=True) for h in (4, 2, 2))
    out = ops.flash_attention(q, k, v, is_causal=True)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    err = capfd.readouterr().err
    assert "native @flash_attention_bwd_fused: running in place" in err, err
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=True)
    for got, exp in zip(grads, torch.autograd.grad(want, (q2, k2, v2), torch.ones_like(want))):
        close(got, exp, torch.float32)
    # A ragged sequence: the dq and dk/dv kernels, chained in place too.
    q, k, v = (torch.randn(1, h, 37, 16, requires_grad=True) for h in (2, 1, 1))
    out = ops.flash_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    err = capfd.readouterr().err
    assert "native @flash_attention_bwd_dkdv: running in place" in err, err
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q2, k2, v2, enable_gqa=True)
    for got, exp in zip(grads, torch.autograd.grad(want, (q2, k2, v2), torch.ones_like(want))):
        close(got, exp, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_2_byte_ops_read_and_write_the_tensors_storage(capfd, monkeypatch, dtype):
    # bf16/f16 kernels read 2-byte elements: the tensors' storage, no f32 copies.
    monkeypatch.setenv("TESSERA_LOG", "debug")
    x, w = torch.randn(13, 70, dtype=dtype), torch.randn(70, dtype=dtype)
    close(ops.softmax(x), torch.softmax(x.float(), -1).to(dtype), dtype)
    close(ops.rms_norm(x, w, 1e-5), F.rms_norm(x.float(), (70,), w.float(), 1e-5).to(dtype), dtype)
    err = capfd.readouterr().err
    assert "native @softmax: running in place on the caller's buffers" in err, err
    assert "native @rms_norm: running in place" in err, err
    if dtype != torch.bfloat16:
        return  # the attention ops take f32 and bf16
    # Ragged blocks, GQA, the backward's chain: the dot's operands are widened on load.
    q, k, v = (torch.randn(1, h, 37, 16, dtype=dtype, requires_grad=True) for h in (4, 2, 2))
    out = ops.flash_attention(q, k, v, is_causal=True)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    err = capfd.readouterr().err
    assert "native @flash_attention_fwd: running in place" in err, err
    assert re.search(r"native @flash_attention_bwd_\w+: running in place", err), err
    q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=True)
    close(out, want.to(dtype), dtype)
    for got, exp in zip(grads, torch.autograd.grad(want, (q2, k2, v2), torch.ones_like(want))):
        assert got.dtype == dtype
        close(got, exp.to(dtype), dtype)
    # A chain with host-derived arrays (varlen's tile plan) over 2-byte q, k, v.
    q, k, v, cu_q, cu_k = varlen_inputs([7, 1, 33], dtype=dtype)
    want = varlen_reference(q.float(), k.float(), v.float(), cu_q, cu_k, True, 0.3)
    close(ops.varlen_attention(q, k, v, cu_q, cu_k, True, 0.3), want.to(dtype), dtype)
    assert "native @varlen_fwd: running in place" in capfd.readouterr().err


@pytest.mark.parametrize("kv_heads,backward", [(2, "varlen_bwd_fused"), (1, "varlen_bwd_dkdv")])
def test_varlen_attention_runs_in_place_with_its_plan_derived_on_the_host(capfd, monkeypatch, kv_heads, backward):
    # The tile plan comes from the offsets; q, k, v and the outputs are the tensors' storage.
    monkeypatch.setenv("TESSERA_LOG", "debug")
    q, k, v, cu_q, cu_k = varlen_inputs([5, 1, 37], heads=2, kv_heads=kv_heads, grad=True)
    out = ops.varlen_attention(q, k, v, cu_q, cu_k, True)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    err = capfd.readouterr().err
    assert "native @varlen_fwd: running in place on the caller's buffers" in err, err
    assert f"native @{backward}: running in place" in err, err
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    want = varlen_reference(q2, k2, v2, cu_q, cu_k, True)
    close(out, want, torch.float32)
    for got, exp in zip(grads, torch.autograd.grad(want, (q2, k2, v2), torch.ones_like(want))):
        close(got, exp, torch.float32)


CLI_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "target", "release", "tessera")


@pytest.mark.skipif(not os.path.exists(CLI_PATH), reason="the tessera CLI is built by `make test`")
def test_torch_ops_run_with_the_blocks_tessera_tune_stored(tmp_path):
    # A fresh process per step: ops read the store once per op shape (then memoized).
    env = {**os.environ, "TESSERA_CACHE_DIR": str(tmp_path), "TESSERA_LOG": "debug"}
    env.pop("TESSERA_BACKEND", None)
    tune = subprocess.run(
        [CLI_PATH, "tune", "softmax", "--shape", "rows=16,cols=64", "--runs", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tune.returncode == 0, tune.stderr
    script = (
        "import torch, tessera\n"
        "x = torch.randn(16, 64)\n"
        "torch.testing.assert_close(torch.ops.tessera.softmax(x), torch.softmax(x, -1))\n"
    )

    def run(**extra):
        return subprocess.run(
            [sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True, timeout=300
        )

    tuned = run()
    assert tuned.returncode == 0, tuned.stderr
    assert re.search(r"tuned config block_rows=\d+ for softmax .* on native", tuned.stderr), tuned.stderr
    off = run(TESSERA_TUNE="off")
    assert off.returncode == 0, off.stderr
    assert "TESSERA_TUNE=off: default blocks for softmax" in off.stderr, off.stderr
    for entry in (tmp_path / "tune").iterdir():
        entry.write_bytes(b"garbage")
    corrupt = run()
    assert corrupt.returncode == 0, "a corrupt entry must not fail an op"
    assert "warning: tessera tune:" in corrupt.stderr, corrupt.stderr


def test_large_kernels_run_in_a_forked_child():
    # The threads that split large grids (PyTorch's OpenMP team, or Tessera's own) do
    # not exist in a child forked after they started (as DataLoader workers are): the
    # child runs the whole grid itself. (PyTorch's own parallel ops hang there, libgomp
    # being not fork-safe, until the child calls torch.set_num_threads(1), as DataLoader
    # workers do: so the comparison comes after the op.)
    # In a fresh process: this one has other libraries' threads, whose locks a fork may
    # copy held.
    script = """
import os, sys, torch, tessera
ops = torch.ops.tessera
x = torch.randn(1024, 512)
want = ops.softmax(x)  # starts the team
pid = os.fork()
if pid == 0:
    os.environ["TESSERA_LOG"] = "debug"  # says where the grid ran, on stderr
    got = ops.softmax(x)
    torch.set_num_threads(1)
    os._exit(0 if torch.equal(got, want) else 1)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    run = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        assert "native @softmax: running in place on the caller's buffers, on the calling thread" in err, err
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, 9)  # the script and its forked child
        run.wait()
        pytest.fail("the forked child hung")


def test_small_kernels_run_on_the_calling_thread(capfd, monkeypatch):
    # Waking a pool thread costs more than a small kernel: under 256 KiB moved, the
    # caller runs the whole grid; larger ones are split across the cores.
    monkeypatch.setenv("TESSERA_LOG", "debug")
    ops.softmax(torch.randn(64, 256))
    assert re.search(r"native @softmax: .*on the calling thread", capfd.readouterr().err)
    ops.softmax(torch.randn(1024, 512))
    err = capfd.readouterr().err
    if len(os.sched_getaffinity(0)) > 1:
        assert re.search(r"native @softmax: .*on \d+ threads", err), err


def test_grids_split_on_pytorchs_threads_as_many_as_it_is_told(capfd, monkeypatch):
    # Large grids run on PyTorch's own OpenMP team (which it keeps spinning between its
    # ops), so torch.set_num_threads bounds Tessera's kernels too.
    assert tessera.thread_pool() == "openmp"
    monkeypatch.setenv("TESSERA_LOG", "debug")
    x = torch.randn(1024, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        want = ops.softmax(x)
        assert (
            "native @softmax: running in place on the caller's buffers, on 2 threads (openmp)" in capfd.readouterr().err
        )
        torch.set_num_threads(1)
        assert torch.equal(ops.softmax(x), want)
        assert re.search(r"native @softmax: .*on the calling thread", capfd.readouterr().err)
    finally:
        torch.set_num_threads(threads)


def test_tesseras_own_threads_on_request():
    script = (
        "import tessera, torch; "
        "print(tessera.thread_pool(), torch.ops.tessera.softmax(torch.ones(1024, 512)).sum().item())"
    )
    env = dict(os.environ, TESSERA_THREAD_POOL="tessera")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["tessera", "1024.0"]


def test_torch_compile_fullgraph():
    def block(x, w, q, k, v):
        h = ops.rms_norm(x, w, 1e-5)
        return ops.softmax(h).sum() + ops.flash_attention(q, k, v, is_causal=True).sum()

    args = (
        torch.randn(4, 16),
        torch.randn(16),
        torch.randn(1, 2, 8, 16),
        torch.randn(1, 1, 8, 16),
        torch.randn(1, 1, 8, 16),
    )
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(*args), block(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "rms_norm", "layer_norm", "swiglu", "matmul", "rope"])
def test_gradients_match_autograd(name):
    x = torch.randn(6, 16, requires_grad=True)
    w, b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    other = torch.randn(6, 16, requires_grad=True)
    y = torch.randn(16, 5, requires_grad=True)
    xr = torch.randn(1, 2, 6, 16, requires_grad=True)
    angles = torch.randn(6, 8)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    cases = {
        "softmax": (lambda: ops.softmax(x), lambda: torch.softmax(x, -1), (x,)),
        "rms_norm": (
            lambda: ops.rms_norm(x, w, 1e-5),
            lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w,
            (x, w),
        ),
        "layer_norm": (lambda: ops.layer_norm(x, w, b, 1e-5), lambda: F.layer_norm(x, (16,), w, b, 1e-5), (x, w, b)),
        "swiglu": (lambda: ops.swiglu(x, other), lambda: F.silu(x) * other, (x, other)),
        "matmul": (lambda: ops.matmul(x, y), lambda: x @ y, (x, y)),
        "rope": (lambda: ops.rope(xr, cos, sin), lambda: xr * cos + rotate_half(xr) * sin, (xr,)),
    }
    ours, theirs, inputs = cases[name]
    out = ours()
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, g)
    want = torch.autograd.grad(theirs(), inputs, g)
    for a, b_ in zip(got, want):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-4)


def test_sdpa_override_routes_supported_calls_and_falls_back():
    q, k, v = torch.randn(1, 4, 10, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
    want = sdpa(q, k, v, True)
    kernels_run = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "tessera":
                kernels_run.append(func._opname)
            return func(*args, **(kwargs or {}))

    original = F.scaled_dot_product_attention
    tessera.enable_sdpa_override()
    try:
        with Recorder():
            got = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        close(got, want, torch.float32)
        assert kernels_run == ["flash_attention"]
        mask = torch.ones(10, 10, dtype=torch.bool).tril()
        kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        with Recorder():
            got = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)
        close(got, want, torch.float32)
        assert kernels_run == ["flash_attention"] * 2, "a mask for every head is the kernel's score mask"
        per_head = mask.expand(1, 4, 10, 10).clone()
        with Recorder():
            got = F.scaled_dot_product_attention(q, kr, vr, attn_mask=per_head)
        close(got, want, torch.float32)
        assert kernels_run == ["flash_attention"] * 2, "a mask per head must fall back to PyTorch"
        assert tessera.sdpa._sdpa_supported(q, k, v, None, 0.0, False, False) == "head counts differ without enable_gqa"
    finally:
        tessera.disable_sdpa_override()
    assert F.scaled_dot_product_attention is original
