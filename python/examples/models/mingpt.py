"""minGPT (Karpathy's layout): token + position embeddings, pre-LayerNorm blocks with
causal self-attention (the causal mask is a registered ``bias`` buffer, as in minGPT,
passed to SDPA as ``attn_mask``) and a GELU MLP, tied-free LM head; character-level."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT = "the quick brown fox jumps over the lazy dog. " * 40
VOCAB = sorted(set(TEXT))
VOCAB_SIZE = len(VOCAB)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[:t, :t])
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=VOCAB_SIZE, dim=64, heads=4, layers=2, block=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, block) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def batches(batch=4, block=32, seed=0):
    """Endless (inputs, targets) batches of character ids from ``TEXT``."""
    ids = torch.tensor([VOCAB.index(c) for c in TEXT])
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, len(ids) - block - 1, (batch,), generator=g)
        x = torch.stack([ids[s : s + block] for s in start])
        y = torch.stack([ids[s + 1 : s + block + 1] for s in start])
        yield x, y


def gpt_inputs(batch=4, block=32):
    return (next(batches(batch, block))[0],)


def train(model, step_fn=None, steps=5, lr=3e-3, seed=0):
    """Trains with AdamW; returns the per-step losses. ``step_fn(x, y)`` (e.g. a compiled
    forward+loss) defaults to the model's own loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_of = step_fn or (lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    losses = []
    data = batches(seed=seed)
    for _ in range(steps):
        x, y = next(data)
        loss = loss_of(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
