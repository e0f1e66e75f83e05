"""`benchmarks/static_vs_fla.py`'s trip counts, without compiling: each loop's iterations
summed over a head's programs must tile the block pairs it claims, counted by brute force,
and a kernel whose loops differ from those described is refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
_INTERPRET = os.environ.get("TRITON_INTERPRET")
import static_vs_fla as sv  # noqa: E402

from pathattn.ops.path.triton import inspect_kernels as ik  # noqa: E402


def test_import_leaves_the_interpreter_setting_alone():
    """Imported (here), the script must not switch the interpreter off for the tests that
    share this process."""
    assert os.environ.get("TRITON_INTERPRET") == _INTERPRET


def _trips(kernel: sv.Kernel, T: int, shape: dict) -> list[int]:
    progs = kernel.programs(T, shape)
    return [sum(lp.trips(p, shape) for p in progs) for lp in kernel.loops]


@pytest.mark.parametrize("D, T", [(64, 2048), (64, 8192), (128, 2048), (128, 16384)])
def test_ours_loops_tile_the_block_pairs(D, T):
    shape = sv._ours_shape(D)
    BT, n = shape["BT"], T // shape["BT"]
    seg = sv.default_seg(n, shape["MULT"])
    earlier = sum(c // seg < a // seg for a in range(n) for c in range(a))
    own = sum(c // seg == a // seg for a in range(n) for c in range(a))
    fwd, bwd, kv = sv._ours(D)
    f, b, k = _trips(fwd, T, shape), _trips(bwd, T, shape), _trips(kv, T, shape)
    # the walks over earlier segments, KSTEP blocks a step and the rest one at a time
    fs, bs = shape["FSTEP"], shape["BSTEP"]
    walked = [f[2] * fs + (f[3] if fs > 1 else 0), b[-4] * bs + b[-3] if bs > 1 else b[-3]]
    assert walked == [earlier, earlier]
    assert f[0] == own
    assert f[1] == sum(a // seg for a in range(n))  # earlier segments walked
    assert b[0] == own and b[-2] == own
    # the own segment recomputes x^(c) from the query block: a - 1 - c transitions per pair
    assert b[-1] == sum(a - 1 - c for a in range(n) for c in range(a) if c // seg == a // seg)
    # the key kernel's tiles cover the pairs of the query kernel's walk: BKT keys times BQ
    # queries a step, the segments' lengths rounded up to whole tiles
    seg_len = [min(seg, n - i * seg) * BT for i in range(-(-n // seg))]
    tiled = sum(-(-seg_len[s] // shape["BKT"]) * shape["BKT"]
                * -(-seg_len[p] // shape["BQ"]) * shape["BQ"]
                for p in range(len(seg_len)) for s in range(p))
    steps = k[-2 if D > 64 else -1]
    assert steps * shape["BKT"] * shape["BQ"] == tiled >= earlier * BT * BT
    if all(x % shape["BKT"] == 0 and x % shape["BQ"] == 0 for x in seg_len):
        assert tiled == earlier * BT * BT


@pytest.mark.parametrize("T", [2048, 8192])
def test_fla_loops_tile_the_block_pairs(T):
    shape = {}
    small = T // sv.FLA_BS
    fwd, dq, dkv, intra = sv._fla(with_locs=False)
    # forward: every 64-key block before the 128-query block's own
    assert _trips(fwd, T, shape) == [sum(2 * i for i in range(T // sv.FLA_BT))]
    # backward: the chunks before the query block's (dq, and the same pairs key-side in
    # dkv) and the pairs inside a chunk (intra) are every pair of 64-token blocks below the
    # diagonal
    outer, inner = _trips(dq, T, shape)
    assert _trips(dkv, T, shape) == [inner]
    pairs, steps = _trips(intra, T, shape)
    per = sv.FLA_S // sv.FLA_BS
    assert pairs == sum(c // per == a // per for a in range(small) for c in range(a))
    assert steps == sum(a - 1 - c for a in range(small) for c in range(a) if c // per == a // per)
    assert inner * sv.FLA_BT * sv.FLA_BS + pairs * sv.FLA_BS ** 2 == (
        small * (small - 1) // 2 * sv.FLA_BS ** 2)
    assert outer == sum(i * sv.FLA_BT // sv.FLA_S for i in range(T // sv.FLA_BT))


def test_loops_must_match_the_description():
    kernel = sv.Kernel("ours", "fwd", "probe", lambda T, s: [0],
                       (sv.Loop("probe.py:7", lambda p, s: 3),))
    loop = ik.LoopInfo("probe.py:7", 1, True, 1, 1)
    r = ik.KernelReport("probe", 90, 4, 0, 32, 0, 1, "regs", {}, {}, 0, 1, 1, "probe.py:7",
                        (loop,), sass_mma_total=2, sass_loops=(ik.SassLoop(1, 10, 1, 1, 64),),
                        sass_instructions=25, sass_fma=128)
    c = sv.count(kernel, r, 64, {})
    # 4 warps x (15 instructions outside the loop + 3 iterations x 10)
    assert (c["instructions"], c["mma"], c["fma"], c["local"]) == (
        4 * 45, 4 * (1 + 3), 4 * (64 + 3 * 64), 4 * 3)
    moved = ik.LoopInfo("probe.py:9", 1, True, 1, 1)
    with pytest.raises(RuntimeError, match="loop at probe.py:9, expected probe.py:7"):
        sv.count(kernel, ik.KernelReport(**{**r.__dict__, "loops": (moved,)}), 64, {})
    with pytest.raises(RuntimeError, match="2 loops in the SASS, 1 described"):
        sv.count(kernel, ik.KernelReport(**{**r.__dict__, "loops": (loop, loop), "sass_loops": (
            r.sass_loops[0], r.sass_loops[0])}), 64, {})
