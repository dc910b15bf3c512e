"""A small DLRM: dense features through a bottom MLP, sparse features through
``EmbeddingBag`` tables (sum pooling over per-sample bags given by offsets), pairwise
dot-product interaction, a top MLP to one logit."""

import torch
import torch.nn as nn


def mlp(sizes):
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, dense=13, tables=(100, 80, 60), dim=16):
        super().__init__()
        self.bottom = mlp([dense, 64, dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in tables)
        n = len(tables) + 1
        self.top = mlp([dim + n * (n - 1) // 2, 64, 1])

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        feats = [x] + [t(indices[i], offsets[i]) for i, t in enumerate(self.tables)]
        z = torch.stack(feats, dim=1)  # [batch, features, dim]
        inter = z @ z.transpose(1, 2)  # pairwise dots
        i, j = torch.tril_indices(z.shape[1], z.shape[1], offset=-1)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1))


def dlrm_inputs(batch=8, bag=3, tables=(100, 80, 60)):
    g = torch.Generator().manual_seed(5)
    dense = torch.randn(batch, 13, generator=g)
    indices = torch.stack([torch.randint(0, min(tables), (batch * bag,), generator=g) for _ in tables])
    offsets = torch.arange(0, batch * bag, bag).expand(len(tables), batch).contiguous()
    return dense, indices, offsets
