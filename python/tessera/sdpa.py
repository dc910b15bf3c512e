"""``tessera.enable_sdpa_override()``: CPU ``scaled_dot_product_attention`` calls that
``flash_attention`` takes go to it; the rest to PyTorch's own kernel, recorded."""

import torch

from . import ops
from .trace import record_fallback

_original_sdpa = None


def _sdpa_supported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    """Why this SDPA call cannot go to tessera, or None when it can: SDPA's own rules
    here, then ``flash_attention``'s checks (shapes, dtypes, head dim, the mask)."""
    if attn_mask is not None and (is_causal or attn_mask.requires_grad):
        return "attn_mask with is_causal, or one that requires grad"
    if dropout_p:
        return "dropout is not supported"
    if any(t.device.type != "cpu" for t in (query, key, value)):
        return "not a CPU call"
    if query.dim() == key.dim() == 4 and key.shape[1] != query.shape[1] and not enable_gqa:
        return "head counts differ without enable_gqa"
    return ops.refusal("flash_attention", query, key, value, is_causal, None, None, None, attn_mask)


def enable_sdpa_override():
    """Routes CPU `torch.nn.functional.scaled_dot_product_attention` calls that tessera
    supports (a mask the same for every head included) to `torch.ops.tessera.flash_attention`;
    every other call (a mask per head, dropout, other devices or dtypes) goes to PyTorch's
    own kernel."""
    global _original_sdpa
    if _original_sdpa is not None:
        return
    _original_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        reason = _sdpa_supported(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        if reason is None:
            return torch.ops.tessera.flash_attention(query, key, value, is_causal, scale, mask=attn_mask)
        record_fallback("scaled_dot_product_attention", reason)
        return _original_sdpa(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    torch.nn.functional.scaled_dot_product_attention = sdpa


def disable_sdpa_override():
    """Restores PyTorch's own `scaled_dot_product_attention`."""
    global _original_sdpa
    if _original_sdpa is not None:
        torch.nn.functional.scaled_dot_product_attention = _original_sdpa
        _original_sdpa = None
