"""The ATen decompositions AOTAutograd applies before torch-mlir imports a graph: core
ATen, plus the ops torch-mlir cannot legalize to StableHLO that have an exact
decomposition (batch norm variants, ``squeeze.dims``, ``as_strided`` that only
re-strides size-1 dims, ``slice_scatter``, ``EmbeddingBag`` with sum pooling)."""

import math

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten


def _embedding_bag_sum(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """``EmbeddingBag(mode="sum")`` as a gather and a scatter-add: bag ``b`` sums the
    rows of ``weight`` at ``indices[offsets[b]:offsets[b + 1]]``. Other modes are
    declined."""
    if mode != 0 or per_sample_weights is not None or include_last_offset or padding_idx not in (-1, None):
        return NotImplemented
    n, bags = indices.shape[0], offsets.shape[0]
    position = torch.arange(n, device=indices.device)
    bag_of = (position[:, None] >= offsets[None, :]).sum(1) - 1  # [n]
    out = weight.new_zeros((bags, weight.shape[1])).index_add(0, bag_of, weight[indices])
    empty = indices.new_zeros((0,))
    return out, bag_of, offsets.new_zeros((bags,)), empty


def _squeeze_dims(x, dims):
    """``aten.squeeze.dims`` (torch-mlir leaves it unlowered) as a view to the squeezed
    shape."""
    rank = max(x.dim(), 1)
    dims = {d % rank for d in dims}
    return x.view([s for i, s in enumerate(x.shape) if not (i in dims and s == 1)])


def _as_strided_view(x, size, stride, storage_offset=None):
    """``as_strided`` that only re-strides a contiguous tensor's size-1 dims (a
    channels-last ``mean(keepdim=True)``, say) as a view; torch-mlir lowers the general
    op to a gather. Others are declined."""
    contiguous = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        contiguous[i] = contiguous[i + 1] * size[i + 1]
    if (
        storage_offset not in (None, 0)
        or not x.is_contiguous()
        or x.numel() != math.prod(size)
        or any(n != 1 and s != c for n, s, c in zip(size, stride, contiguous))
    ):
        return NotImplemented
    return x.view(size)


def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """``slice_scatter`` with unit step as a concatenation of the kept slices and
    ``src``: torch-mlir's own lowering runs out of memory on an open end (``x[..., 8:]``'s
    backward passes ``end = 2**63 - 1``, as Transformers' rotate_half does)."""
    if step != 1:
        return NotImplemented
    size = x.shape[dim]
    start = 0 if start is None else min(max(start + size if start < 0 else start, 0), size)
    end = size if end is None else min(max(end + size if end < 0 else end, start), size)
    parts = [aten.slice.Tensor(x, dim, 0, start), src, aten.slice.Tensor(x, dim, end, size)]
    return aten.cat.default([p for p in parts if p.shape[dim] != 0] or [src], dim)


def table():
    """core ATen + the extra decompositions above."""
    d = dict(core_aten_decompositions())
    d.update(
        get_decompositions(
            [
                aten._native_batch_norm_legit_no_training,
                aten._native_batch_norm_legit,
                aten.native_batch_norm,
            ]
        )
    )
    d[aten.squeeze.dims] = _squeeze_dims
    d[aten.as_strided.default] = _as_strided_view
    d[aten.slice_scatter.default] = _slice_scatter
    d[aten._embedding_bag.default] = _embedding_bag_sum
    d[aten._embedding_bag_forward_only.default] = _embedding_bag_sum
    return d
