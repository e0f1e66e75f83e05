"""Transitions across runs of whole segments, for the backward's key-parallel kernel.

With the whole-segment transitions M_s of `segments.py` (row form: the state entering
segment s from the right leaves it as y^(s-1) = y^(s) M_s), a query block of segment p
whose state entering segment p - 1 is ys meets segment s < p as

    y^(s) = ys Pi_{p-1,s},    Pi_{q,s} = M_q M_{q-1} ... M_{s+1}    (Pi_{s,s} = I)

so the query kernel forms y^(s) with one product, and the key-parallel kernel moves a key
block of segment s forward instead: S = ys (Ks Pi_{q,s}^T)^T, and the gradient of the
moved keys returns as dKs += dK' Pi_{q,s}. Pi_{q,s} is stored for 0 <= s < q <= n_seg - 2
(M_q exists for the crossed segments 1 .. n_seg - 2), at row `pair_base + q (q - 1) / 2 + s`
of a [n_pairs, H, BD, BD] table in the transitions' operand dtype: O(T D^2 / BT) memory,
as E. `_pi_kernel` fills it, one program per crossed segment q walking s downwards,
Pi_{q,s} = Pi_{q,s+1} M_{s+1} (rows evolve independently, so each program takes
min(BD, BT) rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import device_fn, e_offsets, load_raw, mm_lp
from .segments import times_e, times_e_sliced

__all__ = ["segment_pairs", "segment_products", "pair_index", "times_et", "times_et_sliced"]


def segment_pairs(table: torch.Tensor, seg: int, BT: int, n_max: int
                  ) -> tuple[torch.Tensor, int]:
    """Row of each block's sequence's first Pi_{q,s} in the table of `segment_products`:
    int32 [NB] (built on the device, no host read), and the number of rows to allocate, an
    upper bound that needs no host read either: with n_i the blocks of sequence i, its
    (n_seg - 1)(n_seg - 2) / 2 < (n_i / seg)^2 / 2 rows sum to at most
    (n_max / seg) (NB / seg) / 2 (n_max bounds every n_i, NB the table's rows their sum)."""
    t0, s0, s1 = table.long().unbind(1)
    n_seg = ((s1 - s0 + BT - 1) // BT + seg - 1) // seg  # 0 on the table's empty rows
    pairs = (n_seg - 1).clamp(min=0) * (n_seg - 2).clamp(min=0) // 2
    first = (t0 == s0) & (t0 < s1)
    through = torch.where(first, pairs, 0).cumsum(0)
    base = through - torch.where(first, pairs, 0)
    # a sequence's later blocks take the base of its first block (rows are consecutive)
    first_row = torch.where(first, torch.arange(table.shape[0], device=table.device), 0)
    first_row = first_row.cummax(0).values
    bound = (n_max // seg + 1) * (table.shape[0] // seg + 1) // 2 + 1
    return base[first_row].to(torch.int32), bound


@device_fn
def pair_index(base, q, s):
    """Row of Pi_{q,s} (0 <= s < q) in the table, base the sequence's `segment_pairs`."""
    return base + q * (q - 1) // 2 + s


@triton.jit
def _pi_kernel(ms_ptr, pi_ptr, slot_ptr, pbase_ptr, table_ptr, H, SEG, BT: tl.constexpr,
               BD: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
               TDT: tl.constexpr, EMULATE: tl.constexpr):
    blk = tl.program_id(0)  # the first block of a crossed segment q, else nothing to do
    h = tl.program_id(1)
    r0 = tl.program_id(2) * BR
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:
        return
    c = (t0 - s0) // BT
    q = c // SEG
    n_seg = ((s1 - s0 + BT - 1) // BT + SEG - 1) // SEG
    if (c % SEG != 0) | (q == 0) | (q > n_seg - 2):
        return
    cols = tl.arange(0, BD)
    rr = r0 + tl.arange(0, BR)
    slot0 = tl.load(slot_ptr + blk) - q  # slot of the sequence's segment 0
    base = tl.load(pbase_ptr + blk)
    P = tl.load(ms_ptr + e_offsets(slot0 + q, h, H, rr, cols, BD)).to(tl.float32)
    prev = pair_index(base, q, q - 1)
    tl.store(pi_ptr + e_offsets(prev, h, H, rr, cols, BD), P)
    for i in range(0, q - 1):  # s = q - 2, ..., 0
        s = q - 2 - i
        if BK == BD:
            P = times_e(P, ms_ptr, slot0 + s + 1, h, H, cols, BD, PREC, TDT, EMULATE)
        else:  # BK columns of the P just stored at a time, read back from the table
            tl.debug_barrier()  # every thread's rows of P are stored
            P = times_e_sliced(pi_ptr, rr, rr < BD, BD, (prev * H + h).to(tl.int64) * BD * BD,
                               BD, ms_ptr, slot0 + s + 1, h, H, BR, BD, BK, PREC, TDT, EMULATE)
        prev = pair_index(base, q, s)
        tl.store(pi_ptr + e_offsets(prev, h, H, rr, cols, BD), P)


def segment_products(ms, table, slots, pbase, n_pairs: int, seg: int, BT: int, BD: int,
                     BK: int, prec: str, tdt, emulate: bool, launch: dict | None = None):
    """The table Pi [n_pairs, H, BD, BD] (ms's dtype) of the module docstring from the
    whole-segment transitions ms [n_slots, H, BD, BD] (`segments.segment_keys`), their
    slots and the pair bases of `segment_pairs`. BK: rows of M read at a time."""
    H = ms.shape[1]
    BR = min(BD, BT)
    pi = torch.empty(max(n_pairs, 1), H, BD, BD, dtype=ms.dtype, device=ms.device)
    launch_kernel(_pi_kernel, (table.shape[0], H, BD // BR))(
        ms, pi, slots, pbase, table, H, seg, BT=BT, BD=BD, BR=BR, BK=BK, PREC=prec, TDT=tdt,
        EMULATE=emulate, **(launch or {}))
    return pi


@device_fn
def times_et(y, e_ptr, row, h, H, cols, BD: tl.constexpr, DT: tl.constexpr,
             PREC: tl.constexpr, EMULATE: tl.constexpr):
    """y E^T for E of row `row`, head h of a [*, H, BD, BD] table, E read whole (past
    BD = 64, `times_et_sliced`). Operands in DT, float32 accumulation."""
    E = tl.load(e_ptr + e_offsets(row, h, H, cols, cols, BD))
    return mm_lp(y, tl.trans(E), DT, PREC, EMULATE)


@device_fn
def times_et_sliced(y_ptr, rows, rmask, stride, col0, D, e_ptr, row, h, H, BR: tl.constexpr,
                    BD: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr,
                    PREC: tl.constexpr, EMULATE: tl.constexpr):
    """y E^T as `times_et` for y [BR, BD] held in memory (y_ptr's rows `rows`, columns
    col0 + 0 .. D - 1, zero past rmask), read BK columns at a time: y E^T = sum_k y[:, k]
    E[:, k]^T, with no selection products."""
    ck = tl.arange(0, BK)
    cols = tl.arange(0, BD)
    out = tl.zeros([BR, BD], dtype=tl.float32)
    for k0 in range(0, BD, BK):
        yk = load_raw(y_ptr, rows, rmask, stride, col0 + k0, ck, k0 + ck < D)  # [BR, BK]
        Ek = tl.load(e_ptr + e_offsets(row, h, H, cols, k0 + ck, BD))  # E[:, k0 + ck]
        out += mm_lp(yk, tl.trans(Ek), DT, PREC, EMULATE)
    return out
