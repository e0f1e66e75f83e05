"""CPU timing of `pathattn.path_attn` against causal `scaled_dot_product_attention`.

Both ops run on the same shapes in one process: B=1, H heads (HQ = H), head dim D, causal,
float32. Two modes are timed:

* fwd:     forward only, under torch.no_grad();
* fwd+bwd: forward plus backward with a fixed random output gradient (grads are cleared
           between repetitions, outside the timed region).

SDPA gets its inputs in its own [B, H, T, D] layout, converted (and made contiguous) before
timing, and is pinned to the flash backend so it never silently falls back to the T x T math
path. The VM this runs on is noisy, so every function is warmed up once, the candidates are
interleaved repetition by repetition (sdpa, path, sdpa, path, ...) and both the minimum and
the median over repetitions are reported. Ratios (path / sdpa) use the minima; median ratios
are shown next to them.

Outputs: a table on stdout, plus a JSON file with all raw times and a PNG plot in --out.

    python benchmarks/bench_path_attn_cpu.py            # T = 1024 ... 8192 (several minutes)
    python benchmarks/bench_path_attn_cpu.py --quick    # smoke test, T = 256, 512
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _env import load_average, system_info  # benchmarks/ is on sys.path
from torch.nn.attention import SDPBackend, sdpa_kernel

from pathattn import path_attn
from pathattn.ops.path.cpu import load_kernels

DEFAULT_SEQ_LENS = (1024, 2048, 4096, 8192)
QUICK_SEQ_LENS = (256, 512)
MODES = ("fwd", "fwd_bwd")
MODE_LABELS = {"fwd": "fwd", "fwd_bwd": "fwd+bwd"}
GOAL = 1.3  # target path / sdpa ratio of both modes, drawn on the plot
BASELINE = "sdpa"
OUT_NAME = "bench_path_attn_cpu"


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=None, metavar="T",
                   help=f"sequence lengths (default {' '.join(map(str, DEFAULT_SEQ_LENS))})")
    p.add_argument("--heads", type=int, default=8, help="heads H = HQ (default 8)")
    p.add_argument("--dim", type=int, default=64, help="head dim D = Dv (default 64)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repetitions per function and T "
                        "(default 5 for T <= 4096, 3 above)")
    p.add_argument("--gates", action="store_true",
                   help="also time PaTH-FoX (path_attn with forget gates g)")
    p.add_argument("--torch-scan", action="store_true",
                   help="also time path_attn with the PyTorch scans instead of the fused C++ "
                        "kernels (PATHATTN_CPU_KERNEL=0), as candidate path_torch_scan")
    p.add_argument("--block-size", type=int, default=None,
                   help="block_size passed to path_attn (default: the op's default)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"),
                   help="directory for the JSON and PNG results (default benchmarks/out)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: T in {256, 512}, 2 repeats (explicit flags still win)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads before timing (default: torch's default)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return p.parse_args(argv)


def seq_lens_of(args: argparse.Namespace) -> list[int]:
    if args.seq_lens:
        return list(args.seq_lens)
    return list(QUICK_SEQ_LENS if args.quick else DEFAULT_SEQ_LENS)


def repeats_for(T: int, args: argparse.Namespace) -> int:
    if args.repeats is not None:
        return args.repeats
    if args.quick:
        return 2
    return 5 if T <= 4096 else 3


# ----------------------------------------------------------------------------- environment








def print_load(label: str, warn: bool) -> None:
    load = load_average()
    if load is None:
        return
    print(f"{label} load average (1 min): {load:.2f} on {os.cpu_count()} CPUs")
    if warn and load >= 0.5 and torch.get_num_threads() > 1:
        print("  WARNING: other processes are using the CPUs. With >1 torch thread, code made "
              "of many small ops\n  (path_attn) slows down far more than one big kernel (sdpa);"
              " consider --threads 1.")


# ----------------------------------------------------------------------------- inputs


def make_inputs(T: int, H: int, D: int, gates: bool, seed: int) -> dict[str, torch.Tensor]:
    """Realistic PaTH inputs in the op's [B, T, H, D] layout (B = 1, HQ = H)."""
    gen = torch.Generator().manual_seed(seed)
    B = 1

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {
        "q": randn(B, T, H, D),
        "k": randn(B, T, H, D),
        "v": randn(B, T, H, D),
        "w": F.normalize(randn(B, T, H, D), dim=-1),
        "beta": 2 * torch.rand(B, T, H, generator=gen),
        "do": randn(B, T, H, D),  # fixed output gradient for the backward
    }
    if gates:
        x["g"] = F.logsigmoid(randn(B, T, H) + 3)
    return x


def to_sdpa_layout(x: torch.Tensor) -> torch.Tensor:
    """[B, T, H, D] -> contiguous [B, H, T, D]."""
    return x.transpose(1, 2).contiguous()


# ----------------------------------------------------------------------------- candidates


class Candidate:
    """One op bound to its inputs: `fwd()` and `fwd_bwd()` are the timed calls."""

    def __init__(self, name: str, fn: Callable[..., torch.Tensor],
                 args: dict[str, torch.Tensor], grad_names: tuple[str, ...],
                 do: torch.Tensor):
        self.name = name
        self.fn = fn
        self.args = args
        self.grad_args = {n: t.detach().clone().requires_grad_(n in grad_names)
                          for n, t in args.items()}
        self.do = do

    def fwd(self) -> None:
        with torch.no_grad():
            self.fn(**self.args)

    def fwd_bwd(self) -> None:
        self.fn(**self.grad_args).backward(self.do)

    def clear_grads(self) -> None:
        for t in self.grad_args.values():
            t.grad = None


class TorchScanCandidate(Candidate):
    """path_attn with PATHATTN_CPU_KERNEL=0 during the whole timed call (forward and
    backward): the PyTorch scans instead of the fused C++ kernels."""

    def fwd(self) -> None:
        with _env("PATHATTN_CPU_KERNEL", "0"):
            super().fwd()

    def fwd_bwd(self) -> None:
        with _env("PATHATTN_CPU_KERNEL", "0"):
            super().fwd_bwd()


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def sdpa(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def build_candidates(x: dict[str, torch.Tensor], args: argparse.Namespace) -> list[Candidate]:
    bs = args.block_size

    def path(q, k, v, w, beta, g=None):
        return path_attn(q, k, v, w, beta, g, block_size=bs)

    sd = {n: to_sdpa_layout(x[n]) for n in ("q", "k", "v")}
    pa = {n: x[n] for n in ("q", "k", "v", "w", "beta")}
    cands = [
        Candidate(BASELINE, sdpa, sd, ("q", "k", "v"), to_sdpa_layout(x["do"])),
        Candidate("path", path, pa, tuple(pa), x["do"]),
    ]
    if args.gates:
        fox = {**pa, "g": x["g"]}
        cands.append(Candidate("path_fox", path, fox, tuple(fox), x["do"]))
    if args.torch_scan:
        cands.append(TorchScanCandidate("path_torch_scan", path, pa, tuple(pa), x["do"]))
    return cands


# ----------------------------------------------------------------------------- timing


def time_once(c: Candidate, mode: str) -> float:
    """Milliseconds of one call; grad clearing and gc happen outside the timed region."""
    c.clear_grads()
    gc.collect()
    fn = getattr(c, mode)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_interleaved(cands: list[Candidate], mode: str, repeats: int) -> dict[str, list[float]]:
    """Warm up each candidate once, then time them round-robin `repeats` times."""
    for c in cands:
        time_once(c, mode)
    times: dict[str, list[float]] = {c.name: [] for c in cands}
    for _ in range(repeats):
        for c in cands:
            times[c.name].append(time_once(c, mode))
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {n: {"min": min(t), "median": statistics.median(t)} for n, t in times.items()}


def bench_seq_len(T: int, args: argparse.Namespace) -> dict:
    x = make_inputs(T, args.heads, args.dim, args.gates, args.seed)
    cands = build_candidates(x, args)
    repeats = repeats_for(T, args)
    rec = {"T": T, "repeats": repeats, "loadavg": load_average(), "times_ms": {},
           "summary": {}}
    for mode in MODES:
        times = time_interleaved(cands, mode, repeats)
        rec["times_ms"][mode] = times
        rec["summary"][mode] = summarize(times)
    return rec


# ----------------------------------------------------------------------------- report


def ratio(rec: dict, mode: str, name: str, stat: str) -> float:
    s = rec["summary"][mode]
    return s[name][stat] / s[BASELINE][stat]


def format_table(results: list[dict], name: str) -> str:
    """T | sdpa fwd | <name> fwd | fwd ratio | sdpa fwd+bwd | <name> fwd+bwd | fwd+bwd ratio."""
    cols = ["T"]
    for mode in MODES:
        label = MODE_LABELS[mode]
        cols += [f"{BASELINE} {label} ms", f"{name} {label} ms", f"{label} ratio"]
    rows = []
    for rec in results:
        row = [str(rec["T"])]
        for mode in MODES:
            s = rec["summary"][mode]
            r_min, r_med = ratio(rec, mode, name, "min"), ratio(rec, mode, name, "median")
            row += [f"{s[BASELINE]['min']:.1f}", f"{s[name]['min']:.1f}",
                    f"{r_min:.2f} (med {r_med:.2f})"]
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def fmt(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    head = fmt(cols)
    return "\n".join([head, "-" * len(head), *map(fmt, rows)])


def print_header(info: dict, args: argparse.Namespace) -> None:
    print(f"torch {info['torch']} | threads {info['threads']} | CPU: {info['cpu']}")
    kernel = "fused C++ kernels" if load_kernels() else "PyTorch scans (no C++ kernel)"
    print(f"path_attn scans: {kernel}")
    bs = "default" if args.block_size is None else args.block_size
    print(f"B=1 H=HQ={args.heads} D={args.dim} float32 causal | block_size={bs} | "
          f"times in ms: min over repeats (ratios: path/sdpa of minima, median in parens)")


def candidate_names(results: list[dict]) -> list[str]:
    return [n for n in results[0]["summary"]["fwd"] if n != BASELINE]


def save_json(path: Path, info: dict, args: argparse.Namespace, results: list[dict]) -> None:
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path.write_text(json.dumps({"system": info, "config": cfg, "results": results}, indent=2))


def save_plot(path: Path, results: list[dict], info: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ts = [r["T"] for r in results]
    names = [BASELINE, *candidate_names(results)]
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(12, 4.8))
    for mode, style in zip(MODES, ("-", "--"), strict=True):
        for i, name in enumerate(names):
            ys = [r["summary"][mode][name]["min"] for r in results]
            ax_t.plot(Ts, ys, style, marker="o", color=f"C{i}",
                      label=f"{name} {MODE_LABELS[mode]}")
        for i, name in enumerate(names[1:], start=1):
            ys = [ratio(r, mode, name, "min") for r in results]
            ax_r.plot(Ts, ys, style, marker="o", color=f"C{i}",
                      label=f"{name} / sdpa {MODE_LABELS[mode]}")
    ax_r.axhline(GOAL, color="gray", lw=1, label=f"goal ({GOAL:g}x)")
    ax_t.set(xscale="log", yscale="log", xlabel="T", ylabel="time (ms, min over repeats)",
             title="time vs sequence length")
    ax_r.set(xscale="log", xlabel="T", ylabel="ratio (x slower than sdpa)",
             title="path / sdpa (from minima)")
    ax_r.set_ylim(bottom=0)
    for ax in (ax_t, ax_r):
        ax.set_xticks(Ts, [str(t) for t in Ts])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"PaTH attention vs SDPA on CPU - torch {info['torch']}, "
                 f"{info['threads']} threads, {info['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = system_info()
    print_header(info, args)
    print_load("start", warn=True)
    results = []
    for T in seq_lens_of(args):
        t0 = time.perf_counter()
        results.append(bench_seq_len(T, args))
        print(f"  T={T}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    info["loadavg_end"] = load_average()
    print_load("end", warn=False)
    for name in candidate_names(results):
        print(f"\n{name} vs sdpa")
        print(format_table(results, name))
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.out / f"{OUT_NAME}.json", args.out / f"{OUT_NAME}.png"
    save_json(json_path, info, args, results)
    save_plot(png_path, results, info)
    print(f"\nwrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
