"""Do pathattn's Triton kernels fit real GPUs? Compile them ahead of time and check.

Runs on any machine, GPU or not: Triton's compiler and ptxas ship in its wheel. Every kernel
of a forward + backward (UT transform, forward scan, segment products, backward scan, UT
backward) is compiled for sm_80 (A100, 166,912 B of shared memory per block) and sm_90
(H100, 232,448 B) with the launch configuration `pathattn.ops.path.triton.config.launch_config`
picks there, for R = 1 and several reflections per token, and its shared memory per program
compared with the device's limit. Prints a markdown table (kernel, reflections per token,
head dim, dtype, block size, shared memory on sm_80 / sm_90, and with --ptxas registers and
spills) and exits with status 1 when a kernel does not compile or does not fit; a
configuration the launcher refuses on a device (no block length fits its shared memory) is
listed, not a failure.

    python benchmarks/triton_fit.py --quick     # CI: D in {64, 128, 256}, fp32 and bf16,
                                                #     R in {1, 2, 4}, default block sizes
    python benchmarks/triton_fit.py             # D 16 ... 256 (48, 80, 96, 160, 192 too),
                                                #     fp32 / bf16 / fp16, gates on and off,
                                                #     R in {1, 2, 3, 4, 8}, every block
                                                #     size the launcher accepts
    python benchmarks/triton_fit.py --quick --ptxas   # + registers and spills (ptxas:
                                                      #   20 s to minutes per kernel)
    python benchmarks/triton_fit.py --quick --reflections 2 --heads 64,128
    python benchmarks/triton_fit.py --table     # remeasure config.SHARED_BYTES (and
                                                #   SHARED_BYTES_REFLECTIONS)
    python benchmarks/triton_fit.py --report --jobs 2   # per kernel: registers, spills,
        # shared memory, blocks per SM, atomics and fences in loops, MMA instructions per
        # block pair (bf16, D 64 and 128, gates on and off, R 1 and 2, sm_90 and sm_80;
        # `pathattn.ops.path.triton.inspect_kernels` defines each); --loops: every loop
    python benchmarks/triton_fit.py --report --fox   # the FoX attention kernels (sm_90,
        # bf16, D 64 and 128): registers, spills, shared memory, blocks per SM and per
        # loop of the SASS its instructions, MMA and spill loads / stores per iteration

Shared memory is read after Triton's shared-memory allocation pass, which runs on the TTGIR
at the start of the LLVM-IR stage: about 0.3 s per kernel instead of the 5-60 s the LLVM
optimizer and ptxas take (`pathattn.ops.path.triton.fit` explains the stages; with --ptxas both
numbers are computed and must agree). Packed sequences (cu_seqlens) run the same kernels as
dense batches, and head dims sharing a padded dim (48 and 64; 80, 96 and 128; 160, 192 and
256) the same specialization, so each is compiled once and listed under the first head dim.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

# The interpreter replaces kernels by Python functions: compile with it off.
os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402

from pathattn.ops.path.triton import config as triton_config  # noqa: E402
from pathattn.ops.path.triton import fit  # noqa: E402
from pathattn.ops.path.triton import inspect_kernels as ik  # noqa: E402

_DT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _rows(fits: list, by_block_size: bool) -> list[str]:
    """One markdown row per specialization, sm_80 and sm_90 side by side: the default block
    size of each device, or (by_block_size) one row per block size."""
    by_key: dict = {}
    for f in fits:
        key = (f.kernel, f.R, f.D, f.dtype, f.gates, f.G) + ((f.BT,) if by_block_size else ())
        by_key.setdefault(key, {})[f.capability] = f
    rows = ["| kernel | R | D | dtype | gates | G | BT sm_80 / sm_90 | stages | shared B sm_80 "
            "| shared B sm_90 | regs sm_80 / sm_90 | spills B sm_80 / sm_90 | fits |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (kernel, R, D, dtype, gates, G, *_), per in by_key.items():
        a, h = per.get(80), per.get(90)

        def cell(f, attr):
            return "-" if f is None or getattr(f, attr) is None else str(getattr(f, attr))

        ok = all(f.fits for f in per.values())
        rows.append(
            f"| {kernel} | {R} | {D} | {_DT[dtype]} | {'on' if gates else 'off'} | {G} "
            f"| {cell(a, 'BT')} / {cell(h, 'BT')} "
            f"| {cell(a, 'num_stages')} / {cell(h, 'num_stages')} "
            f"| {cell(a, 'shared')} | {cell(h, 'shared')} "
            f"| {cell(a, 'regs')} / {cell(h, 'regs')} | {cell(a, 'spills')} / {cell(h, 'spills')} "
            f"| {'yes' if ok else 'NO'} |")
    return rows


def _print_table(reflections: int, indent: str) -> None:
    for cap in (80, 90):
        t0 = time.time()
        table = fit.measure_shared_table(cap, reflections)
        print(f"{indent}    {cap}: {{  # measured in {time.time() - t0:.0f} s")
        for BD, row in table.items():
            print(f"{indent}        {BD}: {{")
            for bt, values in row.items():
                print(f"{indent}            {bt}: ({', '.join(map(str, values))}),")
            print(f"{indent}        }},")
        print(f"{indent}    }},")


def _table(reflections: tuple[int, ...]) -> int:
    """Print `config.SHARED_BYTES` (R = 1) and `config.SHARED_BYTES_REFLECTIONS` (the other
    R, powers of two) as measured now, in the layout of config.py."""
    if 1 in reflections:
        print("SHARED_BYTES = {")
        _print_table(1, "")
        print("}")
    others = [r for r in reflections if r > 1]
    if others:
        print("SHARED_BYTES_REFLECTIONS = {")
        for r in others:
            print(f"    {r}: {{")
            _print_table(r, "    ")
            print("    },")
        print("}")
    return 0


REPORT = {"D": (64, 128), "dtypes": (torch.bfloat16,), "gates": (True, False),
          "reflections": (1, 2)}


def _inspect(config: tuple):
    try:
        return ik.inspect_kernel(*config), None
    except Exception as e:  # reported with its configuration
        return None, f"{type(e).__name__}: {str(e)[:500]}"


def _atomics_cell(counts: dict) -> str:
    by: dict = {}
    for op, n in counts.items():
        key = "{}.{}".format(*ik.atomic_order(op))
        by[key] = by.get(key, 0) + n
    return ", ".join(f"{n} {k}" for k, n in by.items()) or "-"


_ON = {True: "on", False: "off"}


def _loop_note(x) -> str:
    inner = ", innermost" if x.innermost else ""
    return (f"{x.loc or '?'} (depth {x.depth}{inner}, MMA own {x.mma_own}, "
            f"static {x.mma_static})")


def _missing(x) -> str:
    return "?" if x is None else str(x)


def _report_rows(reports: list, loops: bool) -> list[str]:
    """One markdown table per kernel, a row per device and configuration."""
    rows = []
    for kernel in dict.fromkeys(r.config["kernel"] for r in reports):
        rows += [f"\n**{kernel}**\n",
                 "| arch | D | gates | R | BT | warps / stages | regs "
                 "| spills B (LDL/STL in loops) | shared B "
                 "| blocks/SM | atomics in loops | fences in loops PTX / SASS | MMA per pair "
                 "/ total | pair loop |", "|" + "---|" * 14]
        notes = []
        for r in (r for r in reports if r.config["kernel"] == kernel):
            c = r.config
            mma = f"{r.mma_per_block_pair or '-'} / {r.mma_total}"
            if (r.sass_mma_per_block_pair, r.sass_mma_total) not in (
                    (None, None), (r.mma_per_block_pair, r.mma_total)):
                mma += f" (SASS {r.sass_mma_per_block_pair or '-'} / {r.sass_mma_total})"
            rows.append(
                f"| sm_{r.capability} | {c['D']} | {_ON[c['gates']]} | {c['R']} "
                f"| {c['BT']} | {r.num_warps} / {c['num_stages']} | {r.regs} "
                f"| {r.spills} ({_missing(r.sass_local_in_loops)}) "
                f"| {r.shared} | {r.blocks_per_sm} ({r.limiter}) "
                f"| {_atomics_cell(r.atomics_in_loops)} "
                f"| {r.fences_in_loops} / {r.sass_membar_gpu_in_loops} | {mma} "
                f"| {r.pair_loop if r.mma_per_block_pair else '-'} |")
            if loops:
                where = f"sm_{r.capability} D={c['D']} gates {_ON[c['gates']]} R={c['R']}"
                notes.append(f"- {where}: " + ("; ".join(map(_loop_note, r.loops)) or "no loop"))
                if r.sass_loops:
                    notes.append("  SASS per iteration: " + "; ".join(
                        f"depth {x.depth}: {x.instructions} instructions, {x.mma} MMA, "
                        f"{x.local} LDL/STL" for x in r.sass_loops))
        rows += ["", "Loops:", *notes] if notes else []
    return rows


def _report(args, devices: tuple) -> int:
    grid = dict(REPORT)
    if args.heads is not None:
        grid["D"] = tuple(int(d) for d in args.heads.split(","))
    if args.reflections is not None:
        grid["reflections"] = tuple(int(r) for r in args.reflections.split(","))
    configs = ik.grid_configs(grid, devices)
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_inspect, configs))
    reports = [r for r, _ in results if r is not None]
    print(f"Triton {triton.__version__}: kernels compiled for {', '.join(devices)} "
          f"(bf16, {len(configs)} compilations, {time.time() - t0:.0f} s)")
    print("\n".join(_report_rows(reports, args.loops)))
    errors = [(c, e) for c, (_, e) in zip(configs, results, strict=True) if e is not None]
    for (k, D, dtype, gates, device, R), e in errors:
        print(f"\nDOES NOT COMPILE: {k} {device} D={D} {_DT[dtype]} gates={gates} R={R}: {e}")
    return 1 if errors else 0


def _fox_report(heads: tuple) -> int:
    """The FoX attention kernels of a training step as the launcher specializes them."""
    from pathattn.ops.fox.triton.fit import specializations

    t0 = time.time()
    rows = ["| kernel | D | BT | warps / stages | regs | spills B | shared B | blocks/SM "
            "| SASS loops: instructions / MMA / LDL+STL per iteration |", "|" + "---|" * 9]
    for D in heads:
        for s in specializations(D, torch.bfloat16):
            if s.name not in ("fwd", "dkdv", "dq"):
                continue
            c = fit.compile_jit(s.fn, s.signature, s.constexprs, 90, s.num_warps,
                                s.num_stages, "cubin", s.attrs)
            blocks, limiter = ik.blocks_per_sm(c.regs, s.num_warps, c.shared, 90)
            loops = ik.analyze(c.ptx, ik.disassemble(c.cubin)).get("sass_loops") or ()
            cell = "; ".join(f"{x.instructions} / {x.mma} / {x.local}" for x in loops) or "-"
            rows.append(f"| {s.name} | {D} | {s.constexprs['BT']} | {s.num_warps} / "
                        f"{s.constexprs['STAGES']} | {c.regs} | {c.spills} | {c.shared} "
                        f"| {blocks} ({limiter}) | {cell} |")
    print(f"Triton {triton.__version__}: FoX kernels compiled for sm_90 (bf16, "
          f"{time.time() - t0:.0f} s)\n")
    print("\n".join(rows))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="D in {64, 128, 256}, fp32 and bf16, gates on, default block sizes")
    p.add_argument("--ptxas", action="store_true",
                   help="run LLVM and ptxas too: registers and spills (minutes per kernel)")
    p.add_argument("--devices", default="sm_80,sm_90", help="comma-separated: sm_80, sm_90")
    p.add_argument("--reflections", default=None,
                   help="comma-separated reflections per token (default: the set's)")
    p.add_argument("--heads", default=None, help="comma-separated head dims (default: the set's)")
    p.add_argument("--table", action="store_true",
                   help="measure and print config.SHARED_BYTES / SHARED_BYTES_REFLECTIONS "
                        "instead (R in --reflections, default 1 and the R it has tables for)")
    p.add_argument("--report", action="store_true",
                   help="compile to cubin and print registers, spills, shared memory, blocks "
                        "per SM, atomics and fences in loops, MMA per block pair per kernel")
    p.add_argument("--loops", action="store_true", help="with --report: list every loop")
    p.add_argument("--jobs", type=int, default=1, help="with --report: parallel compilations")
    p.add_argument("--fox", action="store_true",
                   help="with --report: the FoX attention kernels instead (sm_90, bf16)")
    args = p.parse_args(argv)
    if args.report and args.fox:
        return _fox_report(tuple(int(d) for d in (args.heads or "64,128").split(",")))
    if args.report:
        return _report(args, tuple(args.devices.split(",")))
    reflections = None if args.reflections is None else tuple(
        int(r) for r in args.reflections.split(","))
    if args.table:
        # by default the R that config.py holds tables for (more: --reflections)
        return _table(reflections or (1, *sorted(triton_config.SHARED_BYTES_REFLECTIONS)))
    grid = dict(fit.QUICK if args.quick else fit.FULL)
    if reflections is not None:
        grid["reflections"] = reflections
    if args.heads is not None:
        grid["D"] = tuple(int(d) for d in args.heads.split(","))
    devices = tuple(args.devices.split(","))
    stage = "cubin" if args.ptxas else "shared"
    t0 = time.time()

    def progress(f):
        regs = "" if f.regs is None else f" regs {f.regs} spills {f.spills}"
        print(f"  sm_{f.capability} {f.kernel:6s} R{f.R} D{f.D:<3d} {_DT[f.dtype]} BT{f.BT} "
              f"G{f.G} "
              f"stages {f.num_stages} shared {f.shared}{regs}"
              + ("" if f.fits else "  > limit"), file=sys.stderr, flush=True)

    errors: list = []
    refused: list = []
    fits = fit.run_checks(grid, devices, stage, all_block_sizes=not args.quick,
                          progress=progress, errors=errors, refused=refused)
    failures = [f for f in fits if not f.fits]
    print(f"Triton kernels compiled for {', '.join(devices)} "
          f"({'quick' if args.quick else 'full'} set, stage {stage!r}, "
          f"{len(fits)} compilations, {time.time() - t0:.0f} s)\n")
    print("\n".join(_rows(fits, by_block_size=not args.quick)))
    shared = {}
    for D in grid["D"]:
        shared.setdefault(max(16, 1 << (D - 1).bit_length()), []).append(D)
    groups = [", ".join(map(str, ds)) for ds in shared.values() if len(ds) > 1]
    if groups:
        print("\nHead dims sharing a row (same padded dim, same compiled kernels): "
              + "; ".join(groups))
    for device, D, dtype, R in refused:
        print(f"\nRefused by the launcher (no block length fits): {device} D={D} "
              f"{_DT[dtype]} R={R}")
    for f in failures:
        print(f"\nDOES NOT FIT: {f.kernel} R={f.R} D={f.D} {_DT[f.dtype]} BT={f.BT} "
              f"sm_{f.capability}: {f.shared} > {f.limit} bytes")
    for what, e in errors:
        print(f"\nDOES NOT COMPILE: {what}: {type(e).__name__}: {str(e)[:500]}")
    return 1 if failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
