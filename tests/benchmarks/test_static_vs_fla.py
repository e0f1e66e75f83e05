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


@pytest.mark.parametrize("D, T", [(64, 2048), (128, 2048), (128, 16384)])
def test_ours_linear_loops_cover_the_blocks(D, T):
    """The kernels around the scans: `seg` (walking) steps once through every block but a
    segment's last (whose keys it forms before its loop) and `seg_bwd` through every block,
    per group of rows of E; `pi` forms each segment q's products with the q - 1 segments
    before it but one."""
    import _static_linear as sl

    shape = {**sv._ours_shape(D), "T": T}
    n = T // shape["BT"]
    seg = sv.default_seg(n, shape["MULT"])
    n_seg = -(-n // seg)
    kernels = {(k.part, k.name): k for k in sl.ours(D, shape)}
    assert shape["WALK"]  # sm_90, bf16, D 64 and 128 (`config.SEG_WALK`)
    assert _trips(kernels["fwd", "seg"], T, shape) == [(n - n_seg) * shape["NR"]]
    assert _trips(kernels["bwd", "seg"], T, shape) == [(n - n_seg) * shape["NR"]]
    # per block: the blocks after it in its segment
    blocks = {**shape, "WALK": False}
    per_block = sl.ours(D, blocks)[1]
    assert _trips(per_block, T, blocks) == [
        sum(min((c // seg + 1) * seg, n) - 1 - c for c in range(n)) * shape["NR"]]
    assert per_block.loops[0].loc != kernels["fwd", "seg"].loops[0].loc
    assert _trips(kernels["bwd", "seg_bwd"], T, shape) == [n * shape["NRB"]]
    pi = _trips(kernels["bwd", "pi"], T, shape)
    products = sum(q - 1 for q in range(1, n_seg - 1)) * shape["NR"]
    assert pi == ([products, products * shape["NS"]] if shape["NS"] > 1 else [products])
    for name in ("ut_fwd", "ut_bwd_q", "ut_bwd"):
        k = next(x for x in kernels.values() if x.name == name)
        assert len(k.programs(T, shape)) == n and k.loops == ()


def _report(loops: tuple, sass: tuple) -> ik.KernelReport:
    return ik.KernelReport("probe", 90, 4, 0, 32, 0, 1, "regs", {}, {}, 0, 0, 0, "", loops,
                           sass_mma_total=0, sass_loops=sass, sass_instructions=100,
                           sass_fma=0)


def test_linear_kernels_match_loops_by_line():
    """An O(T) kernel's loops are found by source line: one ptxas unrolled counts in the
    straight code, a second SASS loop of one PTX loop (a split) counts no iterations, and a
    loop not described is refused."""
    outer, inner = ik.LoopInfo("k.py:5", 1, False, 0, 0), ik.LoopInfo("k.py:6", 2, True, 0, 0)
    kernel = sv.Kernel("fla", "fwd", "probe", lambda T, s: [0, 1],
                       (sv.Loop("k.py:5", lambda p, s: 3), sv.Loop("k.py:6", lambda p, s: 2)),
                       scan=False)
    # the inner loop unrolled: one SASS loop, the outer one's
    c = sv.count(kernel, _report((outer, inner), (ik.SassLoop(1, 10, 0, 0),)), 64, {})
    assert c["trips"] == [6] and c["instructions"] == 4 * (2 * 90 + 6 * 10)
    # the outer loop split in two: the second SASS loop counts nothing
    split = (ik.SassLoop(1, 10, 0, 0), ik.SassLoop(1, 7, 0, 0))
    c = sv.count(kernel, _report((outer,), split), 64, {})
    assert c["trips"] == [6, 0] and c["instructions"] == 4 * (2 * 83 + 6 * 10)
    with pytest.raises(RuntimeError, match=r"loops at \['k.py:9'\] not described"):
        sv.count(kernel, _report((ik.LoopInfo("k.py:9", 1, True, 0, 0),),
                                 (ik.SassLoop(1, 10, 0, 0),)), 64, {})


def test_fewest_keeps_one_configuration_per_autotuned_run():
    def k(name, config):
        return sv.Kernel("fla", "fwd", name, None, (), scan=False, config=config)

    rows = [(k("a", (("BT", 32),)), None, {"instructions": 5}),
            (k("a", (("BT", 64),)), None, {"instructions": 3}),
            (k("b", ()), None, {"instructions": 9}),
            (k("a", (("BT", 32),)), None, {"instructions": 1}),
            (k("a", (("BT", 64),)), None, {"instructions": 2})]
    kept = sv._fewest(rows)
    assert [(x[0].name, x[2]["instructions"]) for x in kept] == [("a", 3), ("b", 9), ("a", 1)]


_CAPTURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import _fla_capture as fc
launches = fc.launches(64, True, 1024)
fwd = next(x for x in launches if x.name == "parallel_path_fwd_kernel")
sig, const, _ = fc.compile_args(fwd)
print(json.dumps({"names": sorted({x.part + " " + x.name for x in launches}),
                  "grid": fwd.grid, "warps": fwd.num_warps, "k": sig["k"], "BT": const["BT"]}))
"""


def test_fla_capture_records_every_launch():
    """fla's forward and backward recorded on CPU (skipped without fla; in a child process,
    as the recorder patches Triton's compiled launches, which the interpreter replaces):
    the four scans and the O(T) kernels around them."""
    import json
    import subprocess

    pytest.importorskip("fla.ops.path_attn")
    env = dict(os.environ, TRITON_INTERPRET="0")
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    out = subprocess.run([sys.executable, "-c", _CAPTURE, bench], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert {"fwd parallel_path_fwd_kernel", "bwd parallel_path_bwd_dq_kernel",
            "bwd transform_q_fwd_kernel", "fwd chunk_global_cumsum_scalar_kernel",
            "bwd chunk_global_cumsum_scalar_kernel"} <= set(got["names"])
    assert got["grid"] == [1024 // 128, 1] and got["warps"] == 4
    assert got["k"] == "*bf16" and got["BT"] == 128
