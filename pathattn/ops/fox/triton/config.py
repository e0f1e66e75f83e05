"""Launch configuration of the FoX kernels: tile length BT, num_warps and pipeline stages.

Chosen per padded head dim and operand width so that, compiled for sm_90, no kernel
spills registers and the forward and backward kernels keep at least two thread blocks per
SM at D = 64 (16-bit inputs): checked ahead of time by the tests, figures in docs/fox.md.
Without a CUDA device (the interpreter) the same table is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...common.triton_tiles import padded_dim

__all__ = ["KERNELS", "LaunchConfig", "launch_config", "padded_dim", "MAX_HEAD_DIM"]

KERNELS = ("fwd", "dkdv", "dq")
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class LaunchConfig:
    """Per kernel ("fwd", "dkdv", "dq"): tile length BT, num_warps and pipeline stages, as
    (name, (BT, warps, stages)) pairs. The gates' sums run on the tiles of "fwd" (G) and
    "dq" (dg)."""

    launches: tuple

    def tile(self, kernel: str) -> int:
        """The tile length BT of `kernel`."""
        return dict(self.launches)[kernel][0]

    def launch(self, kernel: str) -> dict:
        """Keyword arguments of the kernel's launcher: num_warps and stages."""
        _, warps, stages = dict(self.launches)[kernel]
        return {"num_warps": warps, "stages": stages}


# (padded head dim, 16-bit operands) -> (BT, num_warps, stages) of fwd, dkdv, dq. The key
# kernel holds dK, dV, K, V and four [BT, BT] tiles at once: past D = 64 its tile shrinks
# first (at D = 128 BT = 32 spills, and 8 warps do not lower the registers per thread).
_TABLE = {
    (16, True): ((64, 4, 3), (64, 4, 1), (64, 4, 2)),
    (32, True): ((64, 4, 3), (64, 4, 1), (64, 4, 2)),
    (64, True): ((64, 4, 3), (64, 4, 1), (64, 4, 2)),
    (128, True): ((64, 4, 2), (16, 4, 2), (32, 4, 2)),
    (256, True): ((32, 4, 1), (16, 4, 1), (16, 4, 1)),
    (16, False): ((64, 4, 2), (32, 4, 1), (32, 4, 1)),
    (32, False): ((64, 4, 2), (32, 4, 1), (32, 4, 1)),
    (64, False): ((64, 4, 2), (32, 4, 1), (32, 4, 1)),
    (128, False): ((32, 4, 1), (16, 4, 1), (16, 4, 1)),
    (256, False): ((16, 4, 1), (16, 4, 1), (16, 4, 1)),
}


def launch_config(D: int, Dv: int, dtype: torch.dtype, block_size: int | None = None
                  ) -> LaunchConfig:
    """The configuration for head dims D (q, k) and Dv (v) and inputs of `dtype`;
    block_size (a power of two in [16, 128]) sets every kernel's tile length. ValueError
    for head dims over MAX_HEAD_DIM."""
    BD = padded_dim(max(D, Dv))
    if BD > MAX_HEAD_DIM:
        raise ValueError(f"backend='triton' supports head dims up to {MAX_HEAD_DIM}, got "
                         f"{max(D, Dv)}")
    rows = _TABLE[(BD, dtype != torch.float32)]
    if block_size is not None:
        rows = tuple((block_size, warps, stages) for _, warps, stages in rows)
    return LaunchConfig(tuple(zip(KERNELS, rows, strict=True)))
