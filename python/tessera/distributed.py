"""Sharding rules for Tessera's ops on DTensors (tensor parallelism), made from the
splits each op declares in its spec (``kernels::torch_op::Split``).

Each ``torch.ops.tessera.*`` op gets a ``register_sharding`` rule: the placements of its
inputs under which the op runs on the local shards unchanged, and the placement of its
results. DTensor picks one (redistributing inputs if needed) and calls the op on the
local tensors, so the Tessera kernel sees the shard's shapes. Every op also accepts all
inputs replicated (the op then runs whole on every rank). ``tessera.ops.SPECS[name]
["splits"]`` lists an op's splits (attention: heads, when the kv heads divide over the
mesh, and batch; the row-wise ops: any leading dim; matmul: rows, columns or the
contraction, a partial sum).
"""

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

from . import ops


def _free_dims(axis, rank: int):
    """The dims a split over ``axis`` may take: one each for ``leading`` and ``any``."""
    if axis == "leading":
        return range(rank - 1)
    if axis == "any":
        return range(rank)
    return [None]


def _shard(axis, t, dim, mesh: int, even: bool):
    """The placement of tensor spec ``t`` in a split over ``axis`` (``dim`` for a free
    one); None when an even split does not divide it."""
    if axis == "mask_batch":  # a mask with a batch dim follows the batch; else whole
        return Shard(0) if len(t.shape) == 4 and t.shape[0] > 1 else Replicate()
    d = dim if axis in ("leading", "any") else axis % len(t.shape)
    return None if even and t.shape[d] % mesh else Shard(d)


def _strategies(spec: dict, names: list, args: tuple) -> list:
    """The (output placements, input placements) the op runs under: all replicated, and
    each of its splits (per free dim)."""
    named = dict(zip(names, args))
    tensors = {n for n, a in named.items() if a is not None and hasattr(a, "shape")}
    returns = spec["returns"]

    def inputs(sharded):
        return [sharded.get(n, Replicate()) if n in tensors else None for n in names]

    strategies = [([Replicate()] * returns, inputs({}))]
    for split in spec["splits"]:
        present = [(n, axis) for n, axis in split["args"] if n in tensors]
        if not present:
            continue
        first, axis = named[present[0][0]], present[0][1]
        mesh = first.device_mesh.size()
        for dim in _free_dims(axis, len(first.shape)):
            sharded = {n: _shard(a, named[n], dim, mesh, split["even"]) for n, a in present}
            if any(p is None for p in sharded.values()):
                continue
            outs = [Partial() if p == "partial" else Shard(dim if p == "same" else p) for p in split["outputs"]]
            strategies.append((outs[:returns], inputs(sharded)))
    return strategies


def _register(name: str, spec: dict) -> None:
    op = getattr(torch.ops.tessera, name).default
    names = [a.name for a in op._schema.arguments]
    register_sharding(op)(lambda *args: _strategies(spec, names, args))


for _name, _spec in ops.SPECS.items():
    _register(_name, _spec)
