"""PaTH attention ops: references, blockwise PyTorch implementation, public functions."""

from .path_attn import path_attn
from .reference import path_attn_full_matrix, path_attn_naive

__all__ = ["path_attn", "path_attn_naive", "path_attn_full_matrix"]
