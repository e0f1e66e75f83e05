"""Issued instructions of the attention scans, ours and fla's, counted without a GPU.

Both implementations' scan kernels are compiled ahead of time for sm_90 (H100) with the
launch settings each picks on an H100: ours from `pathattn.ops.path.triton.config`, fla's
as its launchers set them (fla-core 0.6.0: 128-query blocks, 64-key blocks, 512-token
chunks in the backward, 4 warps, 8 at D = 128 for the 128-row kernels). Per loop of each
kernel's SASS, one iteration's own instructions (`inspect_kernels.SassLoop`) are multiplied
by the loop's trip count, summed over the programs of one head of a dense sequence of T
tokens; each program also issues the instructions outside its loops once. The result is
warp-instructions per head: the issue work the SM schedulers must do.

    python benchmarks/static_vs_fla.py                    # D 64, 128; gates on, off; T 2048-16384
    python benchmarks/static_vs_fla.py --heads 64 --gates on --seq-lens 8192 --json out.json

Counted: ours `fwd`, `bwd` and `bwd_kv`; fla's `parallel_path_fwd_kernel`,
`parallel_path_bwd_dq_kernel`, `parallel_path_bwd_dkv_kernel` and
`parallel_path_bwd_intra_chunk_kernel`. Not counted: the O(T) kernels around them (ours:
the UT transform and its backward, the segment kernels; fla's: the chunk preprocessing,
the Householder products, the query transform), which matter most at T = 2048. Issue
count is a proxy, not a time: a loop that waits on memory or on a chain of dependent
products (the carried query state) runs slower than its instruction count says. fla must
be importable (`PYTHONPATH=<dir with fla>`); without it only our columns are printed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

if __name__ == "__main__":  # the kernels are compiled, not interpreted (imported, as by
    os.environ["TRITON_INTERPRET"] = "0"  # its tests, it leaves the environment alone)

import torch  # noqa: E402

from pathattn.ops.path.triton import bwd, bwd_kv, crossings, fwd, segments  # noqa: E402
from pathattn.ops.path.triton import inspect_kernels as ik  # noqa: E402
from pathattn.ops.path.triton._common import tile_kwargs  # noqa: E402
from pathattn.ops.path.triton.config import H100_SHARED, launch_config  # noqa: E402
from pathattn.ops.path.triton.tables import default_seg  # noqa: E402

# ------------------------------------------------------------------ where each loop is


def _line(fn, text: str) -> str:
    """'file.py:line' of the first source line of fn (a function or module) holding text."""
    fn = getattr(fn, "fn", fn)
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return f"{os.path.basename(inspect.getsourcefile(fn))}:{start + i}"
    raise LookupError(f"{text!r} not in {fn.__name__}")


@dataclass(frozen=True)
class Loop:
    loc: str  # 'file.py:line' of its `for`, as in `inspect_kernels.LoopInfo.loc`
    trips: object  # program -> iterations of this loop's body in that program, all in all


@dataclass(frozen=True)
class Kernel:
    side: str  # "ours" / "fla"
    part: str  # "fwd" / "bwd"
    name: str
    programs: object  # (T, shape) -> list of programs of one head
    loops: tuple  # Loop per loop of the kernel, in code order


def _ours_shape(D: int) -> dict:
    cfg = launch_config(D, D, torch.bfloat16, H100_SHARED, None, (9, 0), 1)
    BD = tile_kwargs(D, D)["BD"]
    bkt, bq = cfg.kv_tiles()
    return {"BT": cfg.BT, "BD": BD, "NS": BD // cfg.m_rows(BD), "NSK": BD // cfg.kv_rows(BD),
            "BKT": bkt, "BQ": bq, "FSTEP": cfg.key_steps("fwd"), "BSTEP": cfg.key_steps("bwd"),
            "MULT": cfg.seg_multiple()}


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
    """Child process: (side, name, D, gates) -> the report as JSON."""
    side, name, D, gates = job
    warnings.filterwarnings("ignore")
    if side == "ours":
        return ik.inspect_kernel(name, D, torch.bfloat16, gates, "sm_90").to_json()
    constexprs, stages, wide = FLA_KERNELS[name][2:]
    fn = _fla_fn(name)
    sig, const = _fla_signature(fn, D, gates, constexprs)
    warps = 8 if wide and D == 128 else 4
    return ik.inspect_jit(fn, sig, const, 90, num_warps=warps, num_stages=stages).to_json()


def count(kernel: Kernel, r: ik.KernelReport, T: int, shape: dict) -> dict:
    """Warp-instructions, MMA and spill loads / stores (LDL / STL) one head issues."""
    loops = r.sass_loops or ()
    if len(loops) != len(kernel.loops):
        raise RuntimeError(f"{kernel.side} {kernel.name}: {len(loops)} loops in the SASS, "
                           f"{len(kernel.loops)} described here")
    for want, got in zip(kernel.loops, r.loops, strict=True):
        if want.loc and want.loc != got.loc:  # "" only where fla's source is not read
            raise RuntimeError(f"{kernel.side} {kernel.name}: loop at {got.loc}, "
                               f"expected {want.loc}")
    straight = r.sass_instructions - sum(x.instructions for x in loops)
    straight_mma = r.sass_mma_total - sum(x.mma for x in loops)
    straight_fma = r.sass_fma - sum(x.fma for x in loops)
    progs = kernel.programs(T, shape)
    trips = [sum(lp.trips(p, shape) for p in progs) for lp in kernel.loops]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="64,128", help="head dims, comma-separated")
    ap.add_argument("--gates", choices=("on", "off", "both"), default="both")
    ap.add_argument("--seq-lens", default="2048,8192,16384")
    ap.add_argument("--jobs", type=int, default=2, help="compilations side by side")
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
    kernels = {D: _ours(D) + (_fla() if have_fla else []) for D in heads}
    jobs = [(k.side, k.name, D, g) for D in heads for g in gates for k in kernels[D]]
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        reports = {job: ik.KernelReport.from_json(r)
                   for job, r in zip(jobs, pool.map(_compile, jobs), strict=True)}
    results = []
    print(f"sm_90, bf16, R 1, one head, Triton {_triton_version()}: warp-instructions issued "
          "(millions; spill loads / stores among them), MMA instructions (thousands), "
          "SM-cycles to issue them and to run the products (millions)\n")
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
                for k in kernels[D]:
                    r = reports[(k.side, k.name, D, g)]
                    c = count(k, r, T, shape)
                    cy = cycles(c)
                    results.append({"D": D, "gates": g, "T": T, "side": k.side,
                                    "part": k.part, "kernel": k.name, "regs": r.regs,
                                    "spills": r.spills, "warps": r.num_warps, **c,
                                    "cycles": cy})
                    for part in (k.part, "fwd+bwd"):
                        t = tot.setdefault((k.side, part), dict.fromkeys(
                            ("instructions", "fma", "bound"), 0.0))
                        t["instructions"] += c["instructions"]
                        t["fma"] += c["fma"]
                        t["bound"] += cy["bound"]  # the kernels run one after another
                    print(f"| {T} | {k.side} | {k.name} | {r.num_warps} | {r.regs} | "
                          f"{r.spills} | {c['instructions'] / 1e6:.2f} "
                          f"({c['local'] / 1e6:.2f}) | {c['mma'] / 1e3:.1f} | "
                          f"{cy['issue'] / 1e6:.2f} / {cy['tensor'] / 1e6:.2f} |")
                if have_fla:
                    sums.append((T, {p: {x: tot[("ours", p)][x] / tot[("fla", p)][x]
                                         for x in ("instructions", "fma", "bound")}
                                     for p in ("fwd", "bwd", "fwd+bwd")}))
            if sums:
                print("\nours / fla: instructions issued, multiply-adds, and the larger of "
                      "issue and tensor cycles per kernel, summed:\n")
                print("| T | fwd | bwd | fwd + bwd |\n|---|---|---|---|")
                for T, rat in sums:
                    results.append({"D": D, "gates": g, "T": T, "ours_over_fla": rat})
                    print(f"| {T} | " + " | ".join(
                        " / ".join(f"{rat[p][x]:.2f}" for x in ("instructions", "fma", "bound"))
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
