"""Forward kernel of stick-breaking attention, in base-2 log space (`_common`).

One program per (query tile of BT tokens, query head). It takes the diagonal tile first
(keys of its own tile, the causal mask: j < i, or j <= i with CURRENT), then walks the
earlier key tiles of its sequence right to left, carrying per query row

    run = sum of log2(1 - sigmoid(z)) over the keys of the tiles visited,

and accumulating o += A V with A = exp2(zz + suffix sums of the tile's ln + run). No
normaliser and no running maximum: every log-weight is <= 0. Q, K, V and A enter the
products in the inputs' dtype (16-bit operands, float32 accumulation); run and the sums
stay float32. Writes o [N, HQ, Dv] in the inputs' dtype and nothing else: the backward
recomputes the tiles from q, k, v.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ...common.triton_tiles import dot, load_rows, rounded, store_rows
from ._common import allowed_keys, log_remain, softplus_tail, stick_weights

__all__ = ["sb_forward"]


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, sq_n, sq_h, sk_n, sk_h, sv_n, sv_h,
                so_n, so_h, scale2, D, DV, GROUP: tl.constexpr, BT: tl.constexpr,
                BD: tl.constexpr, BDV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
                EMULATE: tl.constexpr, STAGES: tl.constexpr, CURRENT: tl.constexpr):
    blk = tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // GROUP
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:  # an unused row of the table
        return
    rows = t0 + tl.arange(0, BT)
    rmask = rows < s1
    cols = tl.arange(0, BD)
    cmask = cols < D
    vcols = tl.arange(0, BDV)
    vmask = vcols < DV
    Q = load_rows(q_ptr, rows, rmask, sq_n, hq * sq_h, cols, cmask)  # [BT, BD]
    # diagonal tile: keys t0 .. t0 + BT - 1
    K = load_rows(k_ptr, rows, rmask, sk_n, h * sk_h, cols, cmask)
    V = load_rows(v_ptr, rows, rmask, sv_n, h * sv_h, vcols, vmask)
    zz = dot(Q, tl.trans(K), PREC, EMULATE) * scale2  # [BT, BT] base-2 logits
    allowed = allowed_keys(rows, rows, rmask, CURRENT)
    ln = tl.where(allowed, log_remain(zz, softplus_tail(zz)), 0.0)
    A = stick_weights(zz, ln, 0.0, allowed, True, 1)
    acc = dot(rounded(A, DT, EMULATE), V, PREC, EMULATE)  # [BT, BDV]
    run = tl.sum(ln, axis=1)  # [BT]
    for i in tl.range(1, (t0 - s0) // BT + 1, num_stages=STAGES):  # earlier tiles, all full
        kr = t0 - i * BT + tl.arange(0, BT)
        kin = kr < t0
        K = load_rows(k_ptr, kr, kin, sk_n, h * sk_h, cols, cmask)
        V = load_rows(v_ptr, kr, kin, sv_n, h * sv_h, vcols, vmask)
        zz = dot(Q, tl.trans(K), PREC, EMULATE) * scale2
        ln = log_remain(zz, softplus_tail(zz))
        A = stick_weights(zz, ln, run[:, None], zz, False, 1)
        acc += dot(rounded(A, DT, EMULATE), V, PREC, EMULATE)
        run += tl.sum(ln, axis=1)
    store_rows(o_ptr, rounded(acc, DT, EMULATE), rows, rmask, so_n, hq * so_h, vcols, vmask)


def sb_forward(q, k, v, table, scale: float, attend_current: bool, BT: int, BD: int,
               BDV: int, dt, prec: str, emulate: bool, launch: dict) -> torch.Tensor:
    """q [N, HQ, D], k [N, H, D], v [N, H, Dv] (last dim contiguous), table int32 [NB, 3] of
    tiles of BT tokens (`token_tile_table`). launch: num_warps and stages. Returns o
    [N, HQ, Dv] in q's dtype."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    o = torch.empty(N, HQ, Dv, dtype=q.dtype, device=q.device)
    launch_kernel(_fwd_kernel, (table.shape[0], HQ))(
        q, k, v, o, table, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), o.stride(0), o.stride(1), scale * 1.4426950408889634, D, Dv,
        GROUP=HQ // H, BT=BT, BD=BD, BDV=BDV, DT=dt, PREC=prec, EMULATE=emulate,
        STAGES=launch["stages"], CURRENT=attend_current, num_warps=launch["num_warps"],
        num_stages=1)
    return o
