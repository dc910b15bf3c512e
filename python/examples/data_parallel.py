"""Data parallelism with Tessera: FSDP2 (``fully_shard``) training of a small GPT built
from ``torch.ops.tessera.*``, and graph mode (``torch.compile(backend="tessera")``) inside
each rank of DistributedDataParallel. Each rank trains on its half of every global
batch; the losses equal one process training on whole batches.

    .venv/bin/torchrun --nproc-per-node 2 python/examples/data_parallel.py fsdp
    .venv/bin/torchrun --nproc-per-node 2 python/examples/data_parallel.py ddp-graph
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from llama_block import TinyGPT

import tessera  # noqa: F401  (registers the ops and the "tessera" backend)

STEPS, BATCH, SEQ = 4, 8, 16


def batches(steps=STEPS, batch=BATCH, seq=SEQ, seed=0):
    """The global batches: next token of a repeating pattern."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, 8, (batch, 1), generator=g)
        yield (start + torch.arange(seq + 1)) % 8 * 3 % 64


def train(model, rank=0, world=1, params=None):
    """Trains on this rank's rows of each global batch; returns the global mean loss of
    every step."""
    opt = torch.optim.AdamW(params if params is not None else model.parameters(), lr=3e-3)
    losses = []
    for tokens in batches():
        rows = tokens.chunk(world)[rank]
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return losses


def model(use_tessera=True):
    torch.manual_seed(0)
    return TinyGPT(use_tessera=use_tessera)


def fsdp(rank, world):
    """FSDP2: every block and the root sharded over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    m = model()
    for block in m.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return train(m, rank, world)


def ddp_graph(rank, world):
    """DDP with graph mode inside each rank (the plain-PyTorch model: graph mode
    substitutes Tessera's kernels for its patterns)."""
    m = torch.nn.parallel.DistributedDataParallel(model(use_tessera=False))
    return train(torch.compile(m, backend="tessera", dynamic=False), rank, world, m.parameters())


MODES = {"fsdp": fsdp, "ddp-graph": ddp_graph}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    got = MODES[sys.argv[1]](rank, world)
    want = train(model(use_tessera=sys.argv[1] == "fsdp"))
    if rank == 0:
        print(f"{sys.argv[1]} losses {[round(x, 4) for x in got]}")
        print(f"one process       {[round(x, 4) for x in want]}")
        if sys.argv[1] == "ddp-graph":
            print(f"graph mode: {tessera.graph_stats()}")
    dist.destroy_process_group()
