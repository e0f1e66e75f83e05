"""Issued instructions of the attention kernels, ours and fla's, counted without a GPU.

Both implementations' kernels are compiled ahead of time for sm_90 (H100) with the
launch settings each picks on an H100: ours from `pathattn.ops.path.triton.config`, fla's
as its launchers set them (fla-core 0.6.0: 128-query blocks, 64-key blocks, 512-token
chunks in the backward, 4 warps, 8 at D = 128 for the 128-row kernels). Per loop of each
kernel's SASS, one iteration's own instructions (`inspect_kernels.SassLoop`) are multiplied
by the loop's trip count, summed over the programs of one head of a dense sequence of T
tokens; each program also issues the instructions outside its loops once. The result is
warp-instructions per head: the issue work the SM schedulers must do.

    python benchmarks/static_vs_fla.py                    # D 64, 128; gates on, off; T 2048-16384
    python benchmarks/static_vs_fla.py --heads 64 --gates on --seq-lens 8192 --json out.json

Counted: the attention scans, ours `fwd`, `bwd` and `bwd_kv`, fla's
`parallel_path_fwd_kernel`, `parallel_path_bwd_dq_kernel`, `parallel_path_bwd_dkv_kernel`
and `parallel_path_bwd_intra_chunk_kernel`; and the kernels around them
(`_static_linear.py`: ours the UT transform and its backward and the segment kernels;
fla's every other kernel its forward and backward launch, recorded by `_fla_capture.py`:
the chunk preprocessing, the triangular solve, the Householder products, the query
transform, the gate sums). All of these are O(T) but fla's query transform, whose programs
walk the query's earlier 64-token blocks back to the first 512-token chunk: O(T^2) in all.
fla's autotuned kernels count at the configuration with the fewest instructions. Two ratio
tables: the scans alone, and every Triton kernel (`--scans-only`: the first alone). Not
counted: PyTorch operations on either side. Issue count is a proxy, not a time: a loop
that waits on memory or on a chain of dependent products (the carried query state) runs
slower than its instruction count says. fla must be importable (`PYTHONPATH=<dir with
fla>`); without it only our columns are printed.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor

if __name__ == "__main__":  # the kernels are compiled, not interpreted (imported, as by
    os.environ["TRITON_INTERPRET"] = "0"  # its tests, it leaves the environment alone)

import _fla_capture  # noqa: E402
import _static_linear  # noqa: E402
import torch  # noqa: E402
from _static_common import Kernel, Loop  # noqa: E402
from _static_common import line as _line  # noqa: E402

from pathattn.ops.path.triton import bwd, bwd_kv, crossings, fwd, segments  # noqa: E402
from pathattn.ops.path.triton import inspect_kernels as ik  # noqa: E402
from pathattn.ops.path.triton._common import tile_kwargs  # noqa: E402
from pathattn.ops.path.triton.config import H100_SHARED, launch_config  # noqa: E402
from pathattn.ops.path.triton.tables import default_seg  # noqa: E402


def _ours_shape(D: int) -> dict:
    cfg = launch_config(D, D, torch.bfloat16, H100_SHARED, None, (9, 0), 1)
    BD = tile_kwargs(D, D)["BD"]
    bkt, bq = cfg.kv_tiles()
    return {"BT": cfg.BT, "BD": BD, "NS": BD // cfg.m_rows(BD), "NSK": BD // cfg.kv_rows(BD),
            "BKT": bkt, "BQ": bq, "FSTEP": cfg.key_steps("fwd"), "BSTEP": cfg.key_steps("bwd"),
            "MULT": cfg.seg_multiple(), "NR": BD // min(BD, cfg.BT),
            "NRB": BD // cfg.seg_bwd_rows(BD), "WALK": cfg.seg_walk}


def _query_blocks(T: int, s: dict) -> list:
    """(a, sa, k, SEG) per query block: its index, its segment, its blocks before it in
    that segment, the segment length."""
    n = T // s["BT"]
    seg = default_seg(n, s["MULT"])
    return [(a, a // seg, a % seg, seg) for a in range(n)]


def _key_tiles(T: int, s: dict) -> list:
    """(later segments' query steps per segment) per program of bwd_kv: a program takes
    BKT keys of a block, or BKT // BT whole blocks of a segment (its last one alone when
    the segment's length is not a multiple)."""
    BT, n = s["BT"], T // s["BT"]
    seg = default_seg(n, s["MULT"])
    n_seg = -(-n // seg)
    out = []
    for sb in range(n_seg):
        blocks = min(seg, n - sb * seg)
        programs = blocks * (BT // s["BKT"]) if s["BKT"] <= BT else -(-blocks * BT // s["BKT"])
        steps = [-(-min(seg * BT, T - p * seg * BT) // s["BQ"]) for p in range(sb + 1, n_seg)]
        out += [steps] * programs
    return out


def _ours(D: int) -> list[Kernel]:
    sliced = D > 64  # past D = 64 the segment products are read a slice at a time
    sl = _line(segments.times_e_sliced, "for k0 in range")
    cb = _line(segments.cross_back_sliced, "for k0 in range")
    et = _line(crossings.times_et_sliced, "for k0 in range")
    f, b, kv = fwd._fwd_kernel, bwd._bwd_kernel, bwd_kv._bwd_kv_kernel
    cross = lambda p, s: max(p[1] - 1, 0) * s["NS"]  # noqa: E731 (segments crossed, slices)
    shape = _ours_shape(D)

    def steps(key: str, fn) -> list[Loop]:
        """The walk over each earlier segment's blocks, KSTEP a step, and its tail loop."""
        main = Loop(_line(fn, "for j in tl.range(0, SEG - SEG % KSTEP"),
                    lambda p, s: p[1] * (p[3] // s[key]))
        tail = Loop(_line(fn, "for j in range(SEG - SEG % KSTEP, SEG)"),
                    lambda p, s: p[1] * (p[3] % s[key]))
        return [main, tail] if shape[key] > 1 else [main]

    fwd_loops = [Loop(_line(f, "for ib in range"), lambda p, s: p[2]),
                 Loop(_line(f, "for js in range"), lambda p, s: p[1]),
                 *steps("FSTEP", f)]
    if sliced:
        fwd_loops.append(Loop(sl, cross))
    bwd_loops = [Loop(_line(b, "for i in range(0, a - sa * SEG)"), lambda p, s: p[2]),
                 Loop(_line(b, "for sc in range"), lambda p, s: p[1])]
    if sliced:
        bwd_loops += [Loop(sl, cross), Loop(cb, cross)]
    bwd_loops += [*steps("BSTEP", b),
                  Loop(_line(b, "for c in range"), lambda p, s: p[2]),
                  Loop(_line(b, "for i in range(0, a - 1 - c)"),
                       lambda p, s: p[2] * (p[2] - 1) // 2)]
    kv_loops = [Loop(_line(kv, "for p in range"), lambda p, s: len(p))]
    later = lambda p, s: max(len(p) - 1, 0) * s["NSK"]  # noqa: E731
    if sliced:
        kv_loops.append(Loop(et, later))
    kv_loops.append(Loop(_line(kv, "for j in tl.range"), lambda p, s: sum(p)))
    if sliced:
        kv_loops.append(Loop(sl, later))
    return [Kernel("ours", "fwd", "fwd", _query_blocks, tuple(fwd_loops)),
            Kernel("ours", "bwd", "bwd", _query_blocks, tuple(bwd_loops)),
            Kernel("ours", "bwd", "bwd_kv", _key_tiles, tuple(kv_loops))]


# fla-core 0.6.0 on an H100: query blocks BT, key blocks BS, backward chunks S (its
# `parallel.py`); the bounds below are its kernels' loop bounds
FLA_BT, FLA_BS, FLA_S = 128, 64, 512
FLA_KERNELS = {  # name -> (module, kernel, constexprs, num_stages, 128-row kernel)
    "fwd": ("parallel_path_fwd", "parallel_path_fwd_kernel",
            {"BT": FLA_BT, "BS": FLA_BS}, 3, True),
    "dq": ("parallel_path_bwd_inter_dqh", "parallel_path_bwd_dq_kernel",
           {"BT": FLA_BT, "BS": FLA_BS, "S": FLA_S}, 3, True),
    "dkv": ("parallel_path_bwd_inter_dkv", "parallel_path_bwd_dkv_kernel",
            {"BT": FLA_BT, "BS": FLA_BS, "S": FLA_S}, 3, True),
    "intra": ("parallel_path_bwd_intra", "parallel_path_bwd_intra_chunk_kernel",
              {"BT": FLA_BS, "S": FLA_S}, 3, False),
}


def _fla_fn(name: str):
    module, kernel = FLA_KERNELS[name][:2]
    fn = getattr(importlib.import_module(f"fla.ops.path_attn.{module}"), kernel)
    while type(fn).__name__ != "JITFunction":  # under fla's heuristics / autotune wrappers
        fn = fn.fn
    return fn


def _fla(with_locs: bool = True) -> list[Kernel]:
    """fla's kernels; with_locs False: without their loops' source lines (fla not
    imported: the trip counts alone)."""
    def big(T, s):
        return list(range(-(-T // FLA_BT)))

    def small(T, s):
        return list(range(-(-T // FLA_BS)))

    def dkv(i, T):
        start = i * FLA_BT // FLA_S * FLA_S
        return len(range(-(-T // FLA_BS) * FLA_BS - FLA_BS, start + FLA_S - FLA_BS, -FLA_BS))

    def intra(i):
        start = i * FLA_BS // FLA_S * FLA_S
        return [len(range(i * FLA_BS - FLA_BS, off, -FLA_BS))
                for off in range(start, i * FLA_BS, FLA_BS)]

    if with_locs:
        f, dq, kv, it = (_fla_fn(n) for n in ("fwd", "dq", "dkv", "intra"))
        line = _line
    else:
        f = dq = kv = it = None

        def line(fn, text):
            return ""
    # the forward's first loop runs once (the second half of the diagonal block): the
    # compiler drops it as a loop, so the kernel has one loop, the walk
    return [Kernel("fla", "fwd", "fwd", big,
                   (Loop(line(f, "for offset in range(i_t * BT - BS"), lambda i, s: 2 * i),)),
            Kernel("fla", "bwd", "dq", big,
                   (Loop(line(dq, "for offset_outer in range"),
                         lambda i, s: i * FLA_BT // FLA_S),
                    Loop(line(dq, "for offset in range(offset_outer"),
                         lambda i, s: i * FLA_BT // FLA_S * FLA_S // FLA_BS))),
            Kernel("fla", "bwd", "dkv", lambda T, s: [(i, T) for i in big(T, s)],
                   (Loop(line(kv, "for offset in range(last_chunk_end"),
                         lambda p, s: dkv(*p)),)),
            Kernel("fla", "bwd", "intra", small,
                   (Loop(line(it, "for offset in range(curr_start"),
                         lambda i, s: len(intra(i))),
                    Loop(line(it, "for i_t_small in range"), lambda i, s: sum(intra(i)))))]


def _fla_signature(fn, D: int, gates: bool, constexprs: dict) -> tuple[dict, dict]:
    """Argument types of one fla kernel as its launcher passes them (bf16 inputs, fp16
    Householder factors, float32 queries in the forward and float32 buffers)."""
    const = {"G": 1, "HQ": 16, "H": 16, "K": D, "V": D, "BK": D, "BV": D,
             "USE_GATE": gates, "IS_VARLEN": False, **constexprs}
    sig = {}
    for a in fn.arg_names:
        if a in const:
            sig[a] = "constexpr"
        elif a in ("cu_seqlens", "indices", "split_offsets", "offsets") or (
                a in ("g_cumsum", "dg_cumsum") and not gates):
            sig[a], const[a] = "constexpr", None
        elif a in ("T", "NUM_BLOCKS"):
            sig[a] = "i32"
        elif a == "scale":
            sig[a] = "fp32"
        elif a in ("k", "v", "o_new", "do", "dq_new") or (a == "q" and "fwd" not in fn.__name__):
            sig[a] = "*bf16"
        elif a in ("w1", "w2", "hc_whole"):
            sig[a] = "*bf16" if "intra" in fn.__name__ else "*fp16"
        else:
            sig[a] = "*fp32"
    return sig, const


def _compile(job: tuple) -> dict:
    """Child process: (side, name, D, gates) -> the report as JSON; fla's kernels around the scans:
    ("fla-lin", launch index, D, gates), the launch recorded at T = 2048 (its kernel and
    compile-time arguments are those of every T)."""
    side, name, D, gates = job
    warnings.filterwarnings("ignore")
    if side == "ours":
        return ik.inspect_kernel(name, D, torch.bfloat16, gates, "sm_90").to_json()
    if side == "fla-lin":
        return _compile_fla_launch(_fla_capture.launches(D, gates, CAPTURE_T)[name])
    constexprs, stages, wide = FLA_KERNELS[name][2:]
    fn = _fla_fn(name)
    sig, const = _fla_signature(fn, D, gates, constexprs)
    warps = 8 if wide and D == 128 else 4
    return ik.inspect_jit(fn, sig, const, 90, num_warps=warps, num_stages=stages).to_json()


CAPTURE_T = 2048  # the sequence length fla's other kernels are recorded at for compiling


def _compile_fla_launch(la) -> dict:
    """Compile one of fla's recorded launches for sm_90. Its triangular solve's TMA path
    (which fla takes on an H100) fails to compile with some Triton versions (Triton 3.9:
    an int64 TMA coordinate); it is then compiled without TMA, and the report says so."""
    from pathattn.ops.path.triton.fit import compile_jit

    sig, const, attrs = _fla_capture.compile_args(la)
    try:
        c = compile_jit(la.fn, sig, const, 90, la.num_warps, la.num_stages, "cubin", attrs)
        note = ""
    except Exception:  # noqa: BLE001 (Triton's compile errors have many types)
        if not const.get("USE_TMA"):
            raise
        const = {**const, "USE_TMA": False}
        c = compile_jit(la.fn, sig, const, 90, la.num_warps, la.num_stages, "cubin", attrs)
        note = "without TMA"
    return {**ik._report(la.name, c, 90, la.num_warps).to_json(), "note": note}


def _kept(ptx: tuple, sass: tuple) -> list:
    """The PTX loop each SASS loop belongs to, in code order (None: a second SASS loop of
    one PTX loop). ptxas unrolls some loops of constant trip count (their instructions are
    then their parent's, or straight code), and may split one loop in two (an unrolled
    body and a remainder): each SASS loop is the next PTX loop of its depth; where the
    SASS holds more loops of a depth than the PTX, a loop's extra SASS loops follow it and
    count no iterations (a lower bound, met only in fla's cumulative sums: a few thousand
    instructions)."""
    kept, i = [], 0
    for j, s in enumerate(sass):
        left = sum(x.depth == s.depth for x in sass[j:])
        ahead = sum(x.depth == s.depth for x in ptx[i:])
        if kept and left > ahead and kept[-1] is not None and kept[-1].depth == s.depth:
            kept.append(None)
            continue
        while i < len(ptx) and ptx[i].depth != s.depth:
            i += 1
        if i == len(ptx):
            raise RuntimeError(f"SASS loops {[x.depth for x in sass]} do not follow the PTX "
                               f"loops {[(x.loc, x.depth) for x in ptx]}")
        kept.append(ptx[i])
        i += 1
    return kept


def count(kernel: Kernel, r: ik.KernelReport, T: int, shape: dict) -> dict:
    """Warp-instructions, MMA and spill loads / stores (LDL / STL) one head issues. The
    scans' loops must be those described, in code order; the loops of a kernel around them are found
    by their source lines, and a described loop the compiler unrolled is in the straight
    code (every loop compiled must be described)."""
    loops = r.sass_loops or ()
    if kernel.scan:
        if len(loops) != len(kernel.loops):
            raise RuntimeError(f"{kernel.side} {kernel.name}: {len(loops)} loops in the SASS, "
                               f"{len(kernel.loops)} described here")
        for want, got in zip(kernel.loops, r.loops, strict=True):
            if want.loc and want.loc != got.loc:  # "" only where fla's source is not read
                raise RuntimeError(f"{kernel.side} {kernel.name}: loop at {got.loc}, "
                                   f"expected {want.loc}")
        described = list(kernel.loops)
    else:
        by_loc = {lp.loc: lp for lp in kernel.loops}
        missing = [x.loc for x in r.loops if x.loc not in by_loc]
        if missing:
            raise RuntimeError(f"{kernel.side} {kernel.name}: loops at {missing} not described "
                               f"(described: {sorted(by_loc)})")
        described = [by_loc[x.loc] if x is not None else Loop("", lambda p, s: 0)
                     for x in _kept(r.loops, loops)]
    straight = r.sass_instructions - sum(x.instructions for x in loops)
    straight_mma = r.sass_mma_total - sum(x.mma for x in loops)
    straight_fma = r.sass_fma - sum(x.fma for x in loops)
    progs = kernel.programs(T, shape)
    trips = [sum(lp.trips(p, shape) for p in progs) for lp in described]
    w = r.num_warps
    per_loop = list(zip(trips, loops, strict=True))
    return {
        "programs": len(progs), "trips": trips,
        "instructions": w * (len(progs) * straight
                             + sum(t * x.instructions for t, x in per_loop)),
        "mma": w * (len(progs) * straight_mma + sum(t * x.mma for t, x in per_loop)),
        "fma": w * (len(progs) * straight_fma + sum(t * x.fma for t, x in per_loop)),
        "local": w * sum(t * x.local for t, x in per_loop),
    }


# an H100 SM issues one warp-instruction per cycle from each of its 4 schedulers and its
# tensor cores do 2,048 16-bit multiply-adds per cycle (989 dense bf16 TFLOP/s at 1.83 GHz
# on 132 SMs); mma.sync is taken at that rate too, so the bound is a lower one
ISSUE_PER_CYCLE, FMA_PER_CYCLE = 4, 2048


def cycles(c: dict) -> dict:
    """SM-cycles one head's work needs at least: to issue its instructions, to run its
    products, and the larger of the two."""
    issue, tensor = c["instructions"] / ISSUE_PER_CYCLE, c["fma"] / FMA_PER_CYCLE
    return {"issue": issue, "tensor": tensor, "bound": max(issue, tensor)}


def _kernels(D: int, gates: bool, T: int, have_fla: bool, scans_only: bool) -> list[Kernel]:
    """Every kernel counted at head dim D, gates on or off, T tokens: our scans and the
    kernels around them, fla's (those around its scans from its launches recorded at T)."""
    ks = _ours(D) + ([] if scans_only else _static_linear.ours(D, _ours_shape(D)))
    if have_fla:
        ks += _fla()
        if not scans_only:
            ks += _static_linear.fla(_fla_capture.launches(D, gates, T))
    return ks


def _job(k: Kernel, D: int, gates: bool) -> tuple:
    return ("fla-lin", k.launch, D, gates) if k.launch is not None else (k.side, k.name, D,
                                                                            gates)


def _fewest(rows: list) -> list:
    """Of each autotuned fla kernel's configurations (consecutive launches of one kernel
    with a configuration), the one with the fewest instructions."""
    def run(i_row):
        k = i_row[1][0]
        return (k.part, k.name) if k.config else i_row[0]  # unconfigured: a run of its own

    return [min((row for _, row in group), key=lambda r: r[2]["instructions"])
            for _, group in itertools.groupby(enumerate(rows), key=run)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="64,128", help="head dims, comma-separated")
    ap.add_argument("--gates", choices=("on", "off", "both"), default="both")
    ap.add_argument("--seq-lens", default="2048,8192,16384")
    ap.add_argument("--jobs", type=int, default=2, help="compilations side by side")
    ap.add_argument("--scans-only", action="store_true",
                    help="the attention scans only, not the kernels around them")
    ap.add_argument("--json", help="write every count here")
    args = ap.parse_args()
    heads = [int(x) for x in args.heads.split(",")]
    for D in heads:
        if D not in (64, 128):
            ap.error(f"--heads: 64 and 128 are the head dims both compile for, got {D}")
    seq_lens = [int(x) for x in args.seq_lens.split(",")]
    for T in seq_lens:
        if T <= 0 or T % 512:
            ap.error(f"--seq-lens: multiples of 512 (fla's backward chunk), got {T}")
    gates = {"on": [True], "off": [False], "both": [True, False]}[args.gates]
    try:
        importlib.import_module("fla.ops.path_attn")
        have_fla = True
    except Exception as e:  # noqa: BLE001 (fla's import fails in many ways without a GPU)
        print(f"fla not importable ({type(e).__name__}: {e}): our columns only")
        have_fla = False
    jobs = list(dict.fromkeys(
        _job(k, D, g) for D in heads for g in gates
        for k in _kernels(D, g, CAPTURE_T, have_fla, args.scans_only)))
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        raw = dict(zip(jobs, pool.map(_compile, jobs), strict=True))
    reports = {job: ik.KernelReport.from_json({k: v for k, v in r.items() if k != "note"})
               for job, r in raw.items()}
    results = []
    print(f"sm_90, bf16, R 1, one head, Triton {_triton_version()}: warp-instructions issued "
          "(millions; spill loads / stores among them), MMA instructions (thousands), "
          "SM-cycles to issue them and to run the products (millions); * marks a kernel "
          "around the scans, fla's autotuned ones at the configuration with the fewest "
          "instructions\n")
    scopes = ("scans",) if args.scans_only else ("scans", "all")
    for D in heads:
        shape = _ours_shape(D)
        for g in gates:
            print(f"### D = {D}, gates {'on' if g else 'off'}\n")
            print("| T | side | kernel | warps | regs | spills B | instructions M "
                  "(LDL/STL) | MMA K | issue / tensor Mcycles |")
            print("|---|---|---|---|---|---|---|---|---|")
            sums = []
            for T in seq_lens:
                tot: dict = {}
                rows = []
                for k in _kernels(D, g, T, have_fla, args.scans_only):
                    r = reports[_job(k, D, g)]
                    rows.append((k, r, count(k, r, T, {**shape, "T": T})))
                for k, r, c in _fewest(rows):
                    cy = cycles(c)
                    note = raw[_job(k, D, g)].get("note", "")
                    results.append({"D": D, "gates": g, "T": T, "side": k.side,
                                    "part": k.part, "kernel": k.name, "scan": k.scan,
                                    "config": dict(k.config), "note": note, "regs": r.regs,
                                    "spills": r.spills, "warps": r.num_warps, **c,
                                    "cycles": cy})
                    for scope in scopes:
                        if scope == "scans" and not k.scan:
                            continue
                        for part in (k.part, "fwd+bwd"):
                            t = tot.setdefault((k.side, part, scope), dict.fromkeys(
                                ("instructions", "fma", "bound"), 0.0))
                            t["instructions"] += c["instructions"]
                            t["fma"] += c["fma"]
                            t["bound"] += cy["bound"]  # the kernels run one after another
                    name = k.name if k.scan else f"* {k.name}"
                    if k.config:
                        name += " " + ", ".join(f"{a}={v}" for a, v in k.config)
                    if note:
                        name += f", {note}"
                    print(f"| {T} | {k.side} | {k.part} {name} | {r.num_warps} | {r.regs} | "
                          f"{r.spills} | {c['instructions'] / 1e6:.2f} "
                          f"({c['local'] / 1e6:.2f}) | {c['mma'] / 1e3:.1f} | "
                          f"{cy['issue'] / 1e6:.2f} / {cy['tensor'] / 1e6:.2f} |")
                if have_fla:
                    sums.append((T, {scope: {p: {x: tot[("ours", p, scope)][x]
                                                 / tot[("fla", p, scope)][x]
                                                 for x in ("instructions", "fma", "bound")}
                                             for p in ("fwd", "bwd", "fwd+bwd")}
                                     for scope in scopes}))
            for scope in scopes if sums else ():
                what = ("the attention scans" if scope == "scans"
                        else "every Triton kernel, those around the scans included")
                print(f"\nours / fla, {what}: instructions issued, multiply-adds, and the "
                      "larger of issue and tensor cycles per kernel, summed:\n")
                print("| T | fwd | bwd | fwd + bwd |\n|---|---|---|---|")
                for T, rat in sums:
                    results.append({"D": D, "gates": g, "T": T, "scope": scope,
                                    "ours_over_fla": rat[scope]})
                    print(f"| {T} | " + " | ".join(
                        " / ".join(f"{rat[scope][p][x]:.2f}"
                                   for x in ("instructions", "fma", "bound"))
                        for p in ("fwd", "bwd", "fwd+bwd")) + " |")
            print()
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(results, fh, indent=1)
        os.replace(tmp, args.json)


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
