"""Tessera's attention as a Hugging Face Transformers attention implementation:
``attn_implementation="tessera"``.

    import transformers, tessera   # registers "tessera" when transformers is imported first
    tessera.hf.register()           # or explicitly
    model = transformers.LlamaForCausalLM(config, attn_implementation="tessera")

Each attention call of the model runs ``torch.ops.tessera.flash_attention`` eagerly
(and in graph mode): causal, sliding-window (from the mask Transformers builds), Gemma 2
soft-capping and GQA. A padded batch (each entry's queries seeing one range of keys,
causally or not: left or right padding, the attention mask of a tokenizer) runs
``torch.ops.tessera.varlen_attention`` on the packed tokens; any other mask (padding with
a window or soft-capping, a static cache's decode mask) is flash attention's score mask.
A call no kernel can take (dropout, another dtype or device, a mask per head) runs
Transformers' SDPA implementation and is recorded as a fallback (``tessera.trace_ops()``).
"""

import torch

from . import ops
from .graph.patterns import mask_options
from .trace import record_fallback

NAME = "tessera"


def attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    is_causal=None,
    **kwargs,
):
    """A Transformers attention function: q ``[batch, heads, q_len, head_dim]``, k/v
    ``[batch, kv_heads, kv_len, head_dim]``, the 4-D boolean mask of Transformers' SDPA
    implementation (or None); returns ``([batch, q_len, heads, head_dim], None)``. The
    window is read from the mask (``sliding_window`` is taken so that it does not reach
    the SDPA fallback's keyword arguments)."""
    sq, sk = query.shape[2], key.shape[2]
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    why, causal, window, mask = None, bool(is_causal) and sq > 1 and attention_mask is None, None, None
    if dropout and module.training:
        why = "dropout"
    elif any(t.device.type != "cpu" for t in (query, key, value)):
        why = "not a CPU call"
    elif (refused := ops.refusal("flash_attention", query, key, value)) is not None:
        why = refused
    elif attention_mask is not None:
        options, packed = _read_mask(attention_mask, sq, sk)
        if isinstance(options, str):
            if packed is not None and softcap is None:
                return _varlen(query, key, value, scaling, *packed), None
            refused = ops.refusal("flash_attention", query, key, value, False, None, None, None, attention_mask)
            if refused is None:
                mask = attention_mask
            else:
                why = f"{options}; {refused}"
        else:
            causal, window = options
    if why is not None:
        record_fallback("transformers attention", why)
        if softcap is not None:  # Transformers' SDPA refuses soft-capping
            return _capped_math(
                query, key, value, attention_mask, scaling, softcap, dropout if module.training else 0.0
            ), None
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = torch.ops.tessera.flash_attention(query, key, value, causal, scaling, window, softcap, mask)
    return out.transpose(1, 2).contiguous(), None


_last_mask = None  # (mask, its version, q_len, kv_len, what it says)


def _read_mask(mask, sq: int, sk: int):
    """What ``mask`` says: ``(mask_options(...), _padded(...))``. Every layer of a model
    gets the same mask tensor, so the last one is remembered (by identity and version)
    rather than read again per layer."""
    global _last_mask
    last = _last_mask
    if last is not None and last[0] is mask and last[1:4] == (mask._version, sq, sk):
        return last[4]
    options = mask_options(mask, sq, sk, lambda m: m)
    said = (options, _padded(mask) if isinstance(options, str) else None)
    _last_mask = (mask, mask._version, sq, sk, said)
    return said


def _padded(mask):
    """``(query ranges, key ranges, causal)`` when each batch entry of the ``[batch, 1,
    q_len, kv_len]`` mask lets queries ``[q0, q1)`` see keys ``[k0, k1)``, all of them
    or causally (top-left within the ranges, as varlen attention masks) and nothing else;
    else None."""
    if mask.dim() != 4 or mask.shape[1] != 1:
        return None
    keep = (mask if mask.dtype == torch.bool else mask == 0)[:, 0]
    ranges = []
    for rows, cols in zip(keep.any(-1), keep.any(-2)):
        q, k = rows.nonzero().flatten(), cols.nonzero().flatten()
        if len(q) == 0 or len(k) == 0:
            return None
        ranges.append(((int(q[0]), int(q[-1]) + 1), (int(k[0]), int(k[-1]) + 1)))
    for causal in (True, False):
        want = torch.zeros_like(keep)
        for b, ((q0, q1), (k0, k1)) in enumerate(ranges):
            block = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
            want[b, q0:q1, k0:k1] = block.tril() if causal else block
        if torch.equal(want, keep):
            return [r[0] for r in ranges], [r[1] for r in ranges], causal
    return None


def _varlen(query, key, value, scaling, q_ranges, k_ranges, causal):
    """Attention of a padded batch as varlen attention over its packed tokens; rows of
    padding queries come out 0 (as PyTorch's SDPA gives rows that see no key)."""

    def pack(t, ranges):
        return torch.cat([t[b, :, r0:r1] for b, (r0, r1) in enumerate(ranges)], dim=1)

    def offsets(ranges):
        return torch.tensor([0] + [r1 - r0 for r0, r1 in ranges], dtype=torch.int32).cumsum(0, dtype=torch.int32)

    out = torch.ops.tessera.varlen_attention(
        pack(query, q_ranges),
        pack(key, k_ranges),
        pack(value, k_ranges),
        offsets(q_ranges),
        offsets(k_ranges),
        causal,
        scaling,
    )
    result = query.new_zeros(query.shape)
    start = 0
    for b, (q0, q1) in enumerate(q_ranges):
        result[b, :, q0:q1] = out[:, start : start + q1 - q0]
        start += q1 - q0
    return result.transpose(1, 2).contiguous()


def _capped_math(query, key, value, mask, scaling, softcap, dropout):
    """Soft-capped attention in plain ops (Transformers' eager form), ``[b, s, h, d]``."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-2, -1) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    p = torch.softmax(scores.masked_fill(dead, 0.0), -1, dtype=torch.float32).masked_fill(dead, 0.0)
    p = torch.nn.functional.dropout(p.to(query.dtype), dropout, training=dropout > 0)
    return (p @ value).transpose(1, 2).contiguous()


def register() -> None:
    """Registers ``attn_implementation="tessera"`` with Transformers (its attention
    function, and SDPA's mask builder for its masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
