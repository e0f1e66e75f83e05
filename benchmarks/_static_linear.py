"""The kernels around the attention scans, ours and fla's, for `static_vs_fla.py`.

Ours (`pathattn.ops.path.triton`): the UT transform (`ut_fwd`) and the segment keys
(`seg`) in the forward; the backward recomputes the segment keys, forms the products
across segments (`pi`), returns the segment gradients (`seg_bwd`) and runs the UT
transform's backward (`ut_bwd_q`, `ut_bwd_dk`, `ut_bwd`, `ut_bwd_inv`). Programs that
return at once (the blocks of `pi` and `seg_bwd` that do not start a segment, or that
start one with no work) are left out: each issues a few dozen instructions. fla (fla-core
0.6.0, `_fla_capture`): every kernel its forward and backward launch besides the four
scans, with the grids its launchers give them; the loop bounds below are its kernels' own.
All are O(T) but fla's query transform (`transform_q_fwd_kernel`), whose programs walk
back to the first 512-token chunk. Not counted on either side: work done by PyTorch
operations (ours: the float64 gate sums, the delta rowsum; fla: dtype conversions, the GQA
sums).
"""

from __future__ import annotations

import itertools

from _static_common import Kernel, Loop, line

from pathattn.ops.path.triton import crossings, segments, ut  # noqa: F401
from pathattn.ops.path.triton.tables import default_seg

__all__ = ["ours", "fla", "FLA_LINEAR"]


def _blocks(T: int, s: dict) -> tuple[int, int, int]:
    """(blocks, blocks per segment, segments) of one dense sequence of T tokens."""
    n = T // s["BT"]
    seg = default_seg(n, s["MULT"])
    return n, seg, -(-n // seg)


def _seg_programs(T: int, s: dict) -> list:
    """`seg`, per group of rows of E: walking (`config.SEG_WALK`), the first block of each
    segment, the segment's blocks; else every block, the blocks after it in its segment."""
    n, seg, n_seg = _blocks(T, s)
    if s["WALK"]:
        return [min(seg, n - sb * seg) for sb in range(n_seg)] * s["NR"]
    return [min((c // seg + 1) * seg, n) - 1 - c for c in range(n)] * s["NR"]


def _pi_programs(T: int, s: dict) -> list:
    """`pi`: the first block of each segment q in 1 .. n_seg - 2, per group of rows: q."""
    _, _, n_seg = _blocks(T, s)
    return list(range(1, max(n_seg - 1, 1))) * s["NR"]


def _seg_bwd_programs(T: int, s: dict) -> list:
    """`seg_bwd`: the first block of each segment, per group of rows: the segment's
    blocks."""
    n, seg, n_seg = _blocks(T, s)
    return [min(seg, n - sb * seg) for sb in range(n_seg)] * s["NRB"]


def _per_block(T: int, s: dict) -> list:
    return [None] * (T // s["BT"])


def ours(D: int, shape: dict) -> list[Kernel]:
    """Our kernels around the scans at head dim D (`shape`: `static_vs_fla._ours_shape`, with NR and
    NRB the groups of rows of E per block of `seg` / `pi` and of `seg_bwd`)."""
    # the walk: a segment's first block steps through its later blocks (p - 1 steps); the
    # per-block form: block c through the p later blocks of its segment
    seg_loop = (Loop(line(segments._seg_kernel, "# blocks e - 1, ..., c"), lambda p, s: p - 1)
                if shape["WALK"] else
                Loop(line(segments._seg_kernel, "# blocks e, e-1, ..., c+1"), lambda p, s: p))
    pi_loops = [Loop(line(crossings._pi_kernel, "for i in range(0, q - 1)"),
                     lambda p, s: p - 1)]
    if shape["NS"] > 1:  # past D = 64 the products are read a slice at a time
        pi_loops.append(Loop(line(segments.times_e_sliced, "for k0 in range"),
                             lambda p, s: (p - 1) * s["NS"]))
    seg_bwd_loop = Loop(line(segments._seg_bwd_kernel, "for i in range(0, e - f + 1)"),
                        lambda p, s: p)
    plain = [Kernel("ours", "bwd", k, _per_block, (), scan=False)
             for k in ("ut_bwd_q", "ut_bwd_dk", "ut_bwd", "ut_bwd_inv")]
    return [Kernel("ours", "fwd", "ut_fwd", _per_block, (), scan=False),
            Kernel("ours", "fwd", "seg", _seg_programs, (seg_loop,), scan=False),
            Kernel("ours", "bwd", "seg", _seg_programs, (seg_loop,), scan=False),
            Kernel("ours", "bwd", "pi", _pi_programs, tuple(pi_loops), scan=False),
            Kernel("ours", "bwd", "seg_bwd", _seg_bwd_programs, (seg_bwd_loop,), scan=False),
            *plain]


# fla's kernels around the scans: kernel name -> (programs, loops as (source text, trips per
# program)). A program is its grid index (i0, i1, ...); meta holds the launch's arguments
# and its autotune configuration. fla on an H100: 64-token chunks, 128-query blocks in
# transform_q, 512-token splits.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


FLA_LINEAR = {
    "chunk_global_cumsum_scalar_kernel": [
        ("for i_c in range(NT)", lambda p, T, m: _cdiv(T, m["BT"]))],
    "chunk_scaled_dot_kkt_fwd_kernel": [
        ("for i_k in range(tl.cdiv(K, BK))", lambda p, T, m: _cdiv(m["K"], m["BK"]))],
    "merge_16x16_to_64x64_inverse_kernel": [
        (f"for i in range({lo} + 2, min({hi}, T - i_t * BT))" if lo else
         "for i in range(2, min(16, T - i_t * BT))",
         lambda p, T, m, lo=lo, hi=hi: max(0, min(hi, T - p[0] * m["BT"]) - lo - 2))
        for lo, hi in ((0, 16), (16, 32), (32, 48), (48, 64))],
    "chunk_cumprod_householder_fwd_kernel": [
        ("for i_t_small in range(NT_small-1, -1, -1)",
         lambda p, T, m: _cdiv(min(m["S"], T - p[0] * m["S"]), m["BT"]))],
    "chunk_cumprod_householder_bwd_kernel": [
        ("for i_t_small in range(0, NT_small)",
         lambda p, T, m: _cdiv(min(m["S"], T - p[0] * m["S"]), m["BT"]))],
    "transform_q_fwd_kernel": [
        ("for offset in range((i_t + 1) * BT - 2 * BS, S-BS, -BS)",
         lambda p, T, m: len(range((p[0] + 1) * m["BT"] - 2 * m["BS"], m["S"] - m["BS"],
                                   -m["BS"])))],
}
# the scans, counted by `static_vs_fla._fla`
FLA_SCANS = ("parallel_path_fwd_kernel", "parallel_path_bwd_dq_kernel",
             "parallel_path_bwd_dkv_kernel", "parallel_path_bwd_intra_chunk_kernel")


def fla(launches) -> list[Kernel]:
    """fla's kernels around the scans from its recorded launches (`_fla_capture.launches`), one
    `Kernel` per launch (an autotuned kernel once per configuration, `Kernel.config`)."""
    out = []
    for i, la in enumerate(launches):
        if la.name in FLA_SCANS:
            continue
        meta = {**la.args, **dict(la.config)}
        loops = tuple(Loop(line(la.fn, text), lambda p, s, f=f, meta=meta: f(p, s["T"], meta))
                      for text, f in FLA_LINEAR.get(la.name, ()))
        grid = la.grid

        def progs(T, s, grid=grid):
            return list(itertools.product(*(range(g) for g in grid)))
        out.append(Kernel("fla", la.part, la.name, progs, loops, scan=False, launch=i,
                          config=la.config))
    return out
