"""A Llama-style decoder block built from torch.ops.tessera.* (RMSNorm, RoPE, GQA
flash attention, SwiGLU), with a pure-PyTorch twin; used by the tests and runnable:

    .venv/bin/python python/examples/llama_block.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera  # noqa: F401  (registers torch.ops.tessera.*)

ops = torch.ops.tessera


def rope_tables(seq: int, head_dim: int):
    freqs = 10000 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.arange(seq).float()[:, None] * freqs[None, :]
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    """One decoder block; `use_tessera` picks the Tessera ops or plain PyTorch."""

    def __init__(self, dim=32, heads=4, kv_heads=2, hidden=64, use_tessera=True):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.use_tessera = use_tessera
        self.norm1, self.norm2 = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.ones(dim))
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def rms_norm(self, x, w):
        if self.use_tessera:
            return ops.rms_norm(x, w, 1e-5)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, x):
        b, s, d = x.shape
        cos, sin = rope_tables(s, self.head_dim)
        h = self.rms_norm(x, self.norm1)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.use_tessera:
            q, k = ops.rope(q.contiguous(), cos, sin), ops.rope(k.contiguous(), cos, sin)
            a = ops.flash_attention(q, k.contiguous(), v.contiguous(), is_causal=True)
        else:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            group = self.heads // self.kv_heads
            a = F.scaled_dot_product_attention(
                q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=True
            )
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        gate, up = self.gate_up(self.rms_norm(x, self.norm2)).chunk(2, dim=-1)
        mlp = ops.swiglu(gate.contiguous(), up.contiguous()) if self.use_tessera else F.silu(gate) * up
        return x + self.down(mlp)


class TinyGPT(nn.Module):
    """Embedding, `layers` blocks, a final norm and a tied head."""

    def __init__(self, vocab=64, dim=32, layers=2, use_tessera=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, use_tessera=use_tessera) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(dim))
        self.use_tessera = use_tessera

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        x = self.blocks[0].rms_norm(x, self.norm)
        return x @ self.embed.weight.t()


def train(model, steps=50, seed=0, batch=4, seq=16):
    """Trains on a learnable sequence task (next token of a repeating pattern); returns
    the loss of every step."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        start = torch.randint(0, 8, (batch, 1), generator=g)
        tokens = (start + torch.arange(seq + 1)) % 8 * 3 % 64
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    ours = TinyGPT(use_tessera=True)
    theirs = TinyGPT(use_tessera=False)
    theirs.load_state_dict(ours.state_dict())
    a, b = train(ours), train(theirs)
    print(f"tessera loss {a[0]:.3f} -> {a[-1]:.3f}; pytorch loss {b[0]:.3f} -> {b[-1]:.3f}")
    print(f"largest per-step difference {max(abs(x - y) for x, y in zip(a, b)):.2e}")
