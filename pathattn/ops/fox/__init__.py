"""Forgetting attention (FoX, Lin et al. 2025): softmax attention whose logits carry the
forget-gate term G_i - G_j, i.e. PaTH-FoX with identity transforms.

Layers: the float64 reference (`reference`); the Triton kernels, FlashAttention-2 with a
gate term, and their custom ops (`triton`); the public op (`api`), which runs the PaTH op
with identity transforms where the kernels do not apply (CPU, float64).
"""

from .api import fox_attn, select_backend
from .reference import fox_attn_naive

__all__ = ["fox_attn", "fox_attn_naive", "select_backend"]
