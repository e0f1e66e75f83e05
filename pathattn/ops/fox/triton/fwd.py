"""Forward kernel of forgetting attention: FlashAttention-2 with a gate term.

One program per (query tile of BT tokens, query head). It first takes the diagonal tile
(keys of its own tile, causal mask), whose key j = i makes every row's running maximum
finite, then walks the earlier key tiles of its sequence with an online softmax:

    S = scale * log2(e) * Q K^T + (G_i - G_j) * log2(e)       (`_common`: the gate term)
    m' = max(m, rowmax S),  l = l 2^(m - m') + rowsum 2^(S - m'),
    acc = acc 2^(m - m') + 2^(S - m') V

Q, K, V and P enter the products in the inputs' dtype (16-bit operands, float32
accumulation); m, l, acc stay float32. Writes o [N, HQ, Dv] (the inputs' dtype), for
16-bit inputs also o's rounding error in the same dtype (the backward's delta = rowsum(dO
* o) from the rounded o alone would carry that error into every entry of dS, and through
the column sums into dg), and the log-sum-exp lse [N, HQ] (float32, base 2) that the
backward kernels rebuild P from.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import (
    diagonal_gate,
    dot,
    key_gates,
    load_gates,
    load_rows,
    rounded,
    split,
    store_rows,
)

__all__ = ["fox_forward"]


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, G_ptr, ge_ptr, o_ptr, olo_ptr, lse_ptr, table_ptr,
                sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, scale2, HQ, D, DV, NTOK,
                GROUP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
                STAGES: tl.constexpr, SPLIT_O: tl.constexpr):
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
    Ga = tl.load(G_ptr + t0.to(tl.int64) * HQ + hq)  # float64 reference point
    hi, lo = split(load_gates(G_ptr, rows, rmask, HQ, hq, Ga) - Ga)  # [BT] each
    # diagonal tile: keys t0 .. t0 + BT - 1
    K = load_rows(k_ptr, rows, rmask, sk_n, h * sk_h, cols, cmask)
    V = load_rows(v_ptr, rows, rmask, sv_n, h * sv_h, vcols, vmask)
    S = dot(Q, tl.trans(K), PREC, EMULATE) * scale2 + diagonal_gate(hi, lo, hi, lo)
    keep = (rows[:, None] >= rows[None, :]) & rmask[None, :]
    S = tl.where(keep, S, float("-inf"))
    m = tl.max(S, axis=1)
    P = tl.exp2(S - m[:, None])
    l = tl.sum(P, axis=1)
    acc = dot(rounded(P, DT, EMULATE), V, PREC, EMULATE)  # [BT, BDV]
    qb = hi * 1.4426950408889634  # (G_i - G_a) log2(e)
    for ks in tl.range(s0, t0, BT, num_stages=STAGES):  # earlier key tiles, all full
        kr = ks + tl.arange(0, BT)
        kin = kr < t0
        K = load_rows(k_ptr, kr, kin, sk_n, h * sk_h, cols, cmask)
        V = load_rows(v_ptr, kr, kin, sv_n, h * sv_h, vcols, vmask)
        kb = key_gates(G_ptr, ge_ptr, ks, Ga, HQ, hq, NTOK, BT)
        S = dot(Q, tl.trans(K), PREC, EMULATE) * scale2 + qb[:, None] + kb[None, :]
        m_new = tl.maximum(m, tl.max(S, axis=1))
        alpha = tl.exp2(m - m_new)
        P = tl.exp2(S - m_new[:, None])
        l = l * alpha + tl.sum(P, axis=1)
        acc = acc * alpha[:, None] + dot(rounded(P, DT, EMULATE), V, PREC, EMULATE)
        m = m_new
    o = acc / l[:, None]
    o_hi = rounded(o, DT, EMULATE)
    store_rows(o_ptr, o_hi, rows, rmask, HQ * DV, hq * DV, vcols, vmask)
    if SPLIT_O:  # what rounding o to 16 bits left out, for the backward's delta
        store_rows(olo_ptr, o - o_hi.to(tl.float32), rows, rmask, HQ * DV, hq * DV, vcols,
                   vmask)
    tl.store(lse_ptr + rows.to(tl.int64) * HQ + hq, m + tl.log2(l), mask=rmask)


def fox_forward(q, k, v, G, ge, table, scale: float, BT: int, BD: int, BDV: int, dt, prec: str,
                emulate: bool, launch: dict
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, HQ, D], k [N, H, D], v [N, H, Dv] (last dim contiguous), G [N, HQ] float64
    cumulative gates, ge [HQ, N] their float32 offsets to each tile's last token
    (`block_gate_offsets`), table int32 [NB, 3] of tiles of BT tokens. launch: num_warps and
    stages. Returns o [N, HQ, Dv] in q's dtype, o_lo (16-bit inputs: o's rounding error,
    [N, HQ, Dv] in q's dtype, so that o + o_lo is o to about float32 accuracy; float32
    inputs: empty) and lse [N, HQ] float32 (base 2)."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    split = q.dtype != torch.float32
    o = torch.empty(N, HQ, Dv, dtype=q.dtype, device=q.device)
    o_lo = torch.empty(N if split else 0, HQ, Dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(N, HQ, dtype=torch.float32, device=q.device)
    launch_kernel(_fwd_kernel, (table.shape[0], HQ))(
        q, k, v, G, ge, o, o_lo if split else o, lse, table, q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), scale * 1.4426950408889634, HQ,
        D, Dv, N, GROUP=HQ // H, BT=BT, BD=BD, BDV=BDV, DT=dt, PREC=prec, EMULATE=emulate,
        STAGES=launch["stages"], SPLIT_O=split, num_warps=launch["num_warps"], num_stages=1)
    return o, o_lo, lse
