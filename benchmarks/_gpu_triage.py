"""The `triage` section of gpu_check.py: every variant of the Triton PaTH kernels (head dim,
gates on / off, GQA group 1 / 2, dense / packed) once, at a small size with several
segments per sequence, each in its own process with CUDA_LAUNCH_BLOCKING=1.

A fault in one variant then costs only its own process (a CUDA error leaves the context
unusable), its traceback names the launch that faulted, and the other sections can skip
the variants that failed (`failed_variant`). With a failure, the smallest failing case is
run once more under compute-sanitizer's memcheck, which names the kernel, the source line
and the address of the first bad access. Each row also gives the relative errors of o and
of every gradient against the float64 op (`backend="torch"` on float64 copies).
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from _children import run_children

ROOT = Path(__file__).resolve().parents[1]
MARK = "GPU_CHECK_TRIAGE "
NAMES = ("o", "dq", "dk", "dv", "dw", "dbeta", "dg")


@dataclass(frozen=True)
class TriageCase:
    """q [B, T, HQ, D] with H key heads and HQ = H G; packed: B = 1 and the sequence
    lengths `lens` (sum T); block_size None: the op's default."""

    D: int
    gates: bool
    G: int
    packed: bool
    T: int
    lens: tuple[int, ...] = (1, 700, 1347)
    block_size: int | None = None
    H: int = 2
    rows: int | None = None  # rows of a segment product the backward reads at a time

    @property
    def name(self) -> str:
        name = (f"D{self.D}-{'gates' if self.gates else 'nogates'}-G{self.G}-"
                f"{'packed' if self.packed else 'dense'}")
        if self.block_size is not None:
            name += f"-BT{self.block_size}"
        if self.H != 2:
            name += f"-H{self.H}"
        if self.rows is not None:
            name += f"-E{self.rows}"
        return name if self.T in (1024, 2048, 64) else f"{name}-T{self.T}"

    @property
    def B(self) -> int:
        return 1 if self.packed else 2


def cases(mode: str) -> list[TriageCase]:
    """The variants of a mode: D 64 and 128 on a GPU (T = 1024 dense, 2048 packed: 4 to 6
    segments per sequence; D 64 only with --quick) and the extra cases below; on the CPU
    smoke run, two D 16 cases at T = 64 in 16-token blocks (two segments: the plumbing)."""
    if mode == "cpu-smoke":  # two processes: gates, no GQA, dense; no gates, GQA, packed
        return [TriageCase(16, True, 1, False, 64, block_size=16),
                TriageCase(16, False, 2, True, 64, (1, 10, 53), block_size=16)]
    dims = (64,) if mode == "quick" else (64, 128)
    grid = [TriageCase(D, gates, G, packed, 2048 if packed else 1024)
            for D in dims for gates in (True, False) for G in (1, 2) for packed in (False, True)]
    # to tell a block-length or segment-count cause apart: D 64 with 32-token blocks, and
    # one segment crossing fewer (T = 256: two segments, no multi-segment transition)
    # and head counts the JIT specializes (1, and 16: divisible by 16), as in the speed rows;
    # E32: the backward reading segment products 32 rows at a time through 0/1 selection
    # products, as at D 64 in the run that faulted (now whole 64-row products)
    # D 32: 64-token blocks whose products are 32 wide (m64n32 wgmma on an H100, beside
    # m64n64 in 8 of the 11 kernels); with 32-token blocks no kernel issues wgmma (mma.sync
    # only): if the first faults and the second does not, 32-token blocks are the fix there
    return grid + [TriageCase(32, True, 1, False, 1024),
                   TriageCase(32, True, 1, False, 1024, block_size=32),
                   TriageCase(64, False, 1, False, 512, H=16, rows=32),
                   TriageCase(64, True, 2, False, 1024, rows=32),
                   TriageCase(64, False, 1, False, 1024, block_size=32),
                   TriageCase(64, True, 2, False, 1024, block_size=32),
                   TriageCase(64, False, 1, False, 256),
                   TriageCase(64, True, 1, False, 512, H=16),
                   TriageCase(64, False, 1, False, 512, H=16),
                   TriageCase(64, False, 1, False, 512, H=1),
                   TriageCase(64, True, 2, False, 512, H=8)]


def failed_variant(sec: dict, D: int, gates: bool) -> bool:
    """Whether the triage rows `sec` hold a failure at head dim D with (or without) gates,
    whatever its GQA group, layout, head count or block length: a fault in one of them
    would end the process that times the others. Rows of a launch setting the op does not
    use (`TriageCase.rows`, kept to tell a cause apart) do not count."""
    return any(r.get("D") == D and r.get("gates") == gates and r.get("status") != "ok"
               and r.get("rows") is None for r in sec.get("rows", []))


def _case_by_name(mode: str, name: str) -> TriageCase:
    for c in cases(mode):
        if c.name == name:
            return c
    raise ValueError(f"no triage case {name!r} in mode {mode!r}")


def child(mode: str, name: str, device: str) -> int:
    """In a subprocess: the case's forward + backward on the Triton kernels (bf16) and on the
    float64 op; prints one MARK line of JSON (errors, or the failure and where it was)."""
    from _attn_gpu import path_inputs, rel_err, sync

    from pathattn import path_attn

    c = _case_by_name(mode, name)
    dev = torch.device(device)
    if c.rows is not None:
        from pathattn.ops.path.triton.config import LaunchConfig

        LaunchConfig.e_rows = lambda self, BD: min(BD, c.rows)
    out: dict = {}
    try:
        xs = path_inputs(c.B, c.T, c.H * c.G, c.H, c.D, torch.bfloat16, c.gates, dev)
        xs = [x for x in xs if x is not None]
        gen = torch.Generator(dev).manual_seed(1)
        dout = torch.randn(c.B, c.T, c.H * c.G, c.D, generator=gen, device=dev)
        cu = None
        if c.packed:
            cu = torch.tensor([0, *torch.tensor(c.lens).cumsum(0).tolist()], device=dev,
                              dtype=torch.int32)

        def run(backend, double):
            leaves = [(x.detach().double() if double else x.detach().clone()).requires_grad_()
                      for x in xs]
            o = path_attn(*leaves, cu_seqlens=cu, backend=backend, block_size=c.block_size)
            gr = torch.autograd.grad(o, leaves, dout.to(o.dtype), materialize_grads=True)
            sync(dev)
            return [o, *gr]

        out |= _layout(c, xs[0])
        t0 = time.perf_counter()
        got = run("triton", False)
        out["triton_s"] = time.perf_counter() - t0
        ref = run("torch", True)
        out |= {n: rel_err(a, b) for n, a, b in zip(NAMES, got, ref, strict=False)}
        out["finite"] = all(bool(torch.isfinite(x).all()) for x in got)
        out["status"] = "ok" if out["finite"] else "non-finite"
    except Exception as e:  # noqa: BLE001 - reported to the parent
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "pathattn" in f.filename]
        where = frames[-1] if frames else None
        out |= {"status": "error", "error": f"{type(e).__name__}: {e}"[:240],
                "where": f"{Path(where.filename).name}:{where.lineno} {where.line}"
                if where else ""}
    print(MARK + json.dumps(out), flush=True)
    return 0 if out["status"] == "ok" else 1


def _layout(c: TriageCase, q: torch.Tensor) -> dict:
    """The block length, blocks per segment and segments of the longest sequence that the
    Triton op picks for this case."""
    from pathattn.ops.path.triton.config import device_launch_config
    from pathattn.ops.path.triton.tables import default_seg

    cfg = device_launch_config(c.D, c.D, q.dtype, q.device, c.block_size)
    BT = cfg.BT
    n_max = -(-c.T // BT)  # the op's bound of a sequence's blocks (B = 1 when packed)
    seg = default_seg(n_max, cfg.seg_multiple())
    longest = max(c.lens) if c.packed else c.T
    return {"BT": BT, "seg": seg, "n_seg": math.ceil(math.ceil(longest / BT) / seg)}


def _cmd(mode: str, name: str) -> list[str]:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--child-triage", name]
    return cmd + {"full": [], "quick": ["--quick"], "cpu-smoke": ["--cpu-smoke"]}[mode]


def _parse(text: str) -> dict | None:
    found = [line for line in text.splitlines() if line.startswith(MARK)]
    return json.loads(found[-1][len(MARK):]) if found else None


def _run_all(ctx, todo: list[TriageCase], parallel: int, timeout: float) -> dict:
    """name -> result dict, `parallel` processes at a time, each with `timeout` seconds
    (less when the run's deadline is nearer)."""
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTHONFAULTHANDLER="1")
    limit = min(timeout, max(ctx.left() + 30, 1.0))
    done = run_children({c.name: _cmd(ctx.mode, c.name) for c in todo}, parallel, limit,
                        ROOT, env)
    results = {}
    for name, child in done.items():
        text = child.out + child.err
        res = _parse(text) or {"status": f"no result (exit {child.returncode}"
                               f"{', timeout' if child.timed_out else ''})",
                               "tail": text[-300:]}
        results[name] = res | {"seconds": child.seconds}
    return results


def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    hits = sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")
                  + glob.glob("/opt/nvidia/*/compute-sanitizer*/compute-sanitizer"))
    return hits[0] if hits else None


def _memcheck(ctx, sec: dict, name: str, timeout: float) -> None:
    tool = _sanitizer()
    if tool is None:
        sec.setdefault("info", {})["memcheck"] = "n/a: compute-sanitizer not found"
        return
    cmd = [tool, "--tool", "memcheck", "--print-limit", "4", "--show-backtrace", "device",
           *_cmd(ctx.mode, name)]
    # every tensor its own allocation: an access past a tensor is then past an allocation
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=max(10.0, min(timeout, ctx.left())))
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        text = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
                else (e.stdout or "")) + "\n[timeout]"
    keep = [line for line in text.splitlines() if not line.startswith(MARK)]
    sec.setdefault("text", {})[f"memcheck {name} ({time.time() - t0:.0f} s)"] = \
        "\n".join(keep[:120])


def triage(ctx, sec: dict) -> None:
    todo = cases(ctx.mode)
    parallel = 1 if ctx.device.type == "cpu" else 6
    results = _run_all(ctx, todo, parallel, timeout=150.0)
    for c in todo:
        ctx.add_row(sec, {"case": c.name, "D": c.D, "gates": c.gates, "G": c.G, "H": c.H,
                          "B": c.B, "T": c.T, "rows": c.rows} | results[c.name])
    failed = [c for c in todo if results[c.name].get("status") != "ok"]
    if failed and ctx.device.type == "cuda" and ctx.left() > 30:
        small = min(failed, key=lambda c: (c.rows is not None, c.D, c.T, c.G))
        _memcheck(ctx, sec, small.name, timeout=180.0)
