"""Launch configuration of the stick-breaking kernels: tile lengths, num_warps and stages.

The forward has its own tile length; the two backward kernels share one (the key-parallel
kernel reads the running sums the query-parallel one stored per key tile). Chosen per
padded head dim and operand width so that, compiled for sm_90 and sm_80, no kernel spills
registers and every kernel keeps at least two thread blocks per SM at D = 64 with 16-bit
inputs: checked ahead of time by the tests, figures in docs/sba.md. Without a CUDA device
(the interpreter) the same table is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...common.triton_tiles import padded_dim

__all__ = ["KERNELS", "LaunchConfig", "launch_config", "MAX_HEAD_DIM", "SNAPSHOT_BYTES"]

KERNELS = ("fwd", "dq", "dkdv")
MAX_HEAD_DIM = 256
# the backward's running sums ([2, heads, key tiles, N] float32) of one launch stay under
# this many bytes: more heads than fit run as several launches of whole GQA groups
SNAPSHOT_BYTES = 2**28


@dataclass(frozen=True)
class LaunchConfig:
    """Tile length of the forward (fwd_tile) and of the backward (bwd_tile); per kernel
    ("fwd", "dq", "dkdv") num_warps and stages, as (name, (warps, stages)) pairs."""

    fwd_tile: int
    bwd_tile: int
    launches: tuple

    def tile(self, kernel: str) -> int:
        """The tile length BT of `kernel`."""
        return self.fwd_tile if kernel == "fwd" else self.bwd_tile

    def launch(self, kernel: str) -> dict:
        """Keyword arguments of the kernel's launcher: num_warps and stages."""
        warps, stages = dict(self.launches)[kernel]
        return {"num_warps": warps, "stages": stages}


# (padded head dim, 16-bit operands) -> (fwd BT, bwd BT, (warps, stages) of fwd, dq, dkdv).
# The backward kernels hold more [BT, BT] float32 tiles than FlashAttention's (weights,
# sigmoid, P and the in-tile sums, which Triton computes in a blocked layout): at D = 64
# 64-token tiles spill, 8 warps do not help, 32-token tiles fit with two blocks per SM.
_TABLE = {
    (16, True): (64, 32, ((4, 1), (4, 1), (4, 1))),
    (32, True): (64, 32, ((4, 1), (4, 1), (4, 1))),
    (64, True): (64, 32, ((4, 1), (4, 1), (4, 1))),
    (128, True): (32, 16, ((4, 2), (4, 1), (4, 1))),
    (256, True): (16, 16, ((4, 1), (4, 1), (4, 1))),
    (16, False): (32, 16, ((4, 1), (4, 1), (4, 1))),
    (32, False): (32, 16, ((4, 1), (4, 1), (4, 1))),
    (64, False): (32, 16, ((4, 1), (4, 1), (4, 1))),
    (128, False): (16, 16, ((4, 1), (4, 1), (4, 1))),
    (256, False): (16, 16, ((4, 1), (4, 1), (4, 1))),
}


def launch_config(D: int, Dv: int, dtype: torch.dtype, block_size: int | None = None
                  ) -> LaunchConfig:
    """The configuration for head dims D (q, k) and Dv (v) and inputs of `dtype`;
    block_size (a power of two in [16, 128]) sets both tile lengths. ValueError for head
    dims over MAX_HEAD_DIM."""
    BD = padded_dim(max(D, Dv))
    if BD > MAX_HEAD_DIM:
        raise ValueError(f"backend='triton' supports head dims up to {MAX_HEAD_DIM}, got "
                         f"{max(D, Dv)}")
    fwd, bwd, rows = _TABLE[(BD, dtype != torch.float32)]
    if block_size is not None:
        fwd = bwd = block_size
    return LaunchConfig(fwd, bwd, tuple(zip(KERNELS, rows, strict=True)))
