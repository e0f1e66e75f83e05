"""Where `path_attn`'s CPU time goes, next to SDPA's: the forward + backward of both at one
size under torch.profiler, PaTH's self CPU time split into its stages.

Stages: the fused scans (`pathattn_cpu::scan_fwd`, `scan_bwd`: the attention itself), the
UT transform (`ut_fwd`, run again in the backward, and `ut_bwd`), each also in the form
that reads and writes the token tensors in place (`*_tokens`, taken where no block is
padded), the layout's gathers (tokens <-> blocks, where blocks are padded), the input
checks, and everything else (small PyTorch ops between the stages). Each is printed in ms
and as a multiple of SDPA's forward + backward, so the row
"total" is the ratio that `benchmarks/bench_path_attn_cpu.py` measures and the rows say
what it consists of. The profile with the smallest PaTH total over --repeats is shown (and
SDPA's smallest). The fused kernels' matrix FLOPs, counted as they run, give each kernel's
GFLOP/s and PaTH's FLOPs as a multiple of attention's: the ratio to SDPA that PaTH would
reach if it ran at SDPA's FLOP rate with nothing else to do. Last, the page faults of one
forward + backward of each (fresh memory the operating system maps and zeroes).

    python benchmarks/profile_path_attn_cpu.py                  # T 4096, H 8, D 64, fp32
    python benchmarks/profile_path_attn_cpu.py --seq-len 8192 --threads 1

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import resource
from collections import defaultdict

import torch
import torch.nn.functional as F
from _env import load_average, system_info  # benchmarks/ is on sys.path
from torch.profiler import ProfilerActivity, profile

from pathattn import path_attn

STAGES = {  # profiler event name -> stage
    "pathattn_cpu::scan_fwd": "scan forward",
    "pathattn_cpu::scan_bwd": "scan backward",
    "pathattn_cpu::ut_fwd": "UT transform (forward, and again in the backward)",
    "pathattn_cpu::ut_bwd": "UT transform backward",
    "pathattn_cpu::scan_fwd_tokens": "scan forward",
    "pathattn_cpu::scan_bwd_tokens": "scan backward",
    "pathattn_cpu::ut_fwd_tokens": "UT transform (forward, and again in the backward)",
    "pathattn_cpu::ut_bwd_tokens": "UT transform backward",
    "aten::index_select": "gathers tokens <-> blocks",
    "aten::index_fill_": "gathers tokens <-> blocks",
    "aten::index_copy_": "gathers tokens <-> blocks",
    "aten::copy_": "copies",
    "aten::sum": "input checks",
}


def stage_times(events) -> dict[str, float]:
    """{stage: self CPU ms} of one profile; unnamed events go to "other"."""
    out: dict[str, float] = defaultdict(float)
    for e in events:
        out[STAGES.get(e.key, "other")] += e.self_cpu_time_total / 1e3
    return dict(out)


def attention_flops(T: int, H: int, D: int) -> tuple[float, float]:
    """(forward, forward + backward) matrix FLOPs of causal attention, B = 1: Q K^T and P V
    over the T (T + 1) / 2 visible pairs forward; the backward recomputes Q K^T and forms
    dV, dP, dQ and dK (5 products)."""
    fwd = 2 * 2 * D * H * T * (T + 1) / 2
    return fwd, fwd * (1 + 5 / 2)


def kernel_flops(run_path, leaves) -> dict[str, float]:
    """{stage: GEMM FLOPs} of one PaTH forward + backward, counted by the kernels
    (`torch.ops.pathattn_cpu.gemm_flops`), plus "forward" (a forward alone: the UT
    transform once and the forward scan); {} without the kernels."""
    counter = getattr(torch.ops.pathattn_cpu, "gemm_flops", None)
    if counter is None:
        return {}
    counter(True)
    with torch.no_grad():
        path_attn(*leaves, backend="cpu")
    fwd = sum(counter(True))
    run_path()
    per_kernel = counter(False)  # [scan_fwd, scan_bwd, ut_fwd, ut_bwd]
    names = ["pathattn_cpu::scan_fwd", "pathattn_cpu::scan_bwd", "pathattn_cpu::ut_fwd",
             "pathattn_cpu::ut_bwd"]
    out = {STAGES[n]: float(f) for n, f in zip(names, per_kernel, strict=True)}
    out["forward"] = float(fwd)
    return out


def print_floor(flops: dict[str, float], attn: tuple[float, float], sdpa_ms: float) -> None:
    """PaTH's GEMM FLOPs against attention's, and the ratio to SDPA they imply at SDPA's own
    FLOP rate: what the kernels would reach with SDPA's efficiency and no other cost."""
    fwd = flops.pop("forward")
    both = sum(flops.values())
    rate = attn[1] / sdpa_ms / 1e6
    print(f"\nGEMM FLOPs, PaTH / attention: forward {fwd / attn[0]:.2f}x "
          f"({fwd / 1e9:.1f} / {attn[0] / 1e9:.1f} GFLOP), forward + backward "
          f"{both / attn[1]:.2f}x ({both / 1e9:.1f} / {attn[1] / 1e9:.1f} GFLOP).")
    print(f"SDPA runs attention's forward + backward at {rate:.0f} GFLOP/s; at that rate "
          f"PaTH's GEMMs alone would take {both / attn[1]:.2f}x SDPA's time.")


def page_faults(fn, repeats: int) -> int:
    """The fewest minor page faults of one call of fn over `repeats` calls (memory the
    allocator took fresh from the operating system and touched)."""
    counts = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(counts)


def profiled(fn) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return stage_times(prof.key_averages())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default all)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T, H, D = 1, args.seq_len, args.heads, args.dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=g)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, w, beta)]
    sdpa_in = [x.transpose(1, 2).clone().requires_grad_() for x in (q, k, v)]

    def run_path():
        path_attn(*leaves, backend="cpu").sum().backward()

    def run_sdpa():
        F.scaled_dot_product_attention(*sdpa_in, is_causal=True).sum().backward()

    run_path(), run_sdpa()  # warm-up (kernel build, allocator)
    info = system_info()
    best_path, best_sdpa = None, None
    for _ in range(args.repeats):
        a, b = profiled(run_path), profiled(run_sdpa)
        if best_path is None or sum(a.values()) < sum(best_path.values()):
            best_path = a
        if best_sdpa is None or sum(b.values()) < sum(best_sdpa.values()):
            best_sdpa = b
    sdpa = sum(best_sdpa.values())
    flops = kernel_flops(run_path, leaves)
    faults = page_faults(run_path, args.repeats), page_faults(run_sdpa, args.repeats)
    print(f"# T={T} H={H} D={D} fp32, {info['threads']} threads, {info['cpu']}, "
          f"torch {info['torch']}, load {info['loadavg_start']:.2f} -> {load_average():.2f}")
    print(f"SDPA forward + backward: {sdpa:.1f} ms\n")
    print("| PaTH stage | ms | x SDPA fwd+bwd | GEMM GFLOP | GFLOP/s |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for stage, ms in sorted(best_path.items(), key=lambda kv: -kv[1]):
        gf = flops.get(stage)
        extra = f"{gf / 1e9:.2f} | {gf / ms / 1e6:.0f}" if gf else " | "
        print(f"| {stage} | {ms:.1f} | {ms / sdpa:.3f} | {extra} |")
    total = sum(best_path.values())
    print(f"| total | {total:.1f} | {total / sdpa:.3f} | | |")
    print(f"\nMinor page faults per forward + backward (fewest of {args.repeats}): PaTH "
          f"{faults[0]}, SDPA {faults[1]} (the kernels' workspace, `pathattn.ops.path.cpu."
          "workspace_info()`, keeps their own temporaries mapped)")
    if flops:
        print_floor(flops, attention_flops(T, H, D), sdpa)


if __name__ == "__main__":
    main()
