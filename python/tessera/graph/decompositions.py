"""The ATen decompositions AOTAutograd applies before torch-mlir imports a graph: core
ATen, plus the ops torch-mlir cannot legalize to StableHLO that have an exact
decomposition (batch norm variants, ``EmbeddingBag`` with sum pooling)."""

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten


def _embedding_bag_sum(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                       per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """``EmbeddingBag(mode="sum")`` as a gather and a scatter-add: bag ``b`` sums the
    rows of ``weight`` at ``indices[offsets[b]:offsets[b + 1]]``. Other modes are
    declined."""
    if mode != 0 or per_sample_weights is not None or include_last_offset or padding_idx not in (-1, None):
        return NotImplemented
    n, bags = indices.shape[0], offsets.shape[0]
    position = torch.arange(n, device=indices.device)
    bag_of = (position[:, None] >= offsets[None, :]).sum(1) - 1            # [n]
    out = weight.new_zeros((bags, weight.shape[1])).index_add(0, bag_of, weight[indices])
    empty = indices.new_zeros((0,))
    return out, bag_of, offsets.new_zeros((bags,)), empty


def table():
    """core ATen + the extra decompositions above."""
    d = dict(core_aten_decompositions())
    d.update(get_decompositions([
        aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit,
        aten.native_batch_norm,
    ]))
    d[aten._embedding_bag.default] = _embedding_bag_sum
    d[aten._embedding_bag_forward_only.default] = _embedding_bag_sum
    return d
