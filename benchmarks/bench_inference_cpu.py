"""CPU timing of PaTH inference (`path_attn_step`, `path_attn_prefill`) against baselines.

Two comparisons, each side by side in one process (B=1, H=HQ heads, head dim D, float32):

* decode: consecutive one-token steps starting at context --context. Candidates:
    sdpa        plain attention decode step: write k and v into a preallocated cache, then
                scaled_dot_product_attention of the new query against it (flash backend);
    path        path_attn_step with the default pending window (PaTHCache);
    path_rank1  path_attn_step with max_pending_tokens = 1, the paper's per-token rank-1
                update of every cached key (shown for reference).
  The candidates alternate step by step (rotating order), each on its own cache, so every
  one sees the same context lengths and the same machine phases. Minimum, median and mean
  per step are reported; the mean includes the periodic commits of the pending window.
* prefill: path_attn_prefill against path_attn (forward, torch.no_grad()) on the same
  prompt of --prefill-len tokens; warmed up once, then interleaved repetitions.

Ratios are candidate / baseline of the minima, with the ratio of the medians in parentheses.
Goals: decode <= 1.5x sdpa, prefill <= 1.2x path_attn. Results also go to
--out/bench_inference_cpu.json (config, system info, every raw time in ms).

    python benchmarks/bench_inference_cpu.py               # context 4096, prefill 8192
    python benchmarks/bench_inference_cpu.py --quick       # smoke test (seconds)
    python benchmarks/bench_inference_cpu.py --threads 1   # robust on a shared machine
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _env import load_average, system_info  # benchmarks/ is on sys.path
from torch.nn.attention import SDPBackend, sdpa_kernel

from pathattn import path_attn, path_attn_prefill, path_attn_step

OUT_NAME = "bench_inference_cpu"
GOALS = {"decode": ("sdpa", 1.5), "prefill": ("path_attn", 1.2)}


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=None,
                   help="context length T before the first decode step (default 4096)")
    p.add_argument("--steps", type=int, default=None,
                   help="consecutive decode steps timed per candidate (default 512)")
    p.add_argument("--prefill-len", type=int, default=None,
                   help="prompt length of the prefill comparison (default 8192)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed prefill repetitions per candidate (default 5)")
    p.add_argument("--heads", type=int, default=8, help="heads H = HQ (default 8)")
    p.add_argument("--dim", type=int, default=64, help="head dim D = Dv (default 64)")
    p.add_argument("--gates", action="store_true",
                   help="PaTH-FoX: give the PaTH candidates forget gates g")
    p.add_argument("--only", choices=("decode", "prefill"), default=None,
                   help="run only one of the two comparisons")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: context 1024, 64 steps, prefill 2048, 2 repeats")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads before timing (default: torch's default)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"),
                   help="directory for the JSON results (default benchmarks/out)")
    args = p.parse_args(argv)
    defaults = {"context": (4096, 1024), "steps": (512, 64), "prefill_len": (8192, 2048),
                "repeats": (5, 2)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


# ----------------------------------------------------------------------------- environment








# ----------------------------------------------------------------------------- inputs


def make_inputs(T: int, H: int, D: int, gates: bool, gen: torch.Generator) -> dict:
    """PaTH inputs in the op's [B, T, H, D] layout (B = 1, HQ = H)."""
    x = {"q": torch.randn(1, T, H, D, generator=gen),
         "k": torch.randn(1, T, H, D, generator=gen),
         "v": torch.randn(1, T, H, D, generator=gen),
         "w": F.normalize(torch.randn(1, T, H, D, generator=gen), dim=-1),
         "beta": 2 * torch.rand(1, T, H, generator=gen),
         "g": F.logsigmoid(torch.randn(1, T, H, generator=gen) + 3) if gates else None}
    return x


def token(x: dict, i: int) -> dict:
    """Position i of every input, as a one-token step ([1, 1, ...])."""
    return {n: None if t is None else t[:, i: i + 1] for n, t in x.items()}


# ----------------------------------------------------------------------------- decode


class SdpaDecoder:
    """Plain attention decode: preallocated [1, H, T_max, D] caches, append, then SDPA."""

    name = "sdpa"

    def __init__(self, prompt: dict, capacity: int):
        _, T, H, D = prompt["k"].shape
        self.k = torch.zeros(1, H, capacity, D)
        self.v = torch.zeros(1, H, capacity, D)
        self.k[:, :, :T] = prompt["k"].transpose(1, 2)
        self.v[:, :, :T] = prompt["v"].transpose(1, 2)
        self.len = T

    def prepare(self, tok: dict) -> tuple:
        """Inputs in SDPA's [B, H, 1, D] layout (converted outside the timed region)."""
        return tuple(tok[n].transpose(1, 2).contiguous() for n in ("q", "k", "v"))

    def step(self, args: tuple) -> None:
        q, k, v = args
        T = self.len
        self.k[:, :, T: T + 1] = k
        self.v[:, :, T: T + 1] = v
        self.len = T + 1
        F.scaled_dot_product_attention(q, self.k[:, :, : T + 1], self.v[:, :, : T + 1])


class PathDecoder:
    """path_attn_step on a cache from path_attn_prefill (prefill not timed)."""

    def __init__(self, name: str, prompt: dict, window: int | None):
        self.name = name
        with torch.no_grad():
            _, self.state = path_attn_prefill(**prompt)
        if window is not None:
            self.state.max_pending_tokens = window

    def prepare(self, tok: dict) -> dict:
        return tok

    def step(self, args: dict) -> None:
        path_attn_step(**args, state=self.state)


def bench_decode(args: argparse.Namespace, gen: torch.Generator) -> dict:
    T, N = args.context, args.steps
    prompt = make_inputs(T, args.heads, args.dim, args.gates, gen)
    new = make_inputs(N + 1, args.heads, args.dim, args.gates, gen)
    plain = {n: prompt[n] for n in ("q", "k", "v")}
    cands = [SdpaDecoder(plain, T + N + 1), PathDecoder("path", prompt, None),
             PathDecoder("path_rank1", prompt, 1)]
    times: dict[str, list[float]] = {c.name: [] for c in cands}
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for c in cands:  # warm-up step (not timed)
            c.step(c.prepare(token(new, 0)))
        for i in range(1, N + 1):
            order = cands[i % len(cands):] + cands[: i % len(cands)]
            for c in order:
                a = c.prepare(token(new, i))
                times[c.name].append(timed(lambda c=c, a=a: c.step(a)))
    return {"context": T, "steps": N, "window": cands[1].state.max_pending_tokens,
            "times_ms": times, "summary": summarize(times)}


# ----------------------------------------------------------------------------- prefill


def bench_prefill(args: argparse.Namespace, gen: torch.Generator) -> dict:
    x = make_inputs(args.prefill_len, args.heads, args.dim, args.gates, gen)
    fns: dict[str, Callable[[], object]] = {
        "path_attn": lambda: path_attn(**x),
        "path_attn_prefill": lambda: path_attn_prefill(**x),
    }
    times: dict[str, list[float]] = {n: [] for n in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for _ in range(args.repeats):
            for name, fn in fns.items():
                gc.collect()
                times[name].append(timed(fn))
    return {"T": args.prefill_len, "repeats": args.repeats, "times_ms": times,
            "summary": summarize(times)}


# ----------------------------------------------------------------------------- timing


def timed(fn: Callable[[], object]) -> float:
    """Milliseconds of one call."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {n: {"min": min(t), "median": statistics.median(t), "mean": statistics.fmean(t),
                "max": max(t)} for n, t in times.items()}


def print_table(title: str, rec: dict, baseline: str, goal: float) -> None:
    s = rec["summary"]
    print(f"\n{title}")
    head = f"{'candidate':>18} | {'min ms':>8} | {'median ms':>9} | {'mean ms':>8} | " \
           f"{'max ms':>8} | ratio (min, median in parens; mean)"
    print(head)
    print("-" * len(head))
    for name, st in s.items():
        b = s[baseline]
        ratio = "baseline" if name == baseline else (
            f"{st['min'] / b['min']:.2f}x (med {st['median'] / b['median']:.2f}x; "
            f"mean {st['mean'] / b['mean']:.2f}x)")
        print(f"{name:>18} | {st['min']:8.3f} | {st['median']:9.3f} | {st['mean']:8.3f} | "
              f"{st['max']:8.3f} | {ratio}")
    print(f"goal: <= {goal:g}x {baseline}")


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = system_info()
    print(f"torch {info['torch']} | threads {info['threads']} | CPU: {info['cpu']} | "
          f"load {info['loadavg_start']}")
    print(f"B=1 H=HQ={args.heads} D={args.dim} float32 | gates={args.gates}")
    gen = torch.Generator().manual_seed(args.seed)
    results = {}
    if args.only in (None, "decode"):
        t0 = time.perf_counter()
        results["decode"] = bench_decode(args, gen)
        rec = results["decode"]
        print_table(f"decode: {rec['steps']} one-token steps from context {rec['context']} "
                    f"(pending window {rec['window']}; {time.perf_counter() - t0:.1f} s)",
                    rec, *GOALS["decode"])
    if args.only in (None, "prefill"):
        t0 = time.perf_counter()
        results["prefill"] = bench_prefill(args, gen)
        rec = results["prefill"]
        print_table(f"prefill: T={rec['T']}, {rec['repeats']} repeats "
                    f"({time.perf_counter() - t0:.1f} s)", rec, *GOALS["prefill"])
    info["loadavg_end"] = load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{OUT_NAME}.json"
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path.write_text(json.dumps({"system": info, "config": cfg, "results": results}, indent=2))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
