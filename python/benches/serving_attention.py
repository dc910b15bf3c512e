"""Attention for serving: Tessera's paged decode and varlen prefill ops against the
PyTorch way of computing the same, in one process.

    .venv/bin/python python/benches/serving_attention.py [--repeats 9]

Paged decode: one query token per sequence over a paged KV cache; PyTorch gathers each
sequence's pages through its block table and runs SDPA. Varlen prefill: sequences of
random lengths packed along the token axis; PyTorch runs SDPA on each sequence's slice
(forward, and forward + backward). Medians of ``--repeats`` timings (each the mean of
enough calls to take ~20 ms, Tessera and PyTorch alternating) and their ratio (< 1:
Tessera is faster).
"""

import torch
import torch.nn.functional as F
from eager_cost import fwd_bwd, print_table

import tessera  # noqa: F401  (registers the ops)

ops = torch.ops.tessera


def paged_inputs(batch, heads, kv_heads, d, page_size, num_pages, max_pages, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, d, generator=g).to(dtype)
    k = torch.randn(kv_heads, num_pages, page_size, d, generator=g).to(dtype)
    v = torch.randn(kv_heads, num_pages, page_size, d, generator=g).to(dtype)
    table = torch.stack([torch.randperm(num_pages, generator=g)[:max_pages] for _ in range(batch)]).int()
    lens = torch.randint(1, max_pages * page_size + 1, (batch,), generator=g, dtype=torch.int32)
    return q, k, v, table, lens


def gathered_sdpa(q, k_cache, v_cache, table, lens):
    outs = []
    page_size = k_cache.shape[2]
    for b in range(q.shape[0]):
        n = int(lens[b])
        used = table[b, : (n + page_size - 1) // page_size].long()
        k = k_cache[:, used].flatten(1, 2)[:, :n]
        v = v_cache[:, used].flatten(1, 2)[:, :n]
        outs.append(F.scaled_dot_product_attention(q[b, :, None], k, v, enable_gqa=True)[:, 0])
    return torch.stack(outs)


def varlen_inputs(batch, total, heads, kv_heads, d, grad=False):
    g = torch.Generator().manual_seed(1)
    cuts = torch.randint(1, total, (batch - 1,), generator=g).sort().values
    cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([total])]).int()
    q = torch.randn(heads, total, d, generator=g).requires_grad_(grad)
    k = torch.randn(kv_heads, total, d, generator=g).requires_grad_(grad)
    v = torch.randn(kv_heads, total, d, generator=g).requires_grad_(grad)
    return q, k, v, cu


def sdpa_per_sequence(q, k, v, cu):
    outs = []
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e > s:
            outs.append(
                F.scaled_dot_product_attention(
                    q[None, :, s:e], k[None, :, s:e], v[None, :, s:e], is_causal=True, enable_gqa=True
                )[0]
            )
    return torch.cat(outs, 1)


def rows():
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        args = paged_inputs(8, 16, 2, 128, 16, 512, 64, dtype)
        yield (
            f"paged decode {name}, B8 16/2 heads D128, <=1024 tokens",
            lambda args=args: ops.paged_attention(*args),
            lambda args=args: gathered_sdpa(*args),
        )
    q, k, v, cu = varlen_inputs(8, 2048, 8, 2, 64)
    yield (
        "varlen prefill causal, 8 seqs / 2048 tokens, 8/2 heads D64",
        lambda: ops.varlen_attention(q, k, v, cu, cu, True),
        lambda: sdpa_per_sequence(q, k, v, cu),
    )
    qg, kg, vg, cu = varlen_inputs(8, 2048, 8, 2, 64, grad=True)
    do, leaves = torch.randn_like(qg), (qg, kg, vg)
    yield (
        "same, forward + backward",
        fwd_bwd(lambda: ops.varlen_attention(qg, kg, vg, cu, cu, True), leaves, do),
        fwd_bwd(lambda: sdpa_per_sequence(qg, kg, vg, cu), leaves, do),
    )


def main():
    print_table(__doc__, rows(), repeats=9, width=58)


if __name__ == "__main__":
    main()
