"""Several `nn.Linear` layers that read the same input, run as one matrix product.

A decode step of PaTH (paper section 3.4) projects each new token x_t [hidden] six ways
(q, k, v, the low-rank input of w, beta and the forget gates g). At one token per step
each product is a matrix-vector product whose cost is mostly the call itself, so
`FusedProjection` stacks the weights once, [sum of out_features, hidden], and a step runs
one F.linear and splits its output.

The stacked matrix is a copy made when the projection is built. `PaTHAttention` builds it
at the first decode step of a cache and the cache keeps it for the rest of the generation:
the layers' parameters, their names and the state_dict stay as they are (checkpoints load
unchanged, nothing has to notice a weight change), and a generation runs on the weights
its first step saw, as its cached keys do. The cost is one copy of those weights per live
cache.

Only plain `nn.Linear` layers without forward hooks are stacked. A wrapped or hooked layer
(a LoRA adapter, a parametrization, a quantized layer) keeps its own forward: the layers
then run one by one, with the same results as without the fusion.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["FusedProjection"]


class FusedProjection:
    """The weights of `linears` stacked into one matrix (module docstring).

    Args:
        linears: nn.Linear layers with the same in_features, weight dtype and device.

    Attributes: fused, whether the weights are stacked (every layer a plain nn.Linear
    without hooks); then weight [N, in_features] and bias [N] (zeros for a layer without
    bias) in the layers' weight dtype, N = sum of their out_features (else None); sizes,
    their out_features.
    """

    def __init__(self, linears: Sequence[nn.Linear]):
        self.linears = list(linears)
        self.sizes = [lin.out_features for lin in linears]
        self.fused = all(_plain(lin) for lin in linears)
        self.weight = self.bias = None
        if self.fused:
            with torch.no_grad():
                self.weight = torch.cat([lin.weight for lin in linears])  # [N, in_features]
                self.bias = torch.cat([lin.weight.new_zeros(lin.out_features)
                                       if lin.bias is None else lin.bias.to(lin.weight.dtype)
                                       for lin in linears])  # [N]
        self._offsets = [0]
        for n in self.sizes:
            self._offsets.append(self._offsets[-1] + n)

    def __call__(self, x: torch.Tensor, first: int = 0, last: int | None = None,
                 dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """The outputs of linears[first:last] for x [..., in_features]: one tensor
        [..., out_features_i] per layer (views of one product). dtype: compute in it (x,
        weight and bias cast first); None computes as nn.Linear would (autocast applies)."""
        last = len(self.sizes) if last is None else last
        if not self.fused:
            return [_linear(lin, x, dtype) for lin in self.linears[first:last]]
        weight, bias = self.weight, self.bias
        if (first, last) != (0, len(self.sizes)):
            rows = slice(self._offsets[first], self._offsets[last])
            weight, bias = weight[rows], bias[rows]
        if dtype is not None:
            x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
        return list(F.linear(x, weight, bias).split(self.sizes[first:last], dim=-1))


def _plain(lin: nn.Module) -> bool:
    """An nn.Linear itself (no subclass or wrapper) without forward hooks."""
    return type(lin) is nn.Linear and not lin._forward_hooks and not lin._forward_pre_hooks


def _linear(lin: nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """One layer: its own forward, or with dtype its weight and bias cast to it."""
    if dtype is None:
        return lin(x)
    bias = None if lin.bias is None else lin.bias.to(dtype)
    return F.linear(x.to(dtype), lin.weight.to(dtype), bias)
