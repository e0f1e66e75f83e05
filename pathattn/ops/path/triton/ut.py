"""Per-block UT transform (paper section 3.3) and its backward, as Triton kernels.

For a block of BT tokens with K [BT, D] and its reflections W [BT * R, D] (rows w_l, R per
token: reflection l = t * R + r of token t = l // R) with strengths beta [BT * R]:

    X = (I + strictLower(diag(beta) W W^T))^{-1},   A = X diag(beta)       (the paper's T^{-1})
    U = A W                 block transition Pt = P^T = I - W^T U
    M = A later(W K^T)      later(.)_lj = (.)_lj where l // R > j (strictly lower for R = 1)
    K~ = K - M^T W          keys moved to the block's end: k~_j = H_last ... H_{j+1} k_j

and for (scaled) queries Q of the block, with QW = incl(Q W^T), incl(.)_il = (.)_il where
l // R <= i (lower triangular for R = 1),

    Q~ = Q - QW U           q~_i = H_first ... H_i q_i
    S  = Q K^T - QW M       in-block logits (for j <= i)

The triangular matrices run over the block's BT * R reflections, the masks read each
reflection's token; Q~, K~ and S have one row per token whatever R.

`ut_fwd` stores U, K~, M and the inverse X; the forward and backward scans rebuild Q~ and
S from them, and `ut_bwd` reuses X (the transform runs once per training step). `ut_bwd`
takes the gradients of Q~, S (per query head), K~ and of the transitions (as dU
and a direct dW term) and returns dq, dk, dw, dbeta by the chain rule through the formulas
above (dX = -X^T dX X^T for the inverse), in four kernels: the query side per query head
(`_ut_bwd_q_kernel`, which adds its share of the key head's dK, dM, dU, dW with relaxed
atomics, G-way at most), then per key head dk (`_ut_bwd_dk_kernel`), dw's terms through
K~, U and M (`_ut_bwd_kernel`, dA and part of dW to memory) and those through the inverse
(`_ut_bwd_inv_kernel`: dbeta, dw). Fewer kernels held more tiles at once and spilled.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import (
    block_reflections,
    device_fn,
    finite_or_zero,
    load_input,
    load_tile,
    mm,
    reflection_tile,
    reflection_tokens,
    row_offsets,
    tile_ptrs,
)

__all__ = ["ut_fwd", "ut_bwd"]


@device_fn
def _unit_lower_inverse(L, BTR: tl.constexpr, LOG_BTR: tl.constexpr, PREC: tl.constexpr):
    """(I + L)^{-1} for strictly lower L [BTR, BTR] by recursive 2 x 2 block inversion:
    with X_s the inverses of the diagonal s x s blocks, every 2s x 2s diagonal block
    [[A, 0], [C, B]] has the inverse X_2s = X_s - X_s C X_s (its lower-left block is
    -B^-1 C A^-1), so log2(BTR) levels of two products give the inverse (O(BTR^3) work,
    the stability of blocked forward substitution)."""
    r = tl.arange(0, BTR)
    rb = r[:, None]
    cb = r[None, :]
    X = tl.where(rb == cb, 1.0, 0.0) - tl.where((rb // 2 == cb // 2) & (rb > cb), L, 0.0)
    for i in tl.static_range(1, LOG_BTR):
        lower_left = (rb >> i == (cb >> i) + 1) & ((rb >> i) % 2 == 1)
        X -= mm(mm(X, tl.where(lower_left, L, 0.0), PREC), X, PREC)
    return X


@device_fn
def _block_products(W, K, BT: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                    PREC: tl.constexpr):
    """E = W W^T ([BTR, BTR]) and N = later(W K^T) ([BTR, BT]) of one block."""
    later = reflection_tokens(R, BTR)[:, None] > tl.arange(0, BT)[None, :]
    E = mm(W, tl.trans(W), PREC)
    N = tl.where(later, mm(W, tl.trans(K), PREC), 0.0)
    return E, N


@device_fn
def _block_rows(table_ptr, BT: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr):
    """Token rows of this program's block and their mask, the rows of its reflections and
    their mask (`_common.block_reflections`), and whether the table row is a block (rows
    past the last block are empty: `_common.block_table`)."""
    blk = tl.program_id(0)
    t0 = tl.load(table_ptr + blk * 3)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    rows = t0 + tl.arange(0, BT)
    wrows, wmask = block_reflections(t0, s1, BT, R, BTR)
    return rows, rows < s1, wrows, wmask, t0 < s1


@device_fn
def _reflection_inputs(w_ptr, beta_ptr, wrows, wmask, h, H, D, cols, cmask):
    """W [BTR, BD] and beta [BTR] of one block and key head, in float32, their non-finite
    entries read as 0."""
    W = load_input(w_ptr, wrows, wmask, H * D, h * D, cols, cmask).to(tl.float32)
    b = finite_or_zero(tl.load(beta_ptr + row_offsets(wrows, H, h), mask=wmask,
                               other=0.0).to(tl.float32))
    return W, b


@device_fn
def _block_inputs(w_ptr, k_ptr, beta_ptr, rows, rmask, wrows, wmask, h, H, D, cols, cmask):
    """W, beta (`_reflection_inputs`) and K [BT, BD] of one block and key head."""
    W, b = _reflection_inputs(w_ptr, beta_ptr, wrows, wmask, h, H, D, cols, cmask)
    K = load_input(k_ptr, rows, rmask, H * D, h * D, cols, cmask).to(tl.float32)
    return W, K, b


@triton.jit
def _ut_fwd_kernel(k_ptr, v_ptr, w_ptr, beta_ptr, u_ptr, kt_ptr, m_ptr, x_ptr, wt_ptr, vc_ptr,
                   table_ptr, H, D, DV, BT: tl.constexpr, BD: tl.constexpr,
                   BDV: tl.constexpr, PREC: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                   LOG_BTR: tl.constexpr):
    h = tl.program_id(1)
    rows, rmask, wrows, wmask, live = _block_rows(table_ptr, BT, R, BTR)
    if not live:
        return
    cols = tl.arange(0, BD)
    cmask = cols < D
    cbt = tl.arange(0, BT)
    cbr = tl.arange(0, BTR)
    W, b = _reflection_inputs(w_ptr, beta_ptr, wrows, wmask, h, H, D, cols, cmask)
    wsmask = wmask[:, None] & cmask[None, :]
    # w as the scans read it: finite, in the transitions' operand dtype
    tl.store(tile_ptrs(wt_ptr, wrows, H * D, h * D, cols), W, mask=wsmask)
    # the inverse first, K loaded after it (fewer tiles live through its products)
    strict = cbr[:, None] > cbr[None, :]
    X = _unit_lower_inverse(tl.where(strict, b[:, None] * mm(W, tl.trans(W), PREC), 0.0),
                            BTR, LOG_BTR, PREC)
    tl.store(tile_ptrs(x_ptr, wrows, H * BTR, h * BTR, cbr), X, mask=wmask[:, None])
    A = X * b[None, :]
    tl.store(tile_ptrs(u_ptr, wrows, H * D, h * D, cols), mm(A, W, PREC), mask=wsmask)  # U
    K = load_input(k_ptr, rows, rmask, H * D, h * D, cols, cmask).to(tl.float32)
    later = reflection_tokens(R, BTR)[:, None] > cbt[None, :]
    M = mm(A, tl.where(later, mm(W, tl.trans(K), PREC), 0.0), PREC)
    tl.store(tile_ptrs(m_ptr, wrows, H * BT, h * BT, cbt), M, mask=wmask[:, None])
    Kt = K - mm(tl.trans(M), W, PREC)
    tl.store(tile_ptrs(kt_ptr, rows, H * D, h * D, cols), Kt, mask=rmask[:, None] & cmask[None, :])
    # v as the scans read it (finite)
    vcols = tl.arange(0, BDV)
    vmask = rmask[:, None] & (vcols < DV)[None, :]
    V = load_input(v_ptr, rows, rmask, H * DV, h * DV, vcols, vcols < DV)
    tl.store(tile_ptrs(vc_ptr, rows, H * DV, h * DV, vcols), V, mask=vmask)


def ut_fwd(k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
           table: torch.Tensor, BT: int, BD: int, BDV: int, prec: str, tdt: torch.dtype,
           launch: dict | None = None):
    """k [N, H, D], v [N, H, Dv], w [N * R, H, D], beta [N * R, H] (R reflections per
    token, see `_common`) -> U [N * R, H, D] in `tdt` (the transitions' operand dtype),
    K~ [N, H, D] in k's dtype, M [N * R, H, BT] and the inverse X [N * R, H, BTR]
    (float32; the backward reuses it), and the copies of w in `tdt` and of v that the scans
    read (non-finite entries as 0). launch: num_warps / num_stages (`config.LaunchConfig`).
    """
    N, H, D = k.shape
    R = w.shape[0] // max(N, 1)
    BTR = reflection_tile(BT, R)
    u = torch.empty(N * R, H, D, dtype=tdt, device=k.device)
    kt = torch.empty(N, H, D, dtype=k.dtype, device=k.device)
    m = torch.empty(N * R, H, BT, dtype=torch.float32, device=k.device)
    x = torch.empty(N * R, H, BTR, dtype=torch.float32, device=k.device)
    wt = torch.empty(N * R, H, D, dtype=tdt, device=k.device)
    vc = torch.empty_like(v)
    launch_kernel(_ut_fwd_kernel, (table.shape[0], H))(
        k, v, w, beta, u, kt, m, x, wt, vc, table, H, D, v.shape[-1], BT=BT, BD=BD, BDV=BDV,
        PREC=prec, R=R, BTR=BTR, LOG_BTR=BTR.bit_length() - 1, **(launch or {}))
    return u, kt, m, x, wt, vc


@device_fn
def _inverse(x_ptr, wrows, wmask, h, H, BTR: tl.constexpr):
    """The forward's inverse X [BTR, BTR] of one block and key head (`ut_fwd`)."""
    cbr = tl.arange(0, BTR)
    return load_tile(x_ptr, wrows, wmask, H * BTR, h * BTR, cbr, cbr < BTR)


@device_fn
def _kt_m_grads(W, dmq_ptr, dkt_ptr, rows, rmask, wrows, wmask, h, H, D, cols, cmask,
                BT: tl.constexpr, PREC: tl.constexpr):
    """dK~ [BT, BD] of one block and key head, and dM [BTR, BT]: the query side's
    (`_ut_bwd_q_kernel`) plus K~ = K - M^T W's term -W dK~^T."""
    cbt = tl.arange(0, BT)
    dKt = load_tile(dkt_ptr, rows, rmask, H * D, h * D, cols, cmask)
    dM = (load_tile(dmq_ptr, wrows, wmask, H * BT, h * BT, cbt, cbt < BT)
          - mm(W, tl.trans(dKt), PREC))
    return dKt, dM


@device_fn
def _block_transform(W, K, b, X, BT: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                     PREC: tl.constexpr):
    """E, N (`_block_products`), A = X diag(beta), U = A W and M = A N of one block from
    the forward's inverse X."""
    E, N = _block_products(W, K, BT, R, BTR, PREC)
    A = X * b[None, :]
    return E, N, A, mm(A, W, PREC), mm(A, N, PREC)


@device_fn
def _share(ptrs, x, mask, G: tl.constexpr, ADD: tl.constexpr):
    """A query head's share x of a key head's gradient: added atomically when G > 1 query
    heads share it; with G = 1 stored, or with ADD added to what the buffer holds."""
    if G > 1:
        tl.atomic_add(ptrs, x, mask=mask, sem="relaxed")
    elif ADD:
        tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + x, mask=mask)
    else:
        tl.store(ptrs, x, mask=mask)


@triton.jit
def _ut_bwd_q_kernel(q_ptr, k_ptr, w_ptr, beta_ptr, x_ptr, dqt_ptr, dsd_ptr, dkq_ptr,
                     dmq_ptr, du_ptr, dwp_ptr, dq_ptr, table_ptr, scale, HQ, H, D,
                     G: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
                     R: tl.constexpr, BTR: tl.constexpr):
    hq = tl.program_id(1)
    h = hq // G
    rows, rmask, wrows, wmask, live = _block_rows(table_ptr, BT, R, BTR)
    if not live:
        return
    cols = tl.arange(0, BD)
    cmask = cols < D
    cbt = tl.arange(0, BT)
    incl = cbt[:, None] >= reflection_tokens(R, BTR)[None, :]  # [BT, BTR]
    W, K, b = _block_inputs(w_ptr, k_ptr, beta_ptr, rows, rmask, wrows, wmask, h, H, D,
                            cols, cmask)
    _, _, _, U, M = _block_transform(W, K, b, _inverse(x_ptr, wrows, wmask, h, H, BTR), BT,
                                     R, BTR, PREC)
    Q = load_input(q_ptr, rows, rmask, HQ * D, hq * D, cols, cmask).to(tl.float32) * scale
    dQt = load_tile(dqt_ptr, rows, rmask, HQ * D, hq * D, cols, cmask)
    dS = load_tile(dsd_ptr, rows, rmask, HQ * BT, hq * BT, cbt, cbt < BT)
    QW = tl.where(incl, mm(Q, tl.trans(W), PREC), 0.0)  # [BT, BTR]
    dQW = tl.where(incl, -mm(dQt, tl.trans(U), PREC) - mm(dS, tl.trans(M), PREC), 0.0)
    dQ = dQt + mm(dS, K, PREC) + mm(dQW, W, PREC)  # Q~ = Q - QW U;  S = Q K^T - QW M
    tl.store(tile_ptrs(dq_ptr, rows, HQ * D, hq * D, cols), dQ * scale,
             mask=rmask[:, None] & cmask[None, :])
    # the key head's share, summed over its G query heads (relaxed: only atomicity needed);
    # with G = 1 the program owns those rows: dkq and dmq are written, du and dwp added to
    kmask = rmask[:, None] & cmask[None, :]
    wsmask = wmask[:, None] & cmask[None, :]
    _share(tile_ptrs(dkq_ptr, rows, H * D, h * D, cols), mm(tl.trans(dS), Q, PREC), kmask,
           G, False)
    _share(tile_ptrs(du_ptr, wrows, H * D, h * D, cols), -mm(tl.trans(QW), dQt, PREC),
           wsmask, G, True)
    _share(tile_ptrs(dmq_ptr, wrows, H * BT, h * BT, cbt), -mm(tl.trans(QW), dS, PREC),
           wmask[:, None], G, False)
    _share(tile_ptrs(dwp_ptr, wrows, H * D, h * D, cols), mm(tl.trans(dQW), Q, PREC), wsmask,
           G, True)



@triton.jit
def _ut_bwd_dk_kernel(w_ptr, beta_ptr, x_ptr, dkq_ptr, dmq_ptr, dkt_ptr, dk_ptr, table_ptr, H,
                      D, BT: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
                      R: tl.constexpr, BTR: tl.constexpr):
    h = tl.program_id(1)
    rows, rmask, wrows, wmask, live = _block_rows(table_ptr, BT, R, BTR)
    if not live:
        return
    cols = tl.arange(0, BD)
    cmask = cols < D
    cbt = tl.arange(0, BT)
    W, b = _reflection_inputs(w_ptr, beta_ptr, wrows, wmask, h, H, D, cols, cmask)
    A = _inverse(x_ptr, wrows, wmask, h, H, BTR) * b[None, :]
    # K~ = K - M^T W and M = A later(W K^T): dK = dK~ + later(A^T dM)^T W, with the query
    # side's dK added
    dKt, dM = _kt_m_grads(W, dmq_ptr, dkt_ptr, rows, rmask, wrows, wmask, h, H, D, cols,
                          cmask, BT, PREC)
    dN = tl.where(reflection_tokens(R, BTR)[:, None] > cbt[None, :],
                  mm(tl.trans(A), dM, PREC), 0.0)
    dK = dKt + load_tile(dkq_ptr, rows, rmask, H * D, h * D, cols, cmask)
    dK += mm(tl.trans(dN), W, PREC)
    tl.store(tile_ptrs(dk_ptr, rows, H * D, h * D, cols), dK,
             mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _ut_bwd_kernel(k_ptr, w_ptr, beta_ptr, x_ptr, dmq_ptr, dkt_ptr, du_ptr, dwp_ptr, da_ptr,
                   table_ptr, H, D, BT: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
                   R: tl.constexpr, BTR: tl.constexpr):
    h = tl.program_id(1)
    rows, rmask, wrows, wmask, live = _block_rows(table_ptr, BT, R, BTR)
    if not live:
        return
    cols = tl.arange(0, BD)
    cmask = cols < D
    cbt = tl.arange(0, BT)
    cbr = tl.arange(0, BTR)
    later = reflection_tokens(R, BTR)[:, None] > cbt[None, :]  # [BTR, BT]
    W, K, b = _block_inputs(w_ptr, k_ptr, beta_ptr, rows, rmask, wrows, wmask, h, H, D,
                            cols, cmask)
    # A = X diag(beta), N = later(W K^T), M = A N (the forward's X)
    A = _inverse(x_ptr, wrows, wmask, h, H, BTR) * b[None, :]
    N = tl.where(later, mm(W, tl.trans(K), PREC), 0.0)
    M = mm(A, N, PREC)
    # gradients reaching M and W from K~ = K - M^T W and from the query side
    # (`_ut_bwd_q_kernel`: dM in its own buffer, its dW added to dwp)
    dKt, dM = _kt_m_grads(W, dmq_ptr, dkt_ptr, rows, rmask, wrows, wmask, h, H, D, cols,
                          cmask, BT, PREC)
    dW = load_tile(dwp_ptr, wrows, wmask, H * D, h * D, cols, cmask) - mm(M, dKt, PREC)
    # M = A N: dN = later(A^T dM) reaches W (and K: `_ut_bwd_dk_kernel`)
    dN = tl.where(later, mm(tl.trans(A), dM, PREC), 0.0)
    dW += mm(dN, K, PREC)
    # dA from M = A N and U = A W (dU from the scans and the query side)
    dA = mm(dM, tl.trans(N), PREC)
    dU = load_tile(du_ptr, wrows, wmask, H * D, h * D, cols, cmask)
    dA += mm(dU, tl.trans(W), PREC)
    dW += mm(tl.trans(A), dU, PREC)
    wsmask = wmask[:, None] & cmask[None, :]
    tl.store(tile_ptrs(dwp_ptr, wrows, H * D, h * D, cols), dW, mask=wsmask)
    tl.store(tile_ptrs(da_ptr, wrows, H * BTR, h * BTR, cbr), dA, mask=wmask[:, None])


@triton.jit
def _ut_bwd_inv_kernel(w_ptr, beta_ptr, x_ptr, da_ptr, dwp_ptr, dw_ptr, dbeta_ptr,
                       table_ptr, H, D, BT: tl.constexpr, BD: tl.constexpr,
                       PREC: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr):
    h = tl.program_id(1)
    _, _, wrows, wmask, live = _block_rows(table_ptr, BT, R, BTR)
    if not live:
        return
    cols = tl.arange(0, BD)
    cmask = cols < D
    cbr = tl.arange(0, BTR)
    W, b = _reflection_inputs(w_ptr, beta_ptr, wrows, wmask, h, H, D, cols, cmask)
    # A = X diag(beta)
    X = _inverse(x_ptr, wrows, wmask, h, H, BTR)
    dA = load_tile(da_ptr, wrows, wmask, H * BTR, h * BTR, cbr, cbr < BTR)
    db = tl.sum(dA * X, axis=0)
    # X = (I + L)^{-1}: dL = strictLower(-X^T dX X^T), dX = dA diag(beta);
    # L = strictLower(diag(beta) W W^T)
    dL = tl.where(cbr[:, None] > cbr[None, :],
                  -mm(mm(tl.trans(X), dA * b[None, :], PREC), tl.trans(X), PREC), 0.0)
    db += tl.sum(dL * mm(W, tl.trans(W), PREC), axis=1)
    dE = b[:, None] * dL
    dW = load_tile(dwp_ptr, wrows, wmask, H * D, h * D, cols, cmask)
    dW += mm(dE + tl.trans(dE), W, PREC)
    tl.store(tile_ptrs(dw_ptr, wrows, H * D, h * D, cols), dW,
             mask=wmask[:, None] & cmask[None, :])
    tl.store(dbeta_ptr + row_offsets(wrows, H, h), db, mask=wmask)


def ut_bwd(q, k, w, beta, x, dqt, dsd, dkt, du, dwp, table, scale: float, BT: int, BD: int,
           prec: str, launch: dict | None = None, q_launch: dict | None = None,
           inv_launch: dict | None = None, dk_launch: dict | None = None):
    """Gradients of the UT inputs. q [N, HQ, D], k [N, H, D], w [N * R, H, D], beta
    [N * R, H] (inputs, R reflections per token), x the forward's inverses (`ut_fwd`);
    dqt [N, HQ, D] and dsd [N, HQ, BT] the gradients of Q~ and S per query head; dkt
    [N, H, D] that of K~, du and dwp [N * R, H, D] those of U and the direct W term of the
    transitions (float32; du and dwp receive the query side's terms in place).

    Four kernels: the query side per query head (dq, and its share of the key head's
    gradients), then the key side per key head: dk, then dw's terms through K~, U, M
    (and dA), then those through the inverse. Returns dq, dk, dw, dbeta in the dtypes of
    q, k, w, beta. launch / q_launch / inv_launch / dk_launch: the launch options of the
    key side's dw kernel, of the query side's, of the inverse's and of dk's.
    """
    N, HQ, D = q.shape
    H = k.shape[1]
    R = w.shape[0] // max(N, 1)
    BTR = reflection_tile(BT, R)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dw = torch.empty_like(w)
    dbeta = torch.empty_like(beta)
    # the query side's shares: written whole by it without GQA, summed atomically with it
    make = torch.empty if HQ == H else torch.zeros
    dkq = make(N, H, D, dtype=torch.float32, device=q.device)
    dmq = make(N * R, H, BT, dtype=torch.float32, device=q.device)
    launch_kernel(_ut_bwd_q_kernel, (table.shape[0], HQ))(
        q, k, w, beta, x, dqt, dsd, dkq, dmq, du, dwp, dq, table, scale, HQ, H, D,
        G=HQ // H, BT=BT, BD=BD, PREC=prec, R=R, BTR=BTR, **(q_launch or {}))
    launch_kernel(_ut_bwd_dk_kernel, (table.shape[0], H))(
        w, beta, x, dkq, dmq, dkt, dk, table, H, D, BT=BT, BD=BD, PREC=prec, R=R, BTR=BTR,
        **(dk_launch or {}))
    da = torch.empty(N * R, H, BTR, dtype=torch.float32, device=q.device)
    launch_kernel(_ut_bwd_kernel, (table.shape[0], H))(
        k, w, beta, x, dmq, dkt, du, dwp, da, table, H, D, BT=BT, BD=BD, PREC=prec, R=R,
        BTR=BTR, **(launch or {}))
    launch_kernel(_ut_bwd_inv_kernel, (table.shape[0], H))(
        w, beta, x, da, dwp, dw, dbeta, table, H, D, BT=BT, BD=BD, PREC=prec, R=R, BTR=BTR,
        **(inv_launch or {}))
    return dq, dk, dw, dbeta
