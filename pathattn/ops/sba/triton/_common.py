"""Tile math of the stick-breaking kernels, in base-2 log space.

With zz = z * log2(e) (z = scale * q . k) and t = log2(1 + 2^-|zz|):

    log2(1 - sigmoid(z)) = -softplus(z) / ln 2 = -(max(zz, 0) + t)     ("ln" below)
    log2(sigmoid(z))     = min(zz, 0) - t
    log2 A_ij = log2 sigmoid(z_ij) + sum_{allowed k > j} ln_ik
              = zz_ij + sum_{allowed k >= j} ln_ik                       (ln_ij = logsig - zz)

so a tile's weights are exp2(zz + the inclusive suffix sum of ln along the keys + run), run
the sum of ln over the keys of the tiles to the right. Every term of the sums is <= 0 (no
cancellation) and every weight is exp2 of a number <= 0 where allowed.

t is computed as 2 atanh(s) / ln 2 with s = e / (2 + e), e = 2^-|zz| in (0, 1], s <= 1/3:
an odd series in s whose terms after s^13 fall below 2^-26 of the sum, so t has float32
relative accuracy for every zz, including |zz| > 24 where log2(1 + e) rounds 1 + e to 1 and
returns 0 (a sum of ln over thousands of such keys would then drift).
"""

from __future__ import annotations

import triton.language as tl

from ...common.triton_tiles import helper

__all__ = ["softplus_tail", "log_remain", "stick_weights", "allowed_keys"]


@helper
def softplus_tail(zz):
    """t = log2(1 + 2^-|zz|) (module docstring), float32, elementwise."""
    e = tl.exp2(-tl.abs(zz))
    s = e / (2.0 + e)
    s2 = s * s
    p = s2 * (1.0 / 13.0) + (1.0 / 11.0)
    p = p * s2 + (1.0 / 9.0)
    p = p * s2 + (1.0 / 7.0)
    p = p * s2 + (1.0 / 5.0)
    p = p * s2 + (1.0 / 3.0)
    p = p * s2 + 1.0
    return (2.0 * 1.4426950408889634) * s * p


@helper
def log_remain(zz, t):
    """log2(1 - sigmoid(z)) from zz and its `softplus_tail` t."""
    return -(tl.maximum(zz, 0.0) + t)


@helper
def stick_weights(zz, ln, run, allowed, MASKED: tl.constexpr, AXIS: tl.constexpr):
    """A = exp2(zz + sum of ln over the keys at or after each key + run) on a tile whose
    keys lie along AXIS (1: [queries, keys], 0: [keys, queries]); run broadcast to the
    tile. MASKED: `allowed` (bool, the tile's shape) zeroes A; ln must already be 0 there."""
    log_a = zz + tl.cumsum(ln, axis=AXIS, reverse=True) + run
    if MASKED:
        log_a = tl.where(allowed, log_a, float("-inf"))
    return tl.exp2(log_a)


@helper
def allowed_keys(qr, kr, kmask, CURRENT: tl.constexpr):
    """bool [len(qr), len(kr)]: query token qr may attend to key token kr (kr < qr, or
    kr <= qr with CURRENT) and the key is in its sequence (kmask)."""
    if CURRENT:
        return (kr[None, :] <= qr[:, None]) & kmask[None, :]
    else:
        return (kr[None, :] < qr[:, None]) & kmask[None, :]
