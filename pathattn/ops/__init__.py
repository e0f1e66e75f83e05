"""Attention ops, one folder per op over a shared floor: `path` (PaTH / PaTH-FoX),
`fox` (forgetting attention: gated FlashAttention), `sba` (stick-breaking attention),
`common` (layouts, checks, head helpers they share)."""

from .fox import fox_attn, fox_attn_naive
from .path import (
    PaTHCache,
    path_attn,
    path_attn_full_matrix,
    path_attn_naive,
    path_attn_prefill,
    path_attn_step,
    path_attn_weights,
    path_attn_with_keys,
)
from .sba import sb_attn

__all__ = ["path_attn", "path_attn_with_keys", "path_attn_prefill", "path_attn_step",
           "PaTHCache",
           "path_attn_naive", "path_attn_full_matrix", "path_attn_weights", "sb_attn",
           "fox_attn", "fox_attn_naive"]
