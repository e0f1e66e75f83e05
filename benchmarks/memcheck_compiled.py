"""Do the compiled Triton kernels stay inside their memory? Checked without a GPU.

Every kernel launch of one forward + backward of an op (PaTH, FoX or stick-breaking) is
compiled by the installed Triton's JIT for an H100 (or an A100) from the op's real
arguments on CPU tensors, and its programs run in the PTX emulator
(`pathattn.ops.common.compiled_launches`): a table per launch of the programs run, the
global and shared accesses checked, the accesses outside the launch's memory (with the
first one's source line) and the addresses that could not be evaluated. Exits with status
1 when any launch has either.

    python benchmarks/memcheck_compiled.py                          # D 64, gates, T 2048
    python benchmarks/memcheck_compiled.py --shape 1,2048,1,1,64 --no-gates
    python benchmarks/memcheck_compiled.py --lengths 1,700,1347 --heads 2,1
    python benchmarks/memcheck_compiled.py --op fox --capability 80
    python benchmarks/memcheck_compiled.py --sample 8    # 8 programs per launch (big grids)

The GPU runs use Triton 3.6: run this file with it as benchmarks/README.md shows
(`triton_fit.py`, "The GPU's Triton") to check what that version compiles.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU, not the interpreter

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from tqdm import tqdm  # noqa: E402

from pathattn.ops.common.compiled_launches import memcheck, record_launches  # noqa: E402
from pathattn.ops.fox.triton.op import fox_attn_triton  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402
from pathattn.ops.sba.triton.op import sb_attn_triton  # noqa: E402


def _inputs(a):
    B, T, HQ, H, D = a.shape
    dt = getattr(torch, a.dtype)
    gen = torch.Generator().manual_seed(0)
    wshape = (B, T, H) if a.reflections == 1 else (B, T, H, a.reflections)
    q = torch.randn(B, T, HQ, D, generator=gen).to(dt)
    k = torch.randn(B, T, H, D, generator=gen).to(dt)
    v = torch.randn(B, T, H, D, generator=gen).to(dt)
    w = F.normalize(torch.randn(*wshape, D, generator=gen), dim=-1).to(dt)
    beta = (2 * torch.rand(*wshape, generator=gen)).to(dt)
    g = F.logsigmoid(torch.randn(B, T, HQ, generator=gen) + 2).to(dt) if a.gates else None
    xs = [x.requires_grad_() for x in (q, k, v, w, beta, g) if x is not None]
    return (q, k, v, w, beta, g), xs


def _step(a) -> None:
    (q, k, v, w, beta, g), _ = _inputs(a)
    cu = None
    if a.lengths:
        cu = torch.tensor([0, *torch.tensor(a.lengths).cumsum(0).tolist()], dtype=torch.int32)
    D = q.shape[-1]
    if a.op == "path":
        o = path_attn_triton(q, k, v, w, beta, g, cu_seqlens=cu)
    elif a.op == "fox":
        o = fox_attn_triton(q, k, v, g, D ** -0.5, cu, None)
    else:
        o = sb_attn_triton(q, k, v, D ** -0.5, cu, False, None)
    o.backward(torch.ones_like(o))


def _programs(grid, sample: int | None):
    ids = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    if sample is None or sample >= len(ids):
        return ids
    step = max(1, len(ids) // sample)
    return sorted(set(ids[::step][:sample - 1] + [ids[-1]]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=("path", "fox", "sba"), default="path")
    p.add_argument("--shape", default="1,2048,2,1,64", help="B,T,HQ,H,D")
    p.add_argument("--heads", default=None, help="HQ,H (overrides --shape's)")
    p.add_argument("--reflections", type=int, default=1)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--no-gates", dest="gates", action="store_false")
    p.add_argument("--lengths", default=None, help="packed sequence lengths, summing to T")
    p.add_argument("--capability", type=int, choices=(80, 90), default=90)
    p.add_argument("--sample", type=int, default=None, help="programs per launch")
    a = p.parse_args(argv)
    a.shape = [int(x) for x in a.shape.split(",")]
    if a.heads:
        a.shape[2:4] = [int(x) for x in a.heads.split(",")]
    a.lengths = [int(x) for x in a.lengths.split(",")] if a.lengths else None
    if a.lengths:
        if a.shape[0] != 1 or sum(a.lengths) != a.shape[1]:
            p.error(f"--lengths must sum to T = {a.shape[1]} with B = 1, got {a.lengths}")
    t0 = time.time()
    with record_launches(a.capability) as launches:
        _step(a)
    print(f"Triton {triton.__version__}, sm_{a.capability}, {a.op} {a.dtype} shape "
          f"{a.shape} R {a.reflections} gates {a.gates} lengths {a.lengths}: "
          f"{len(launches)} launches compiled in {time.time() - t0:.0f} s\n")
    print("| kernel | grid | programs | global | shared | outside | first outside | "
          "not evaluated |\n|---|---|---|---|---|---|---|---|")
    bad = 0
    for x in tqdm(launches, desc="emulating", file=sys.stderr):
        r = memcheck(x, _programs(x.grid, a.sample))
        first = f"{r.faults[0].loc} {r.faults[0].op} ({r.faults[0].space})" if r.faults else "-"
        unknown = ", ".join(sorted({loc for loc, _ in r.unknown})) or "-"
        bad += bool(r.faults or r.unknown)
        print(f"| {r.name} | {x.grid} | {r.programs} | {r.global_accesses} | "
              f"{r.shared_accesses} | {len(r.faults)} | {first} | {unknown} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
