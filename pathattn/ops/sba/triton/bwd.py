"""Backward kernels of stick-breaking attention: a query-parallel kernel for dQ that also
writes each query row's running sums at every key tile, then a key-parallel kernel for dK
and dV that reads them. No atomics.

With dA_ij = dO_i . v_j and P_ij = A_ij dA_ij, the gradient of the natural-unit logit is

    dz_ij = P_ij sigmoid(-z_ij) - sigmoid(z_ij) sum_{allowed j' < j} P_ij'
          = P_ij - sigmoid(z_ij) C_ij,      C_ij = sum_{allowed j' <= j} P_ij'

(z_ij enters log A_ij through log sigmoid(z_ij) and log A_ij' of every key j' < j through
log(1 - sigmoid(z_ij))), and dQ = scale dZ K, dK = scale dZ^T Q, dV = A^T dO.

A needs the sum of ln over the keys to the right of a tile (`run`), C the sum of P over
the keys to its left (`pre`). Each is accumulated in the direction where it is a sum of
its own terms: run right to left, pre left to right, so neither is formed as a difference
of large totals (delta_i - suffix, with delta_i = dO_i . o_i, would put the rounding error
of delta_i into C_ij at every key j, and sigmoid(z_ij) times it into dz_ij for all the far
keys, whose true gradient is about zero).

* `_dq_kernel`, one program per (query tile, query head): pass 1 walks the key tiles
  right to left (logits and ln only) and stores run before each; pass 2 walks them left
  to right, reloads run, forms A, P, C and dZ, accumulates dQ in registers, and stores pre
  before each key tile.
* `_dkdv_kernel`, one program per (key tile, key/value head): for each of the GQA group's
  query heads, walks the query tiles from the diagonal to the end of the sequence, reads
  run and pre of those rows at its key tile, rebuilds the transposed tile [keys, queries]
  and accumulates dK, dV in registers.

The two running sums are stored per (query head, key tile c of the sequence, row):
`snapshots` [2, HQ, NS, N] float32, NS the most key tiles a sequence can have; entry c of
a row is written and read only for c up to the row's own tile. Products have 16-bit
operands for 16-bit inputs (A and dZ rounded to the inputs' dtype), float32 accumulation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ...common.triton_tiles import dot, helper, load_rows, rounded, store_rows
from ._common import allowed_keys, log_remain, softplus_tail, stick_weights

__all__ = ["query_grads", "key_grads"]


@helper
def _diagonal_ln(Q, k_ptr, rows, rmask, sk_n, col0, cols, cmask, scale2, PREC: tl.constexpr,
                 EMULATE: tl.constexpr, CURRENT: tl.constexpr):
    """ln of the diagonal tile [BT, BT] (zero where not allowed)."""
    K = load_rows(k_ptr, rows, rmask, sk_n, col0, cols, cmask)
    zz = dot(Q, tl.trans(K), PREC, EMULATE) * scale2
    return tl.where(allowed_keys(rows, rows, rmask, CURRENT), log_remain(zz, softplus_tail(zz)),
                    0.0)


@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, run_ptr, pre_ptr, table_ptr, sq_n, sq_h,
               sk_n, sk_h, sv_n, sv_h, sdo_n, sdo_h, sdq_n, sdq_h, scale, scale2, N, NS, D, DV,
               GROUP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
               DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
               STAGES: tl.constexpr, CURRENT: tl.constexpr):
    blk = tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // GROUP
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:
        return
    a = (t0 - s0) // BT  # the tile's index in its sequence: its diagonal key tile
    rows = t0 + tl.arange(0, BT)
    rmask = rows < s1
    cols = tl.arange(0, BD)
    cmask = cols < D
    vcols = tl.arange(0, BDV)
    vmask = vcols < DV
    first = hq.to(tl.int64) * NS * N + rows  # the rows' entries at key tile 0; tile c: + c * N
    diag = first + a.to(tl.int64) * N  # at the diagonal key tile
    Q = load_rows(q_ptr, rows, rmask, sq_n, hq * sq_h, cols, cmask)  # [BT, BD]
    dO = load_rows(do_ptr, rows, rmask, sdo_n, hq * sdo_h, vcols, vmask)  # [BT, BDV]
    # pass 1, right to left: run before each key tile (the diagonal first)
    run = tl.sum(_diagonal_ln(Q, k_ptr, rows, rmask, sk_n, h * sk_h, cols, cmask, scale2,
                              PREC, EMULATE, CURRENT), axis=1)
    run_at = run_ptr + diag
    for i in tl.range(1, a + 1, num_stages=STAGES):
        run_at -= N
        tl.store(run_at, run, mask=rmask)
        kr = t0 - i * BT + tl.arange(0, BT)
        kin = kr < t0
        Kc = load_rows(k_ptr, kr, kin, sk_n, h * sk_h, cols, cmask)
        zz = dot(Q, tl.trans(Kc), PREC, EMULATE) * scale2
        run += tl.sum(log_remain(zz, softplus_tail(zz)), axis=1)
    tl.debug_barrier()  # pass 2 reads rows that other threads of this program stored
    # pass 2, left to right
    pre = tl.zeros([BT], dtype=tl.float32)
    dQ = tl.zeros([BT, BD], dtype=tl.float32)
    run_at = run_ptr + first
    pre_at = pre_ptr + first
    for c in tl.range(0, a, num_stages=STAGES):
        kr = s0 + c * BT + tl.arange(0, BT)
        kin = kr < t0
        Kc = load_rows(k_ptr, kr, kin, sk_n, h * sk_h, cols, cmask)
        Vc = load_rows(v_ptr, kr, kin, sv_n, h * sv_h, vcols, vmask)
        run_c = tl.load(run_at, mask=rmask, other=0.0)
        tl.store(pre_at, pre, mask=rmask)
        run_at += N
        pre_at += N
        zz = dot(Q, tl.trans(Kc), PREC, EMULATE) * scale2
        t = softplus_tail(zz)
        sig = tl.exp2(tl.minimum(zz, 0.0) - t)  # sigmoid(z)
        A = stick_weights(zz, log_remain(zz, t), run_c[:, None], zz, False, 1)
        P = A * dot(dO, tl.trans(Vc), PREC, EMULATE)
        dZ = P - sig * (pre[:, None] + tl.cumsum(P, axis=1))
        dQ += dot(rounded(dZ, DT, EMULATE), Kc, PREC, EMULATE)
        pre += tl.sum(P, axis=1)
    # the diagonal tile again (run = 0 before it)
    tl.store(pre_at, pre, mask=rmask)
    K = load_rows(k_ptr, rows, rmask, sk_n, h * sk_h, cols, cmask)
    V = load_rows(v_ptr, rows, rmask, sv_n, h * sv_h, vcols, vmask)
    allowed = allowed_keys(rows, rows, rmask, CURRENT)
    zz = dot(Q, tl.trans(K), PREC, EMULATE) * scale2
    t = softplus_tail(zz)
    sig = tl.exp2(tl.minimum(zz, 0.0) - t)
    A = stick_weights(zz, tl.where(allowed, log_remain(zz, t), 0.0), 0.0, allowed, True, 1)
    P = A * dot(dO, tl.trans(V), PREC, EMULATE)
    dZ = tl.where(allowed, P - sig * (pre[:, None] + tl.cumsum(P, axis=1)), 0.0)
    dQ += dot(rounded(dZ, DT, EMULATE), K, PREC, EMULATE)
    store_rows(dq_ptr, rounded(dQ * scale, DT, EMULATE), rows, rmask, sdq_n, hq * sdq_h,
               cols, cmask)


@triton.jit
def _dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, run_ptr, pre_ptr, table_ptr,
                 sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sdo_n, sdo_h, sdk_n, sdk_h, sdv_n, sdv_h,
                 scale, scale2, N, NS, D, DV, GROUP: tl.constexpr, BT: tl.constexpr,
                 BD: tl.constexpr, BDV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
                 EMULATE: tl.constexpr, STAGES: tl.constexpr, CURRENT: tl.constexpr):
    blk = tl.program_id(0)
    h = tl.program_id(1)
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:
        return
    c = (t0 - s0) // BT  # this key tile's index in its sequence
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
    n_after = (s1 - t0 + BT - 1) // BT - 1  # query tiles after the diagonal
    for gi in range(GROUP):
        hq = h * GROUP + gi
        at = (hq.to(tl.int64) * NS + c) * N  # the entries of key tile c; + rows
        run_at = run_ptr + at
        pre_at = pre_ptr + at
        # diagonal tile: the queries are the keys' own tokens; tiles are [keys, queries]
        Q = load_rows(q_ptr, kr, kmask, sq_n, hq * sq_h, cols, cmask)
        dO = load_rows(do_ptr, kr, kmask, sdo_n, hq * sdo_h, vcols, vmask)
        pre = tl.load(pre_at + kr, mask=kmask, other=0.0)
        allowed = tl.trans(allowed_keys(kr, kr, kmask, CURRENT))
        zz = dot(K, tl.trans(Q), PREC, EMULATE) * scale2
        t = softplus_tail(zz)
        sig = tl.exp2(tl.minimum(zz, 0.0) - t)
        A = stick_weights(zz, tl.where(allowed, log_remain(zz, t), 0.0), 0.0, allowed, True, 0)
        P = A * dot(V, tl.trans(dO), PREC, EMULATE)
        dZ = tl.where(allowed, P - sig * (pre[None, :] + tl.cumsum(P, axis=0)), 0.0)
        dV += dot(rounded(A, DT, EMULATE), dO, PREC, EMULATE)
        dK += dot(rounded(dZ, DT, EMULATE), Q, PREC, EMULATE)
        for i in tl.range(1, n_after + 1, num_stages=STAGES):  # later query tiles
            qr = t0 + i * BT + tl.arange(0, BT)
            qmask = qr < s1  # rows past the end: q = dO = 0 and no contribution
            Q = load_rows(q_ptr, qr, qmask, sq_n, hq * sq_h, cols, cmask)
            dO = load_rows(do_ptr, qr, qmask, sdo_n, hq * sdo_h, vcols, vmask)
            run = tl.load(run_at + qr, mask=qmask, other=0.0)
            pre = tl.load(pre_at + qr, mask=qmask, other=0.0)
            zz = dot(K, tl.trans(Q), PREC, EMULATE) * scale2
            t = softplus_tail(zz)
            sig = tl.exp2(tl.minimum(zz, 0.0) - t)
            A = stick_weights(zz, log_remain(zz, t), run[None, :], zz, False, 0)
            P = A * dot(V, tl.trans(dO), PREC, EMULATE)
            dZ = P - sig * (pre[None, :] + tl.cumsum(P, axis=0))
            dV += dot(rounded(A, DT, EMULATE), dO, PREC, EMULATE)
            dK += dot(rounded(dZ, DT, EMULATE), Q, PREC, EMULATE)
    store_rows(dk_ptr, rounded(dK * scale, DT, EMULATE), kr, kmask, sdk_n, h * sdk_h, cols,
               cmask)
    store_rows(dv_ptr, rounded(dV, DT, EMULATE), kr, kmask, sdv_n, h * sdv_h, vcols, vmask)


def _strides(*xs) -> tuple:
    return tuple(s for x in xs for s in (x.stride(0), x.stride(1)))


def query_grads(q, k, v, do, dq, snapshots, table, scale: float, attend_current: bool,
                BT: int, BD: int, BDV: int, dt, prec: str, emulate: bool,
                launch: dict) -> None:
    """dq [N, HQ, D] (written) from q [N, HQ, D], k [N, H, D], v [N, H, Dv], do [N, HQ, Dv]
    (views with the last dim contiguous; GQA group HQ // H), and the running sums stored
    into snapshots [2, HQ, NS, N] float32; table: tiles of BT tokens."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    launch_kernel(_dq_kernel, (table.shape[0], HQ))(
        q, k, v, do, dq, snapshots[0], snapshots[1], table, *_strides(q, k, v, do, dq),
        scale, scale * 1.4426950408889634, N, snapshots.shape[2], D, Dv, GROUP=HQ // H, BT=BT,
        BD=BD, BDV=BDV, DT=dt, PREC=prec, EMULATE=emulate, STAGES=launch["stages"],
        CURRENT=attend_current, num_warps=launch["num_warps"], num_stages=1)


def key_grads(q, k, v, do, dk, dv, snapshots, table, scale: float, attend_current: bool,
              BT: int, BD: int, BDV: int, dt, prec: str, emulate: bool,
              launch: dict) -> None:
    """dk [N, H, D], dv [N, H, Dv] (written), arguments as `query_grads` after it ran on the
    same snapshots."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    launch_kernel(_dkdv_kernel, (table.shape[0], H))(
        q, k, v, do, dk, dv, snapshots[0], snapshots[1], table,
        *_strides(q, k, v, do, dk, dv), scale, scale * 1.4426950408889634, N,
        snapshots.shape[2], D, Dv, GROUP=HQ // H, BT=BT,
        BD=BD, BDV=BDV, DT=dt, PREC=prec, EMULATE=emulate, STAGES=launch["stages"],
        CURRENT=attend_current, num_warps=launch["num_warps"], num_stages=1)
