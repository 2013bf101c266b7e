"""transformers' sdpa attention, minus one copy that batched decoding with padding pays every step.

With a padding mask (any batch of episodes of different lengths), transformers' sdpa path expands
the K/V heads of a grouped-query model to one per query head (`repeat_kv`) before attention: a copy
of the whole KV cache, times the group size, in every layer at every decode step (8x for
Qwen2.5-3B's 16 query / 2 KV heads). For a single new token there is nothing causal left to mask
inside the step, so the query heads that share a K/V head can instead be laid along the query-length
axis of that head: same arithmetic, no copy. Every other call goes to transformers' own function.

`load_policy` switches hf-backend models whose recipe asks for sdpa to this implementation.
"""

from __future__ import annotations

import torch

NAME = "seal_mini_sdpa"


def grouped_decode_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention for transformers' AttentionInterface: (B, H, q, d) query -> (B, q, H, d) output."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len == 1 and heads != kv_heads and dropout == 0.0 and kwargs.get("position_bias") is None:
        grouped = query.view(batch, kv_heads, heads // kv_heads, dim)  # (B, Hkv, G, d): head h = i * G + g
        out = torch.nn.functional.scaled_dot_product_attention(
            grouped, key, value, attn_mask=attention_mask, scale=scaling
        )  # (B, Hkv, G, d); a (B, 1, 1, L) mask broadcasts over the group
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def register() -> str:
    """Make NAME a valid `attn_implementation` (masks built as for sdpa); returns NAME.

    The mask registration matters: transformers builds no attention mask at all for an implementation
    it has no mask function for, and padded rows would then attend to padding."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
