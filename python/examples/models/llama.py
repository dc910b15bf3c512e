"""A Llama/Qwen-style decoder: RMSNorm, rotary embeddings (rotate-half), grouped-query
attention with ``repeat_kv`` (``[:, :, None].expand(..).reshape(..)``, as Llama writes
it), causal SDPA, SwiGLU MLP; greedy prefill + decode."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        n = self.heads // self.kv_heads
        y = F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Layer(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, kv_heads)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab=256, dim=64, heads=4, kv_heads=2, hidden=176, layers=2, max_seq=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        freqs = 10000.0 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.arange(max_seq).float()[:, None] * freqs[None, :]
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1), persistent=False)

    def forward(self, ids):
        s = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.cos[:s], self.sin[:s]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


def llama_inputs(batch=2, seq=32):
    return (torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1)),)


@torch.no_grad()
def generate(model, ids, steps=3):
    """Greedy decoding: a prefill over ``ids`` then ``steps`` tokens (recomputing the
    prefix; each length is its own static-shape graph)."""
    for _ in range(steps):
        nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return ids
