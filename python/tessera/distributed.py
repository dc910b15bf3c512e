"""Sharding rules for Tessera's ops on DTensors (tensor parallelism).

Each ``torch.ops.tessera.*`` op gets a ``register_sharding`` rule: the placements of its
inputs under which the op runs on the local shards unchanged, and the placement of its
results. DTensor picks one (redistributing inputs if needed) and calls the op on the
local tensors, so the Tessera kernel sees the shard's shapes. Every op also accepts all
inputs replicated (the op then runs whole on every rank).

| op | sharded forms (besides all-replicated) |
|---|---|
| softmax, rms_norm, layer_norm | any leading dim of ``x`` (weights replicated) |
| swiglu | any dim, the same on both inputs |
| rope | batch or heads of ``x`` (tables replicated) |
| matmul | rows of ``x``; columns of ``y``; the contraction (``x`` columns and ``y`` rows: a partial sum) |
| flash_attention (fwd, bwd) | batch (a score mask with a batch dim too); heads: q and kv heads together |
|   | when the kv heads divide over the mesh (each rank keeps whole GQA groups; the mask replicated) |
| paged_attention | batch (q, table, lengths; caches replicated); heads (q heads with the caches' kv heads) |
| varlen_attention (fwd, bwd) | heads, as flash_attention (the offsets replicated) |
"""

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

_ops = torch.ops.tessera


def _arguments(op):
    return [a.name for a in op.default._schema.arguments]


def _placements(op, args, **sharded):
    """Input placements of ``op`` called with ``args``: ``sharded[name]`` for the named
    tensor arguments, ``Replicate()`` for other tensors, ``None`` for the rest."""
    names = _arguments(op)
    out = []
    for i, name in enumerate(names):
        value = args[i] if i < len(args) else None
        is_tensor = value is not None and hasattr(value, "shape")
        out.append(sharded.get(name, Replicate()) if is_tensor else None)
    return out


def _replicated(op, args, results):
    return ([Replicate()] * results, _placements(op, args))


def _mesh_size(spec):
    return spec.device_mesh.size()


def _leading_dims(op, x_name, results=1):
    """Rules of row-wise ops: shard any dim of ``x`` but the last."""

    def rule(*args):
        x = args[0]
        strategies = [_replicated(op, args, results)]
        for dim in range(len(x.shape) - 1):
            strategies.append(([Shard(dim)] * results, _placements(op, args, **{x_name: Shard(dim)})))
        return strategies

    register_sharding(op.default)(rule)


_leading_dims(_ops.softmax, "x")
_leading_dims(_ops.rms_norm, "x")
_leading_dims(_ops.layer_norm, "x")


@register_sharding(_ops.swiglu.default)
def _swiglu(*args):
    strategies = [_replicated(_ops.swiglu, args, 1)]
    for dim in range(len(args[0].shape)):
        strategies.append(([Shard(dim)], _placements(_ops.swiglu, args, gate=Shard(dim), up=Shard(dim))))
    return strategies


@register_sharding(_ops.rope.default)
def _rope(*args):
    strategies = [_replicated(_ops.rope, args, 1)]
    for dim in (0, 1):
        strategies.append(([Shard(dim)], _placements(_ops.rope, args, x=Shard(dim))))
    return strategies


@register_sharding(_ops.matmul.default)
def _matmul(*args):
    op = _ops.matmul
    return [
        _replicated(op, args, 1),
        ([Shard(0)], _placements(op, args, x=Shard(0))),
        ([Shard(1)], _placements(op, args, y=Shard(1))),
        ([Partial()], _placements(op, args, x=Shard(1), y=Shard(0))),
    ]


def _attention(op, q_like, q_dim, kv, kv_dim, results, batch=None):
    """Rules of attention ops. Heads: the ``q_like`` tensors (queries, their gradients,
    outputs and log-sum-exps) on ``q_dim`` with the ``kv`` tensors on ``kv_dim``, when the
    kv heads divide over the mesh (every rank keeps whole GQA groups); ``results`` are the
    results' head dims. Batch, if given: the ``batch`` tensors on dim 0, and a score mask
    with a batch dim of its own too (a mask, one for every head, is replicated over heads)."""

    def rule(*args):
        named = dict(zip(_arguments(op), args))
        strategies = [_replicated(op, args, len(results))]
        mesh = _mesh_size(named[q_like[0]])
        if named[kv[0]].shape[kv_dim] % mesh == 0 and named[q_like[0]].shape[q_dim] % mesh == 0:
            heads = {name: Shard(q_dim) for name in q_like}
            heads.update({name: Shard(kv_dim) for name in kv})
            strategies.append(([Shard(d) for d in results], _placements(op, args, **heads)))
        if batch is not None:
            mask = named.get("mask")
            per_entry = mask is not None and len(mask.shape) == 4 and mask.shape[0] > 1
            names = (*batch, "mask") if per_entry else batch
            strategies.append(([Shard(0)] * len(results), _placements(op, args, **{n: Shard(0) for n in names})))
        return strategies

    register_sharding(op.default)(rule)


_Q = ("q", "grad_out", "out", "lse")
_QKV = ("q", "k", "v", "grad_out", "out", "lse")
_attention(_ops.flash_attention, _Q, 1, ("k", "v"), 1, [1], batch=_QKV)
_attention(_ops.flash_attention_fwd, _Q, 1, ("k", "v"), 1, [1, 1], batch=_QKV)
_attention(_ops.flash_attention_bwd, _Q, 1, ("k", "v"), 1, [1, 1, 1], batch=_QKV)
_attention(_ops.paged_attention, ("q",), 1, ("k_cache", "v_cache"), 0, [1], batch=("q", "block_table", "context_lens"))
_attention(_ops.varlen_attention, _Q, 0, ("k", "v"), 0, [0])
_attention(_ops.varlen_attention_fwd, _Q, 0, ("k", "v"), 0, [0, 0])
_attention(_ops.varlen_attention_bwd, _Q, 0, ("k", "v"), 0, [0, 0, 0])
