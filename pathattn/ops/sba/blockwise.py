"""Blockwise stick-breaking attention in log space: the forward and backward passes over
block tensors.

With z_ij = scale * q_i . k_j and the keys k allowed for query i (k < i, or k <= i with
attend_current):

    log A_ij = logsigmoid(z_ij) + sum_{allowed k > j} logsigmoid(-z_ik)

(logsigmoid(-z) = log(1 - sigmoid(z))). Key blocks are visited right to left, as the block
scan of `pathattn.ops.common.layout` orders them (step d pairs query block l with key block l - d,
d = 0 the diagonal). Each query row carries `run`, the sum of logsigmoid(-z) over the keys of
the blocks already visited; inside a tile the sum over the later keys of the same tile is one
GEMM with a strictly upper-triangular matrix of ones (all terms have the same sign: no
cancellation). Every weight is exp of a number <= 0, so nothing overflows.

Backward, with dA_ij = dO_i . v_j and P_ij = dA_ij A_ij:

    dz_ij = P_ij sigmoid(-z_ij) - sigmoid(z_ij) sum_{j' < j} P_ij'

z_ij enters log A_ij through logsigmoid(z_ij) and log A_ij' of every earlier key j' through
logsigmoid(-z_ij). The prefix sum over j' < j is the row total delta_i = dO_i . o_i (the
output of the forward, kept unrounded) minus the suffix over j' >= j, which the right-to-left
visit accumulates (`seen`) as the forward accumulates `run` (FlashAttention's delta).

Tiles are [some active query blocks, H, Gr * C, C]: a scan step runs its active query
blocks in chunks of at most TILE_ELEMENTS tile entries, so the tiles take a bounded amount of
memory whatever T (one block per chunk at least: O(HQ * C^2)), never T x T; what grows with T
is O(T) (running sums, saved inputs and outputs).

Shapes: block tensors of `pathattn.ops.path.stages`, queries [NB, H, R, D] with R = Gr * C rows
(GQA group of Gr query heads, then the C positions), keys and values [NB, H, C, D].
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..common.layout import BlockLayout

__all__ = ["Tile", "log_sigmoid", "tile_weights", "later_keys_matrix", "diagonal_allowed",
           "forward_blocks", "backward_blocks", "TILE_ELEMENTS"]

# entries of one tile tensor per chunk (1 MiB in float32): on a 2-core CPU, chunks of
# 2**16 .. 2**18 entries ran faster than 2**20 (cache-resident tiles), with less memory
TILE_ELEMENTS = 2**18


class Tile(NamedTuple):
    """One query-rows x key-columns tile: z the scaled logits, ln = logsigmoid(-z) (zero where
    not allowed), A the attention weights (zero where not allowed); each [..., R, C]."""

    z: torch.Tensor
    ln: torch.Tensor
    A: torch.Tensor


def log_sigmoid(z: torch.Tensor) -> torch.Tensor:
    """log(sigmoid(z)) = -softplus(-z), exact to rounding in float32 and float64 (threshold 40:
    beyond it log1p(exp(-40)) is below float64's resolution). Not F.logsigmoid: its CPU
    kernel splits even a tiny tensor across threads, which costs milliseconds per call on a
    busy machine, and the op calls it twice per tile."""
    return F.softplus(-z, threshold=40).neg_()


def later_keys_matrix(C: int, inclusive: bool, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    """[C, C] ones where row c' > column c (c' >= c when inclusive): x @ it sums x over the
    later columns of each column."""
    i = torch.arange(C, device=device)
    later = i[:, None] >= i[None, :] if inclusive else i[:, None] > i[None, :]
    return later.to(dtype)


def diagonal_allowed(R: int, C: int, attend_current: bool,
                     device: torch.device) -> torch.Tensor:
    """bool [R, C] of a diagonal tile: row r (position r % C) may attend to column c."""
    pos = torch.arange(R, device=device) % C  # [R]
    col = torch.arange(C, device=device)
    return col[None, :] <= pos[:, None] if attend_current else col[None, :] < pos[:, None]


def tile_weights(q: torch.Tensor, k: torch.Tensor, run: torch.Tensor, scale: float,
                 allowed: torch.Tensor | None, later: torch.Tensor) -> Tile:
    """q [..., R, D], k [..., C, D], run [..., R] (log of what the keys to the right of this
    tile left over), allowed bool broadcastable to [..., R, C] or None (all allowed), later
    = later_keys_matrix(C, inclusive=False)."""
    z = (q @ k.mT).mul_(scale)  # [..., R, C]
    ln = log_sigmoid(-z)  # log(1 - sigmoid(z))
    if allowed is not None:
        ln = ln.masked_fill(~allowed, 0)
    log_a = log_sigmoid(z).add_(ln @ later).add_(run[..., None])
    A = log_a.exp_()
    if allowed is not None:
        A = A.masked_fill(~allowed, 0)
    return Tile(z, ln, A)


def _chunks(lay: BlockLayout, d: int, per_block: int) -> list[tuple[int, int]]:
    """The active query blocks [0, counts[d]) of step d, cut into ranges [a, b) of tiles of
    at most TILE_ELEMENTS entries (per_block entries per query block)."""
    n = max(1, TILE_ELEMENTS // per_block)
    cnt = lay.counts[d]
    return [(a, min(a + n, cnt)) for a in range(0, cnt, n)]


def _keys(lay: BlockLayout, x: torch.Tensor, d: int, a: int, b: int) -> torch.Tensor:
    """x[key blocks of the active query blocks a .. b - 1 of step d] (a view when the key
    rows are a contiguous range)."""
    lo = lay.key_lo[d]
    return x[lo + a: lo + b] if lo is not None else x.index_select(0, lay.key_rows[d][a:b])


def _add_to_keys(lay: BlockLayout, x: torch.Tensor, d: int, a: int, src: torch.Tensor) -> None:
    """x[key blocks of the active query blocks a .. a + len(src) - 1 of step d] += src."""
    lo, b = lay.key_lo[d], a + src.shape[0]
    if lo is not None:
        x[lo + a: lo + b] += src
    else:
        x.index_add_(0, lay.key_rows[d][a:b], src)


def forward_blocks(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, lay: BlockLayout,
                   scale: float, attend_current: bool) -> torch.Tensor:
    """qb [NB, H, R, D], kb [NB, H, C, D], vb [NB, H, C, Dv] in one dtype -> ob
    [NB, H, R, Dv] (rows of padding slots are meaningless)."""
    NB, H, R, _ = qb.shape
    later = later_keys_matrix(lay.C, False, qb.dtype, qb.device)
    diag = diagonal_allowed(R, lay.C, attend_current, qb.device)
    ob = qb.new_zeros(NB, H, R, vb.shape[-1])
    run = qb.new_zeros(NB, H, R)
    for d in range(lay.n_max):
        for a, b in _chunks(lay, d, H * R * lay.C):
            t = tile_weights(qb[a:b], _keys(lay, kb, d, a, b), run[a:b], scale,
                             diag if d == 0 else None, later)  # [b - a, H, R, C]
            ob[a:b] += t.A @ _keys(lay, vb, d, a, b)  # [b - a, H, R, Dv]
            run[a:b] += t.ln.sum(-1)
    return ob


def backward_blocks(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, dob: torch.Tensor,
                    delta: torch.Tensor, lay: BlockLayout, scale: float,
                    attend_current: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dqb, dkb, dvb) of `forward_blocks`, shaped as (qb, kb, vb), recomputing
    each tile. dob [NB, H, R, Dv] the output gradient (zero at padding slots); delta
    [NB, H, R] = sum(dob * ob, -1) with the forward's ob."""
    NB, H, R, _ = qb.shape
    later = later_keys_matrix(lay.C, False, qb.dtype, qb.device)
    from_here = later_keys_matrix(lay.C, True, qb.dtype, qb.device)
    diag = diagonal_allowed(R, lay.C, attend_current, qb.device)
    dqb, dkb, dvb = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
    run = qb.new_zeros(NB, H, R)
    seen = qb.new_zeros(NB, H, R)  # sum of P over the keys of the tiles visited
    for d in range(lay.n_max):
        allowed = diag if d == 0 else None
        for a, b in _chunks(lay, d, H * R * lay.C):
            q, k, v, do = qb[a:b], _keys(lay, kb, d, a, b), _keys(lay, vb, d, a, b), dob[a:b]
            t = tile_weights(q, k, run[a:b], scale, allowed, later)
            P = (do @ v.mT).mul_(t.A)  # [b - a, H, R, C]
            before = (delta[a:b] - seen[a:b])[..., None] - P @ from_here  # sum over j' < j
            dz = P * torch.sigmoid(-t.z) - torch.sigmoid(t.z) * before
            if allowed is not None:
                dz = dz.masked_fill(~allowed, 0)
            dz.mul_(scale)
            dqb[a:b] += dz @ k  # [b - a, H, R, D]
            _add_to_keys(lay, dkb, d, a, dz.mT @ q)  # [b - a, H, C, D]
            _add_to_keys(lay, dvb, d, a, t.A.mT @ do)  # [b - a, H, C, Dv]
            run[a:b] += t.ln.sum(-1)
            seen[a:b] += P.sum(-1)
    return dqb, dkb, dvb
