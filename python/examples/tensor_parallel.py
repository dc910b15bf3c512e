"""Tensor parallelism with Tessera's ops: a Llama-style block (RMSNorm, RoPE, GQA flash
attention, SwiGLU, all ``torch.ops.tessera.*``) split over a device mesh with DTensor's
``parallelize_module``: q/k/v/gate/up column-wise, o/down row-wise. The column-wise
layers hand DTensors sharded over heads (and over the MLP's hidden dim) to the Tessera
ops, whose sharding rules (``tessera.distributed``) run each kernel on the local shards.

Run on CPU with two processes (gloo):

    .venv/bin/torchrun --nproc-per-node 2 python/examples/tensor_parallel.py

Each rank checks the parallel block's output and gradients against the same block run
whole, prints the kernels it launched (with their local shapes), and trains a small GPT
of such blocks split and whole for a few steps (the losses agree).
"""

import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import tessera

ops = torch.ops.tessera


def rope_tables(seq, head_dim):
    freqs = 10000 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.arange(seq).float()[:, None] * freqs[None, :]
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def like(t, table):
    """``table`` replicated on ``t``'s mesh when ``t`` is a DTensor (ops take DTensors or
    tensors, not a mix)."""
    if isinstance(t, DTensor):
        return DTensor.from_local(table, t.device_mesh, [Replicate()] * t.device_mesh.ndim)
    return table


class Block(nn.Module):
    """A decoder block with separate projections (as Llama's), so each can be split."""

    def __init__(self, dim=64, heads=4, kv_heads=2, hidden=128):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.ones(dim))
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = ops.rms_norm(x, self.norm1, 1e-5)

        def heads(t, n):  # [b, s, n * hd] -> [b, n, s, hd] (global shapes under DTensor)
            return t.view(b, s, n, self.head_dim).transpose(1, 2).contiguous()

        q, k, v = heads(self.q(h), self.heads), heads(self.k(h), self.kv_heads), heads(self.v(h), self.kv_heads)
        cos, sin = (like(q, t) for t in rope_tables(s, self.head_dim))
        q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
        a = ops.flash_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim))
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = ops.rms_norm(x, self.norm2, 1e-5)
        return x + self.down(ops.swiglu(self.gate(h), self.up(h)))


class GPT(nn.Module):
    """A small GPT of such blocks: embedding, blocks, final RMSNorm, LM head."""

    def __init__(self, vocab=64, dim=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(ops.rms_norm(x, self.norm, 1e-5))


def parallelize(block, mesh):
    """Splits ``block`` over ``mesh``: column-wise q/k/v/gate/up (their DTensor outputs
    reach the Tessera ops), row-wise o/down (all-reduced outputs)."""
    colwise = ColwiseParallel(use_local_output=False)
    plan = {name: colwise for name in ("q", "k", "v", "gate", "up")}
    plan.update({"o": RowwiseParallel(), "down": RowwiseParallel()})
    return parallelize_module(block, mesh, plan)


def check(seed=0, batch=2, seq=24):
    """Runs the block whole and split on this rank's mesh; returns the largest output and
    gradient differences and the trace of the split run."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(seed)
    whole = Block()
    split = parallelize(copy.deepcopy(whole), mesh)
    x = torch.randn(batch, seq, 64)
    want = whole(x)
    want.square().sum().backward()
    with tessera.trace_ops() as trace:
        got = split(x)
        got.square().sum().backward()
    out_diff = (got - want).abs().max().item()
    grad_diff = max(
        ((p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) - w.grad).abs().max().item()
        for (_, p), (_, w) in zip(split.named_parameters(), whole.named_parameters())
    )
    return out_diff, grad_diff, trace


def train_losses(model, steps=3, seed=0):
    """Per-step losses of AdamW on a next-token task (the same batches on every rank)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 64, (2, 17), generator=g)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_training(seed=0):
    """Trains the GPT whole and with every block split on this rank's mesh; returns both
    loss curves."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(seed)
    whole = GPT()
    split = copy.deepcopy(whole)
    for block in split.blocks:
        parallelize(block, mesh)
    return train_losses(split), train_losses(whole)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out_diff, grad_diff, trace = check()
    split_losses, whole_losses = check_training()
    rank = dist.get_rank()
    print(f"rank {rank}: max |output diff| {out_diff:.2e}, max |gradient diff| {grad_diff:.2e}")
    if rank == 0:
        print(trace)
        print(f"GPT training losses, split {[round(x, 5) for x in split_losses]}")
        print(f"                     whole {[round(x, 5) for x in whole_losses]}")
    dist.destroy_process_group()
    assert out_diff < 1e-4 and grad_diff < 1e-3, (out_diff, grad_diff)
