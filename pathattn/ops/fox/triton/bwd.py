"""Backward kernels of forgetting attention, FlashAttention-2 style: no atomics.

With P rebuilt from the forward's log-sum-exp, dP = dO V^T, delta_i = rowsum(dO_i * O_i)
and dS = P * (dP - delta) (the gradient of the natural-unit logits):

* `_dkdv_kernel`, one program per (key tile, key/value head): walks the query tiles of
  its sequence from its own (diagonal, causal mask) to the last, for each of the GQA group's
  query heads in turn, and accumulates dV = P^T dO and dK = scale * dS^T Q in registers;
  it stores the column sums of dS per query head, colsum_j = sum_i dS_ij.
* `_dq_kernel`, one program per (query tile, query head): walks the key tiles like the
  forward, accumulating dQ = scale * dS K and the row sums rowsum_i = sum_j dS_ij.

The gate enters logit(i, j) as G_i - G_j, so dL/dG_t = rowsum_t - colsum_t and dL/dg_t is
the sum of dL/dG_s over s >= t of t's sequence (`gates.py`). The row sums vanish in exact
arithmetic but not with o rounded to 16 bits; they are kept. Products have 16-bit operands
for 16-bit inputs (P and dS rounded to the inputs' dtype), float32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import (
    diagonal_gate,
    dot,
    gate_ptrs,
    key_gates,
    load_gates,
    load_rows,
    rounded,
    split,
    store_rows,
)

__all__ = ["key_grads", "query_grads"]


@triton.jit
def _dkdv_kernel(q_ptr, k_ptr, v_ptr, G_ptr, gs_ptr, ge_ptr, do_ptr, lse_ptr, delta_ptr,
                 dk_ptr, dv_ptr, dcol_ptr, table_ptr, sq_n, sq_h, sk_n, sk_h, sv_n, sv_h,
                 sdo_n, sdo_h, scale, scale2, HQ, H, D, DV, NTOK, GROUP: tl.constexpr,
                 BT: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, DT: tl.constexpr,
                 PREC: tl.constexpr, EMULATE: tl.constexpr, STAGES: tl.constexpr):
    blk = tl.program_id(0)
    h = tl.program_id(1)
    t0 = tl.load(table_ptr + blk * 3)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:  # an unused row of the table
        return
    kr = t0 + tl.arange(0, BT)
    kmask = kr < s1
    cols = tl.arange(0, BD)
    cmask = cols < D
    vcols = tl.arange(0, BDV)
    vmask = vcols < DV
    K = load_rows(k_ptr, kr, kmask, sk_n, h * sk_h, cols, cmask)  # [BT, BD]
    V = load_rows(v_ptr, kr, kmask, sv_n, h * sv_h, vcols, vmask)  # [BT, BDV]
    dK = tl.zeros([BT, BD], dtype=tl.float32)
    dV = tl.zeros([BT, BDV], dtype=tl.float32)
    causal = (kr[None, :] >= kr[:, None]) & kmask[None, :]  # [keys, queries]
    for gi in range(GROUP):
        hq = h * GROUP + gi
        Gk = load_gates(G_ptr, kr, kmask, HQ, hq, 0.0)  # [BT] float64
        # diagonal tile: the queries are the keys' own tokens
        Ga = tl.load(G_ptr + t0.to(tl.int64) * HQ + hq)
        hi, lo = split(tl.where(kmask, Gk - Ga, 0.0))
        # the keys' offsets to the tile's last token, G_j - G_b1 (the tile is full when
        # later query tiles exist)
        ge = tl.load(gate_ptrs(ge_ptr, hq, NTOK, t0, tl.arange(0, BT)), mask=kmask, other=0.0)
        gb = tl.load(G_ptr + (tl.minimum(t0 + BT, s1) - 1).to(tl.int64) * HQ + hq)
        Q = load_rows(q_ptr, kr, kmask, sq_n, hq * sq_h, cols, cmask)
        dO = load_rows(do_ptr, kr, kmask, sdo_n, hq * sdo_h, vcols, vmask)
        lse = tl.load(lse_ptr + kr.to(tl.int64) * HQ + hq, mask=kmask, other=0.0)
        delta = tl.load(delta_ptr + kr.to(tl.int64) * HQ + hq, mask=kmask, other=0.0)
        # (G_i - G_j) log2(e) at [key j, query i], the forward's float operations
        gate = ((hi[None, :] - hi[:, None]) + (lo[None, :] - lo[:, None])) * 1.4426950408889634
        St = dot(K, tl.trans(Q), PREC, EMULATE) * scale2 + gate
        Pt = tl.where(causal, tl.exp2(St - lse[None, :]), 0.0)  # [keys, queries]
        dV += dot(rounded(Pt, DT, EMULATE), dO, PREC, EMULATE)
        dSt = Pt * (dot(V, tl.trans(dO), PREC, EMULATE) - delta[None, :])
        dK += dot(rounded(dSt, DT, EMULATE), Q, PREC, EMULATE)
        colsum = tl.sum(dSt, axis=1)
        for i in tl.range(1, (s1 - t0 + BT - 1) // BT, num_stages=STAGES):  # later tiles
            qs = t0 + i * BT  # the query tile's first token
            qr = qs + tl.arange(0, BT)
            qmask = qr < s1
            Q = load_rows(q_ptr, qr, qmask, sq_n, hq * sq_h, cols, cmask)
            dO = load_rows(do_ptr, qr, qmask, sdo_n, hq * sdo_h, vcols, vmask)
            lse = tl.load(lse_ptr + qr.to(tl.int64) * HQ + hq, mask=qmask,
                          other=float("inf"))
            delta = tl.load(delta_ptr + qr.to(tl.int64) * HQ + hq, mask=qmask, other=0.0)
            # (G_i - G_qs) + (G_qs - G_b1) - (G_j - G_b1), each term <= 0 (`_common`); the
            # query's term moves into lse (when it is large, P is 0 anyway)
            qb = tl.load(gate_ptrs(gs_ptr, hq, NTOK, qs, tl.arange(0, BT)), mask=qmask,
                         other=0.0)
            lse = lse - qb * 1.4426950408889634
            kb = (tl.load(G_ptr + qs.to(tl.int64) * HQ + hq) - gb).to(tl.float32) - ge
            St = dot(K, tl.trans(Q), PREC, EMULATE) * scale2 + (kb * 1.4426950408889634)[:, None]
            Pt = tl.exp2(St - lse[None, :])  # 0 for the masked queries (lse = inf)
            dV += dot(rounded(Pt, DT, EMULATE), dO, PREC, EMULATE)
            dSt = Pt * (dot(V, tl.trans(dO), PREC, EMULATE) - delta[None, :])
            dK += dot(rounded(dSt, DT, EMULATE), Q, PREC, EMULATE)
            colsum += tl.sum(dSt, axis=1)
        tl.store(dcol_ptr + kr.to(tl.int64) * HQ + hq, colsum, mask=kmask)
    store_rows(dk_ptr, rounded(dK * scale, DT, EMULATE), kr, kmask, H * D, h * D, cols,
               cmask)
    store_rows(dv_ptr, rounded(dV, DT, EMULATE), kr, kmask, H * DV, h * DV, vcols, vmask)


@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, G_ptr, ge_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
               drow_ptr, table_ptr, sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sdo_n, sdo_h, scale,
               scale2, HQ, D, DV, NTOK, GROUP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
               BDV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
               EMULATE: tl.constexpr, STAGES: tl.constexpr):
    blk = tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // GROUP
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:
        return
    rows = t0 + tl.arange(0, BT)
    rmask = rows < s1
    cols = tl.arange(0, BD)
    cmask = cols < D
    vcols = tl.arange(0, BDV)
    vmask = vcols < DV
    Q = load_rows(q_ptr, rows, rmask, sq_n, hq * sq_h, cols, cmask)
    dO = load_rows(do_ptr, rows, rmask, sdo_n, hq * sdo_h, vcols, vmask)
    lse = tl.load(lse_ptr + rows.to(tl.int64) * HQ + hq, mask=rmask, other=float("inf"))
    delta = tl.load(delta_ptr + rows.to(tl.int64) * HQ + hq, mask=rmask, other=0.0)
    Ga = tl.load(G_ptr + t0.to(tl.int64) * HQ + hq)
    hi, lo = split(load_gates(G_ptr, rows, rmask, HQ, hq, Ga) - Ga)
    K = load_rows(k_ptr, rows, rmask, sk_n, h * sk_h, cols, cmask)
    V = load_rows(v_ptr, rows, rmask, sv_n, h * sv_h, vcols, vmask)
    S = dot(Q, tl.trans(K), PREC, EMULATE) * scale2 + diagonal_gate(hi, lo, hi, lo)
    keep = (rows[:, None] >= rows[None, :]) & rmask[None, :] & rmask[:, None]
    P = tl.where(keep, tl.exp2(S - lse[:, None]), 0.0)
    dS = P * (dot(dO, tl.trans(V), PREC, EMULATE) - delta[:, None])
    dQ = dot(rounded(dS, DT, EMULATE), K, PREC, EMULATE)  # [BT, BD]
    rowsum = tl.sum(dS, axis=1)
    # earlier key tiles: the query's gate term (G_i - G_a) log2(e) <= 0 moves into lse (when
    # it is large, every earlier key's P is 0 anyway)
    lse = lse - hi * 1.4426950408889634
    for ks in tl.range(s0, t0, BT, num_stages=STAGES):  # earlier key tiles, all full
        kr = ks + tl.arange(0, BT)
        kin = kr < t0
        K = load_rows(k_ptr, kr, kin, sk_n, h * sk_h, cols, cmask)
        V = load_rows(v_ptr, kr, kin, sv_n, h * sv_h, vcols, vmask)
        kb = key_gates(G_ptr, ge_ptr, ks, Ga, HQ, hq, NTOK, BT)
        S = dot(Q, tl.trans(K), PREC, EMULATE) * scale2 + kb[None, :]
        P = tl.exp2(S - lse[:, None])  # 0 for the masked rows (lse = inf)
        dS = P * (dot(dO, tl.trans(V), PREC, EMULATE) - delta[:, None])
        dQ += dot(rounded(dS, DT, EMULATE), K, PREC, EMULATE)
        rowsum += tl.sum(dS, axis=1)
    store_rows(dq_ptr, rounded(dQ * scale, DT, EMULATE), rows, rmask, HQ * D, hq * D, cols,
               cmask)
    tl.store(drow_ptr + rows.to(tl.int64) * HQ + hq, rowsum, mask=rmask)


def _strides(q, k, v, do) -> tuple:
    return (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            do.stride(0), do.stride(1))


def key_grads(q, k, v, G, gl, do, lse, delta, table, scale: float, BT: int, BD: int, BDV: int,
              dt, prec: str, emulate: bool, launch: dict):
    """Inputs as `fwd.fox_forward` plus do [N, HQ, Dv] (q's dtype, last dim contiguous), lse
    (base 2) and delta = rowsum(dO * O) [N, HQ] float32; table: tiles of BT keys; gl
    [2, HQ, N] the gates' offsets to these tiles (`block_gate_offsets`). Returns
    dk [N, H, D], dv [N, H, Dv] in the inputs' dtype and the column sums of dS [N, HQ]
    (float32)."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    dk = torch.empty(N, H, D, dtype=q.dtype, device=q.device)
    dv = torch.empty(N, H, Dv, dtype=q.dtype, device=q.device)
    dcol = torch.empty(N, HQ, dtype=torch.float32, device=q.device)
    launch_kernel(_dkdv_kernel, (table.shape[0], H))(
        q, k, v, G, gl[0], gl[1], do, lse, delta, dk, dv, dcol, table, *_strides(q, k, v, do),
        scale, scale * 1.4426950408889634, HQ, H, D, Dv, N, GROUP=HQ // H, BT=BT, BD=BD, BDV=BDV,
        DT=dt, PREC=prec, EMULATE=emulate, STAGES=launch["stages"],
        num_warps=launch["num_warps"], num_stages=1)
    return dk, dv, dcol


def query_grads(q, k, v, G, gl, do, lse, delta, table, scale: float, BT: int, BD: int, BDV: int,
                dt, prec: str, emulate: bool, launch: dict):
    """Arguments as `key_grads` (table: tiles of BT queries). Returns dq [N, HQ, D] in the
    inputs' dtype and the row sums of dS [N, HQ] (float32)."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    dq = torch.empty(N, HQ, D, dtype=q.dtype, device=q.device)
    drow = torch.empty(N, HQ, dtype=torch.float32, device=q.device)
    launch_kernel(_dq_kernel, (table.shape[0], HQ))(
        q, k, v, G, gl[1], do, lse, delta, dq, drow, table, *_strides(q, k, v, do), scale,
        scale * 1.4426950408889634, HQ, D, Dv, N, GROUP=HQ // H, BT=BT, BD=BD, BDV=BDV,
        DT=dt, PREC=prec, EMULATE=emulate, STAGES=launch["stages"],
        num_warps=launch["num_warps"], num_stages=1)
    return dq, drow
