"""Helpers that put hand-chosen weights into `PaTHAttention` layers and build the
threshold feed-forward layers of the paper's constructions (appendix A).

The constructions write every matrix out explicitly ("W_k u = ...", "FFN(h)_10 = 1{...}").
These helpers keep that readable: `handset_path_layer` makes a layer whose parameters are
all zero except a short convolution that passes w through unchanged, and `Threshold` is
the step nonlinearity 1{x > 0} the proofs assume for their indicator FFNs.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..nn import PaTHAttention

__all__ = ["handset_path_layer", "identity_short_conv", "pow2_at_least", "Threshold",
           "BETA_LOGIT_MAX"]

# beta_proj bias that saturates beta = 2 sigmoid(z): sigmoid(40) is 1 in float32 and in
# float64, so beta lands on the layer's strict cap, the largest float below 2.
BETA_LOGIT_MAX = 40.0


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (n >= 1). The constructions scale their queries by
    this instead of n itself: any scale >= n works for the proofs, and a power of two
    keeps the scaled query exact in every float format (bf16 included)."""
    return 1 << max(0, math.ceil(math.log2(n)))


def identity_short_conv(layer: PaTHAttention) -> None:
    """Set the layer's short convolution on w to the identity: the tap on the current
    token is 1, the taps on the K-1 previous tokens are 0 (w_t depends on x_t only)."""
    with torch.no_grad():
        layer.w_conv.weight.zero_()  # [C, 1, K]; the last tap multiplies x_t
        layer.w_conv.weight[:, 0, -1] = 1.0
        if layer.w_conv.bias is not None:
            layer.w_conv.bias.zero_()


def handset_path_layer(hidden_size: int, num_heads: int, head_dim: int,
                       beta_logit: float) -> PaTHAttention:
    """A `PaTHAttention` layer (float32) with every weight zero, full-rank w projection,
    identity short convolution and beta_t = 2 sigmoid(beta_logit) for every token and
    head. The caller then writes the rows of q_proj, k_proj, v_proj, w_proj and o_proj
    (`Linear.weight` is [out, in]: row r of the weight is output feature r).

    Args:
        hidden_size: width of the residual stream.
        num_heads: HQ = H heads (no GQA).
        head_dim: D; the layer's logit scale is D ** -0.5.
        beta_logit: the constant pre-sigmoid value of beta (0 gives beta = 1,
            `BETA_LOGIT_MAX` gives the largest beta below 2).
    """
    layer = PaTHAttention(hidden_size, num_heads, head_dim=head_dim, w_rank=None)
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
        layer.beta_proj.bias.fill_(beta_logit)
    identity_short_conv(layer)
    return layer


class Threshold(nn.Module):
    """The step function 1{x > 0} elementwise (x any shape, any float dtype), the
    indicator nonlinearity of the paper's feed-forward layers. It has no gradient; the
    constructions are hand-set, not trained."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > 0).to(x.dtype)
