"""The sections of `gpu_check.py` (see there), their sizes per mode (`PLANS`) and the report
they write (`Report`: gpu_check.json and gpu_check.md, rewritten after every row).

Every section is a function (ctx, sec) that appends rows to sec["rows"] through
`Context.add_row`; `run` guards each one and skips those left after the deadline.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from _attn_gpu import (
    candidates,
    fla_kernel,
    free,
    grads,
    path_inputs,
    peak_mib,
    rel_err,
    sync,
    time_ms,
)
from _children import run_children
from _env import system_info
from _gpu_fox import fox_kernels
from _gpu_launch import child as launch_child
from _gpu_launch import launch_settings
from _gpu_lm import generate, lm_commands
from _gpu_pipe import pipelining
from _gpu_sba import sba_kernels
from _gpu_triage import child as triage_child
from _gpu_triage import failed_variant, triage
from torch.nn.attention import SDPBackend

from pathattn import path_attn
from pathattn.ops import path_attn_naive
from pathattn.ops.path.backends import select_backend
from pathattn.utils.io import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OUTPUTS = ("o", "dq", "dk", "dv", "dw", "dbeta", "dg")
CHILD_MARK = "GPU_CHECK_CHILD "
F32_TOL = 1e-4  # float32: every relative error below this
LOW_FACTOR, LOW_SLACK = 2.0, 1e-5  # 16-bit: at most 2x plain PyTorch's error + 1e-5


@dataclass(frozen=True)
class Case:
    """A correctness input: q [B, T, HQ, D], k / v / w with H heads, R reflections per
    token, packed sequences `cu` (B = 1) or None, gates on or off; run in each of
    `dtypes`."""

    name: str
    dtypes: tuple[str, ...]
    B: int
    T: int
    HQ: int
    H: int
    D: int
    R: int = 1
    cu: tuple[int, ...] | None = None
    gates: bool = True


@dataclass(frozen=True)
class Plan:
    """Sizes of every section. first_call: (B, T, HQ, H, D), the first case's heads and
    head dim (its kernels are then compiled once); profile: (B, T, H, D). Speed: T in
    seq_lens with B = tokens // T, H heads, D in dims, gates on and off."""

    device: str
    first_call: tuple[int, int, int, int, int]
    first_call_timeout: float
    first_call_dtypes: tuple[str, ...]
    cases: tuple[Case, ...]
    seq_lens: tuple[int, ...]
    tokens: int
    heads: int
    dims: tuple[int, ...]
    repeats: int
    warmup: int
    profile: tuple[int, int, int, int]
    lm_preset: str
    lm_seq_len: int
    lm_batch: int
    lm_types: tuple[str, ...]
    lm_warmup: int
    lm_steps: int


ALL3 = ("bf16", "fp16", "fp32")
LM_TYPES = ("rope", "path", "path_fox", "fox", "sba")
FULL = Plan(
    device="cuda", first_call=(1, 256, 4, 2, 64), first_call_timeout=120.0,
    first_call_dtypes=ALL3,
    cases=(Case("D64-GQA-packed", ALL3, 1, 1024, 4, 2, 64, cu=(0, 317, 318, 800, 1024)),
           Case("D128-GQA", ALL3, 2, 512, 4, 2, 128),
           Case("D256-GQA-packed", ("bf16", "fp32"), 1, 512, 4, 2, 256, cu=(0, 200, 512)),
           Case("R2-D64-GQA-packed", ("bf16", "fp32"), 1, 768, 4, 2, 64, R=2,
                cu=(0, 1, 400, 768)),
           Case("D64-dense-nogates", ("bf16", "fp32"), 2, 1024, 2, 2, 64, gates=False)),
    seq_lens=(2048, 8192, 16384), tokens=32768, heads=16, dims=(64, 128), repeats=10,
    warmup=2, profile=(4, 8192, 16, 64), lm_preset="760m", lm_seq_len=4096, lm_batch=2,
    lm_types=LM_TYPES, lm_warmup=2, lm_steps=3)
QUICK = replace(
    FULL, cases=(replace(FULL.cases[0], dtypes=("bf16", "fp32")),
                 replace(FULL.cases[3], dtypes=("bf16",))),
    seq_lens=(8192,), dims=(64,), repeats=5, lm_types=("rope", "path", "path_fox"), lm_steps=2)
SMOKE = Plan(
    device="cpu", first_call=(1, 16, 2, 1, 16), first_call_timeout=120.0,
    first_call_dtypes=("fp32",),
    cases=(Case("D16-GQA-packed", ("bf16", "fp32"), 1, 24, 2, 1, 16, cu=(0, 1, 10, 24)),
           Case("R2-D16", ("fp32",), 2, 12, 2, 1, 16, R=2),
           Case("D16-dense-nogates", ("bf16",), 2, 40, 2, 2, 16, gates=False)),
    seq_lens=(16,), tokens=32, heads=2, dims=(16,), repeats=1, warmup=1,
    profile=(1, 16, 2, 16), lm_preset="tiny", lm_seq_len=32, lm_batch=2, lm_types=LM_TYPES,
    lm_warmup=1, lm_steps=1)
PLANS = {"full": FULL, "quick": QUICK, "cpu-smoke": SMOKE}


# ----------------------------------------------------------------------------- report

def _clean(x):
    """JSON-safe: non-finite floats as strings, tuples as lists, other objects as str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return str(x)


def _cell(x) -> str:
    if isinstance(x, float):
        return f"{x:.2e}" if x != 0 and abs(x) < 1e-2 else f"{x:.4g}"
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(rows: list[dict]) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return lines + ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]


class Report:
    """The run's results: meta plus one dict per section (status, seconds, rows, info,
    text, error), written as JSON and markdown by `save`."""

    def __init__(self, out: Path, meta: dict, names: list[str]):
        self.out = out
        self.data = {"meta": meta, "sections": {n: {"status": "pending"} for n in names}}
        out.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        atomic_write_json(self.out / "gpu_check.json", _clean(self.data), indent=1)
        atomic_write_text(self.out / "gpu_check.md", self.markdown())

    def markdown(self) -> str:
        meta = self.data["meta"]
        lines = [f"# gpu_check {meta.get('label') or ''}".rstrip(), ""]
        lines += [f"- {k}: {_cell(v)}" for k, v in meta.items()]
        for name, sec in self.data["sections"].items():
            head = f"## {name}: {sec['status']}"
            if "seconds" in sec:
                head += f" ({sec['seconds']:.1f} s)"
            lines += ["", head, ""]
            if sec.get("error"):
                lines += [f"error: `{_cell(sec['error'])}`", ""]
            if sec.get("info"):
                lines += _table([{"key": k, "value": v} for k, v in sec["info"].items()])
            if sec.get("rows"):
                lines += _table(sec["rows"])
            for title, text in sec.get("text", {}).items():
                lines += ["", f"{title}:", "", "```", text.rstrip(), "```"]
        return "\n".join(lines) + "\n"


@dataclass
class Context:
    plan: Plan
    mode: str
    device: torch.device
    deadline: float
    start: float
    report: Report

    def left(self) -> float:
        return self.deadline - time.time()

    def expired(self) -> bool:
        return self.left() <= 0

    def add_row(self, sec: dict, row: dict) -> None:
        sec.setdefault("rows", []).append(row)
        self.report.save()
        log(self, "  " + ", ".join(f"{k}={_cell(v)}" for k, v in row.items()))

    @property
    def sdpa_backend(self) -> SDPBackend:
        return SDPBackend.FLASH_ATTENTION if self.device.type == "cuda" else SDPBackend.MATH


def log(ctx: Context, text: str) -> None:
    print(f"[gpu_check {time.time() - ctx.start:6.1f}s] {text}", flush=True)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


# ------------------------------------------------------------------------ environment

def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*cmd: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _ptxas() -> str:
    """The ptxas Triton compiles this device's kernels with (version, and the
    register-allocation flags it passes), to match compile-time figures
    (`benchmarks/triton_fit.py`) with this run's; "n/a: <why>" where none can be read."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        from pathattn.ops.path.triton.fit import ptxas_flags

        major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 9
        version = get_ptxas(major * 10).version
        return f"{version} {' '.join(ptxas_flags())}".strip()
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        return f"n/a: {_short(e)}"


def environment(ctx: Context, sec: dict) -> None:
    info = dict(system_info())
    info |= {"device": str(ctx.device), "cuda": torch.version.cuda,
             "triton": _version("triton"), "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
             "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")}
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        info |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                 "sms": props.multi_processor_count,
                 "memory_gib": round(props.total_memory / 2**30, 1)}
    info["ptxas"] = _ptxas()
    fla, why = fla_kernel()
    info["fla"] = (_version("fla-core") or "installed") if fla is not None else f"n/a: {why}"
    rev = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    info["pathattn_rev"] = rev or "n/a (no git repository here)"
    info["pathattn_changed_files"] = None if status is None else len(status.splitlines())
    sec["info"] = info


# ------------------------------------------------------------------------- first call

def child_first_call(args) -> int:
    """In a subprocess: time the first and the second forward + backward of path_attn
    (backend="triton") in one dtype at the plan's small shape; print them as JSON."""
    plan = PLANS[_mode(args)]
    device = torch.device(plan.device)
    B, T, HQ, H, D = plan.first_call
    t0 = time.perf_counter()
    xs = path_inputs(B, T, HQ, H, D, DTYPES[args.child_first_call], True, device)
    dout = torch.randn(B, T, HQ, D, device=device, dtype=xs[0].dtype)
    sync(device)
    times = [time.perf_counter() - t0]  # inputs, and the device's start on a GPU
    for _ in range(2):
        t1 = time.perf_counter()
        torch.autograd.grad(path_attn(*xs, backend="triton"), xs, dout)
        sync(device)
        times.append(time.perf_counter() - t1)
    from pathattn.ops.common.triton_launch import compile_ahead_status

    row = dict(zip(("setup_s", "first_s", "second_s"), times, strict=True))
    status = compile_ahead_status()  # did the first call compile its kernels side by side?
    row |= {"compiled_ahead": status["keys"], "compile_ahead_error": status["error"]}
    print(CHILD_MARK + json.dumps(row), flush=True)
    return 0


def first_call(ctx: Context, sec: dict) -> None:
    """The plan's dtypes at once, each in its own process, the CPUs shared among them: each
    compiles its kernels on PATHATTN_COMPILE_THREADS threads (the row's compile_threads;
    a user's single process gets every CPU)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")]
    cmd += {"full": [], "quick": ["--quick"], "cpu-smoke": ["--cpu-smoke"]}[ctx.mode]
    limit = min(ctx.plan.first_call_timeout, max(ctx.left(), 1.0))
    dtypes = ctx.plan.first_call_dtypes
    threads = os.environ.get("PATHATTN_COMPILE_THREADS") or str(
        max(2, (os.cpu_count() or 1) // len(dtypes)))
    done = run_children({dt: cmd + ["--child-first-call", dt] for dt in dtypes},
                        len(dtypes), limit, ROOT,
                        env={**os.environ, "PATHATTN_COMPILE_THREADS": threads})
    for dt in dtypes:  # in the plan's order
        child = done[dt]
        row = {"dtype": dt, "compile_threads": int(threads), "process_s": child.seconds}
        if child.timed_out:
            row |= {"status": "timeout", "limit_s": limit}
        found = [line for line in child.out.splitlines() if line.startswith(CHILD_MARK)]
        if found:
            row |= {"status": "ok"} | json.loads(found[-1][len(CHILD_MARK):])
        elif "status" not in row:
            row |= {"status": f"error (exit {child.returncode})", "stderr": child.err[-400:]}
        ctx.add_row(sec, row)


# ------------------------------------------------------------------------ correctness

def _case_rows(ctx: Context, case: Case, dt: str) -> list[dict]:
    dtype, dev = DTYPES[dt], ctx.device
    xs = path_inputs(case.B, case.T, case.HQ, case.H, case.D, torch.float32, case.gates, dev,
                     case.R)
    # all in dtype: plain PyTorch's inputs; g = None (no gates) is passed on as None
    xs = tuple(None if x is None else x.detach().to(dtype) for x in xs)
    gen = torch.Generator(dev).manual_seed(1)
    dout = torch.randn(case.B, case.T, case.HQ, case.D, generator=gen, device=dev).to(dtype)
    cu = None if case.cu is None else torch.tensor(case.cu, dtype=torch.int32, device=dev)
    n_in = 5 if xs[5] is None else 6

    def op(backend):
        return lambda *a: path_attn(*a[:5], g=a[5] if n_in == 6 else None, cu_seqlens=cu,
                                    backend=backend)

    def plain(*a):
        return path_attn_naive(*a[:5], g=a[5] if n_in == 6 else None, cu_seqlens=cu,
                               dtype=None)

    xs = xs[:n_in]
    ref = grads(op("torch"), tuple(x.double() for x in xs), dout.double())
    impls = {"triton": op("triton"), "plain": plain, "torch": op("torch"), "fla": op("fla")}
    if dtype == torch.float32:  # the float32 rule is absolute: plain's error is not needed
        del impls["plain"]
    rows, errs = [], {}
    for impl, fn in impls.items():
        row = {"case": case.name, "dtype": dt, "impl": impl}
        try:
            if impl == "fla":
                select_backend("fla", xs[0], case.R)  # ValueError: why fla cannot run it
        except ValueError as e:
            rows.append(row | {"status": f"n/a: {e}"})
            continue
        try:
            got = grads(fn, xs, dout)
            sync(dev)
        except Exception as e:  # noqa: BLE001 - recorded, the next implementation runs
            rows.append(row | {"status": "error", "error": _short(e)})
            continue
        errs[impl] = [rel_err(a, b) for a, b in zip(got, ref, strict=True)]
        rows.append(row | dict(zip(OUTPUTS, errs[impl], strict=False)))  # no dg: no gates
    plain = errs.get("plain")
    for row in rows:
        e = errs.get(row["impl"])
        if row["impl"] not in ("triton", "fla") or e is None:
            continue
        if dtype == torch.float32:
            row["ok"] = all(a <= F32_TOL for a in e)
        elif plain is not None:
            row["worst_vs_plain"] = max(a / max(b, 1e-30) for a, b in zip(e, plain, strict=True))
            row["ok"] = all(a <= LOW_FACTOR * b + LOW_SLACK for a, b in zip(e, plain,
                                                                            strict=True))
    return rows


def correctness(ctx: Context, sec: dict) -> None:
    for case in ctx.plan.cases:
        for dt in case.dtypes:
            if ctx.expired():
                ctx.add_row(sec, {"case": case.name, "dtype": dt, "status": "skipped (budget)"})
                continue
            try:
                rows = _case_rows(ctx, case, dt)
            except Exception as e:  # noqa: BLE001 - e.g. the float64 reference failed
                rows = [{"case": case.name, "dtype": dt, "status": "error", "error": _short(e)}]
            for row in rows:
                ctx.add_row(sec, row)
            free(ctx.device)


# ------------------------------------------------------------------------------ speed

def _measure(ctx: Context, name: str, cand) -> dict:
    dev, plan = ctx.device, ctx.plan
    try:
        return {f"{name}_fwd_ms": time_ms(cand.fwd, plan.repeats, dev, plan.warmup),
                f"{name}_fwdbwd_ms": time_ms(cand.fwd_bwd, plan.repeats, dev, plan.warmup),
                f"{name}_peak_mib": peak_mib(cand.fwd_bwd, dev)}
    except Exception as e:  # noqa: BLE001 - recorded in the row
        free(dev)
        return {f"{name}_fwd_ms": "error", f"{name}_error": _short(e)}


def speed(ctx: Context, sec: dict) -> None:
    plan, dev = ctx.plan, ctx.device
    fla, why = fla_kernel()
    if fla is None:
        sec["info"] = {"fla": f"n/a: {why}"}
    sdpa_done: dict[tuple[int, int], dict] = {}  # (T, D) -> sdpa's columns (no gates)
    for D in plan.dims:
        for gates in (True, False):
            for T in plan.seq_lens:
                B = max(1, plan.tokens // T)
                row = {"T": T, "B": B, "H": plan.heads, "D": D, "gates": gates}
                if ctx.expired():
                    ctx.add_row(sec, row | {"status": "skipped (budget)"})
                    continue
                names = ("fla", "path") if (T, D) in sdpa_done else ("sdpa", "fla", "path")
                if failed_variant(ctx.report.data["sections"]["triage"], D, gates):
                    # a fault would leave this process's CUDA context unusable
                    names = tuple(n for n in names if n != "path")
                    row["path_fwd_ms"] = "skipped (failed in triage)"
                try:
                    cands = candidates(B, T, plan.heads, D, torch.bfloat16, gates, dev, fla,
                                       names, ctx.sdpa_backend)
                except Exception as e:  # noqa: BLE001 - e.g. out of memory
                    ctx.add_row(sec, row | {"status": "error", "error": _short(e)})
                    free(dev)
                    continue
                for name in ("path", "sdpa", "fla"):  # fla last: its first calls autotune
                    if name == "sdpa" and (T, D) in sdpa_done:
                        row |= sdpa_done[(T, D)]
                    elif name in cands:
                        row |= _measure(ctx, name, cands[name])
                    else:
                        row.setdefault(f"{name}_fwd_ms", "n/a")
                sdpa_done.setdefault((T, D), {k: v for k, v in row.items() if "sdpa" in k})
                for base in ("fla", "sdpa"):
                    for m in ("fwd", "fwdbwd"):
                        a, b = row.get(f"path_{m}_ms"), row.get(f"{base}_{m}_ms")
                        if isinstance(a, float) and isinstance(b, float):
                            row[f"ours/{base}_{m}"] = a / b
                del cands
                free(dev)
                ctx.add_row(sec, row)


# ---------------------------------------------------------------------------- profile

def profile(ctx: Context, sec: dict) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    B, T, H, D = ctx.plan.profile
    cuda = ctx.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    fla, why = fla_kernel()
    sec["text"] = {}
    for name in ("path", "fla"):
        row = {"impl": name, "B": B, "T": T, "H": H, "D": D}
        if name == "fla" and fla is None:
            ctx.add_row(sec, row | {"status": f"n/a: {why}"})
            continue
        if ctx.expired():
            ctx.add_row(sec, row | {"status": "skipped (budget)"})
            continue
        if name == "path" and failed_variant(ctx.report.data["sections"]["triage"], D, True):
            ctx.add_row(sec, row | {"status": "skipped (failed in triage)"})
            continue
        cand = candidates(B, T, H, D, torch.bfloat16, True, ctx.device, fla, (name,))[name]
        for _ in range(ctx.plan.warmup):
            cand.fwd_bwd()
        sync(ctx.device)
        with torch_profile(activities=activities) as prof:
            cand.fwd_bwd()
            sync(ctx.device)
        events = prof.key_averages()
        sec["text"][f"{name} (top 15 by {key})"] = events.table(sort_by=key, row_limit=15)
        total = sum(getattr(e, key, 0.0) for e in events) / 1e3
        ctx.add_row(sec, row | {"status": "ok", "self_ms_total": total, "events": len(events)})
        del cand
        free(ctx.device)


# ---------------------------------------------------------------------------- lm_step

def _lm_row(ctx: Context, attn: str) -> dict:
    from pathattn.models import ModelConfig, PaTHLM

    plan, dev = ctx.plan, ctx.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    cfg = ModelConfig.preset(plan.lm_preset, attn_type=attn)
    torch.manual_seed(0)
    with dev:
        model = PaTHLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(dev).manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (plan.lm_batch, plan.lm_seq_len + 1),
                        generator=gen, device=dev)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            _, loss = model(ids[:, :-1], labels=ids[:, 1:])
        loss.backward()
        opt.step()
        sync(dev)
        return time.perf_counter() - t0

    warm = [step() for _ in range(plan.lm_warmup)]
    times = [step() for _ in range(plan.lm_steps)]
    row = {"attn": attn, "params_m": model.num_parameters() / 1e6, "first_step_s": warm[0],
           "step_s": statistics.median(times),
           "tokens_per_s": plan.lm_batch * plan.lm_seq_len / statistics.median(times)}
    if dev.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return row


def _lm_variant_failed(ctx: Context, attn: str) -> bool:
    """Whether triage saw the PaTH kernels fail at this model's head dim, with gates for
    path_fox and without for path."""
    from pathattn.models import ModelConfig

    cfg = ModelConfig.preset(ctx.plan.lm_preset, attn_type=attn)
    return failed_variant(ctx.report.data["sections"]["triage"], cfg.head_size,
                          attn == "path_fox")


def lm_step(ctx: Context, sec: dict) -> None:
    plan = ctx.plan
    sec["info"] = {"preset": plan.lm_preset, "T": plan.lm_seq_len, "B": plan.lm_batch,
                   "autocast": "bfloat16", "optimizer": "AdamW(fused=True)",
                   "timed_steps": plan.lm_steps, "warmup_steps": plan.lm_warmup}
    base = None
    for attn in plan.lm_types:
        if ctx.expired():
            ctx.add_row(sec, {"attn": attn, "status": "skipped (budget)"})
            continue
        if attn in ("path", "path_fox") and _lm_variant_failed(ctx, attn):
            ctx.add_row(sec, {"attn": attn, "status": "skipped (its kernels failed in triage)"})
            continue
        try:
            row = _lm_row(ctx, attn) | {"status": "ok"}
        except torch.cuda.OutOfMemoryError as e:
            row = {"attn": attn, "status": "out of memory", "error": _short(e)}
        except Exception as e:  # noqa: BLE001 - recorded, the next type runs
            row = {"attn": attn, "status": "error", "error": _short(e)}
        free(ctx.device)
        if attn == "rope" and "step_s" in row:
            base = row["step_s"]
        if base is not None and "step_s" in row:
            row["vs_rope"] = row["step_s"] / base
        ctx.add_row(sec, row)


# -------------------------------------------------------------------------------- run

SECTIONS = {"environment": environment, "first_call": first_call, "triage": triage,
            "speed": speed, "pipelining": pipelining, "lm_step": lm_step, "profile": profile,
            "correctness": correctness,
            "fox_kernels": fox_kernels, "sba_kernels": sba_kernels, "generate": generate,
            "launch_settings": launch_settings, "lm_commands": lm_commands}


def child_triage(args) -> int:
    """In a subprocess: one case of the triage section (`_gpu_triage.child`)."""
    mode = _mode(args)
    return triage_child(mode, args.child_triage, PLANS[mode].device)


def child_launch(args) -> int:
    """In a subprocess: one row of the launch_settings section (`_gpu_launch.child`)."""
    mode = _mode(args)
    return launch_child(mode, PLANS[mode], args.child_launch)


def _mode(args) -> str:
    return "cpu-smoke" if args.cpu_smoke else "quick" if args.quick else "full"


def run(args, start: float) -> int:
    """Every section in order under the deadline; returns 0 (a section's failure is in the
    report), 1 when the device is missing."""
    mode = _mode(args)
    plan = PLANS[mode]
    unknown = set(args.sections or ()) - set(SECTIONS)
    if unknown:
        print(f"unknown sections {sorted(unknown)}; sections: {list(SECTIONS)}", file=sys.stderr)
        return 2
    if plan.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check.py needs a CUDA device (or --cpu-smoke)", file=sys.stderr)
        return 1
    meta = {"label": args.label, "mode": mode, "budget_s": args.budget,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "finished": False}
    report = Report(args.out, meta, list(SECTIONS))
    ctx = Context(plan, mode, torch.device(plan.device), start + args.budget, start, report)
    report.save()
    for name, section in SECTIONS.items():
        sec = report.data["sections"][name]
        if args.sections is not None and name not in args.sections:
            sec["status"] = "skipped (not asked)"
            continue
        if ctx.expired():
            sec["status"] = "skipped (budget)"
            log(ctx, f"{name}: skipped (budget)")
            continue
        log(ctx, f"{name} ...")
        sec["status"] = "running"
        report.save()
        t0 = time.time()
        try:
            section(ctx, sec)
            sec["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded, the next section runs
            sec |= {"status": "error", "error": _short(e),
                    "traceback": traceback.format_exc()[-3000:]}
            free(ctx.device)
        sec["seconds"] = time.time() - t0
        meta["elapsed_s"] = time.time() - start
        report.save()
        log(ctx, f"{name}: {sec['status']} in {sec['seconds']:.1f} s")
    meta["finished"] = True
    report.save()
    log(ctx, f"done: {args.out}")
    return 0
