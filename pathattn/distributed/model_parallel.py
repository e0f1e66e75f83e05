"""Context parallelism for an unchanged `PaTHLM`: a context manager that
makes every `PaTHAttention` layer of a model run on a sequence shard.

Inside `context_parallel(model, group)` each rank of `group` feeds the model its
contiguous shard of the sequence (rank order = sequence order). Token-wise parts of the
model (embeddings, norms, projections, MLPs, LM head) need nothing; each PaTH layer

* completes the short causal convolution on w across the shard boundary with the last
  K-1 conv inputs of the previous rank (`halo_exchange`, differentiable: the gradient of
  the halo goes back to the previous rank), and
* calls `context_parallel_path_attn` instead of `path_attn`,

through the layer's `sequence` seam (`RingShard` in place of `WholeSequence`): the layer's
forward is the same code in one process and under context parallelism.

Other attention types (RoPE, FoX) would need positions or their own ring and raise a
ValueError. Packed batches (cu_seqlens) are not supported under context parallelism.
"""

from __future__ import annotations

import contextlib

import torch

from ..nn.path_attention import AttentionProjections, PaTHAttention
from ..ops.path.cp import Ring, context_parallel_path_attn

__all__ = ["context_parallel", "RingShard", "halo_exchange"]

_TAG_HALO, _TAG_HALO_GRAD = 500, 600


class _Halo(torch.autograd.Function):
    """halo [B, K1, C] = the last K1 rows of the previous rank's x (zeros on rank 0)."""

    @staticmethod
    def forward(ctx, x, K1: int, ring: Ring):
        B, _, C = x.shape
        r, P = ring.rank, ring.size
        halo = x.new_zeros(B, K1, C)
        works = []
        if r + 1 < P:
            works += ring.isend([x[:, x.shape[1] - K1:]], r + 1, _TAG_HALO)
        if r > 0:
            works += ring.irecv([halo], r - 1, _TAG_HALO)
        Ring.wait(works)
        ctx.K1, ctx.ring, ctx.shape = K1, ring, x.shape
        return halo

    @staticmethod
    def backward(ctx, dhalo):
        K1, ring = ctx.K1, ctx.ring
        r, P = ring.rank, ring.size
        dx = dhalo.new_zeros(ctx.shape)
        works = []
        if r > 0:
            works += ring.isend([dhalo], r - 1, _TAG_HALO_GRAD)
        tail = dhalo.new_empty(dhalo.shape)
        if r + 1 < P:
            works += ring.irecv([tail], r + 1, _TAG_HALO_GRAD)
        Ring.wait(works)
        if r + 1 < P:
            dx[:, dx.shape[1] - K1:] = tail
        return dx, None, None


def halo_exchange(x: torch.Tensor, K1: int, group=None) -> torch.Tensor:
    """x [B, Tr, C] of this rank's shard -> the previous shard's last K1 rows [B, K1, C]
    (zeros on the first rank). Every shard must hold at least K1 tokens."""
    ring = Ring(group)
    if x.shape[1] < K1:
        raise ValueError(f"x: a shard of {x.shape[1]} tokens is shorter than the short "
                         f"convolution's history of {K1} tokens")
    if K1 == 0:
        return x.new_zeros(x.shape[0], 0, x.shape[2])
    return _Halo.apply(x, K1, ring)


class RingShard:
    """The `PaTHAttention.sequence` seam of a layer whose sequence is split over `group`
    (this rank holds one contiguous shard): the short convolution continues from the
    previous shard's last K-1 inputs (`halo_exchange`), attention is
    `context_parallel_path_attn`. Packed batches (cu_seqlens) are refused."""

    def __init__(self, group=None):
        self.group = group

    def short_conv(self, conv, u: torch.Tensor, cu_seqlens: torch.Tensor | None
                   ) -> torch.Tensor:
        """u [B, Tr, C] of this shard -> the conv's output [B, Tr, C] on the whole
        sequence's rows of this shard."""
        _no_packing(cu_seqlens)
        halo = halo_exchange(u, conv.kernel_size - 1, self.group)  # [B, K-1, C]
        return conv.step(u, halo)[0]

    def attention(self, q, k, v, w, beta, g, *, cu_seqlens: torch.Tensor | None,
                  backend: str = "auto") -> torch.Tensor:
        _no_packing(cu_seqlens)
        return context_parallel_path_attn(q, k, v, w, beta, g, group=self.group,
                                          backend=backend)


def _no_packing(cu_seqlens) -> None:
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens: packed sequences are not supported under context "
                         "parallelism")


@contextlib.contextmanager
def context_parallel(model: torch.nn.Module, group=None):
    """Within the block, every `PaTHAttention` of `model` runs context-parallel over
    `group` (see the module docstring): each layer's `sequence` seam is a `RingShard`; the
    model's code is untouched and the seams are restored on exit."""
    layers = [m for m in model.modules() if isinstance(m, PaTHAttention)]
    others = [type(m).__name__ for m in model.modules()
              if isinstance(m, AttentionProjections) and not isinstance(m, PaTHAttention)]
    if others:
        raise ValueError(f"model: context parallelism supports PaTH attention layers only, "
                         f"found {sorted(set(others))}")
    shard = RingShard(group)
    Ring(group)  # raises when torch.distributed is not initialised
    before = [m.__dict__.get("sequence") for m in layers]
    for m in layers:
        m.sequence = shard
    try:
        yield model
    finally:
        for m, old in zip(layers, before, strict=True):
            if old is None:
                del m.sequence  # back to the class default
            else:
                m.sequence = old
