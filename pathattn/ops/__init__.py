"""PaTH attention ops: references, blockwise PyTorch implementation, public functions."""

from .cache import PaTHCache
from .inference import path_attn_prefill, path_attn_step
from .path_attn import path_attn, path_attn_with_keys
from .reference import path_attn_full_matrix, path_attn_naive
from .sba import sb_attn

__all__ = ["path_attn", "path_attn_with_keys", "path_attn_prefill", "path_attn_step",
           "PaTHCache",
           "path_attn_naive", "path_attn_full_matrix", "sb_attn"]
