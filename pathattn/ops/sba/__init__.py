"""Stick-breaking attention (Tan et al. 2024), a baseline beside PaTH attention.

Layers, as for PaTH: the float64 reference (`reference`); the fast implementations, the
blockwise log-space algorithm over block tensors (`blockwise`, as custom ops in `function`)
and the Triton kernels (`triton`); the public op with its backend choice (`sb_attn`); and
inference from a KV cache (`decode`, `cache`).
"""

from .cache import SBACache
from .decode import sb_attn_last_rows, sb_attn_prefill, sb_attn_step
from .reference import sb_attn_naive, sb_attn_weights
from .sb_attn import sb_attn, select_backend

__all__ = ["sb_attn", "select_backend", "sb_attn_naive", "sb_attn_weights", "sb_attn_prefill",
           "sb_attn_step", "sb_attn_last_rows", "SBACache"]
