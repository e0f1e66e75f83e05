"""GPU timing of path_attn(backend="triton") against flash SDPA and fla's parallel_path_attn.

The paper's kernel setting: H = 32 heads, head dim D = 64 (and D = 128), causal, bfloat16,
T from 1K to 16K with the batch scaled to keep B * T = --tokens constant. For every shape it
times forward and forward + backward of

* sdpa: torch scaled_dot_product_attention(is_causal=True) pinned to the flash backend
        (the RoPE / FlashAttention baseline; inputs in its [B, H, T, D] layout, untimed);
* path: pathattn.path_attn(..., backend="triton") with forget gates off (and, with --gates,
        PaTH-FoX with gates);
* fla:  fla.ops.path_attn.parallel_path_attn, when fla is importable, given the same op's
        inputs in its conventions (w, beta float32, g / scale; `_attn_gpu.fla_inputs`),

with CUDA events (warm-up, then the median of --repeats runs), and records each one's peak
memory (torch.cuda.max_memory_allocated beyond the inputs). Prints a table with the ratios
path / sdpa and path / fla, and writes benchmarks/out/bench_path_attn_gpu.json and .png.

    python benchmarks/bench_path_attn_gpu.py                 # full sweep
    python benchmarks/bench_path_attn_gpu.py --quick         # T = 1024, 4096 only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from _attn_gpu import candidates, fla_kernel, peak_mib, time_ms  # benchmarks/ is on sys.path
from _env import system_info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32768, help="B * T, kept constant")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--gates", action="store_true", help="PaTH-FoX (forget gates) for path/fla")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="T = 1024, 4096 and D = 64 only")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_path_attn_gpu.py needs a CUDA device (torch.cuda.is_available() is "
              "False); nothing to measure on this machine.", file=sys.stderr)
        return 1
    if args.quick:
        args.seq_lens, args.dims = [1024, 4096], [64]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.device("cuda")
    fla, fla_missing = fla_kernel()
    info = system_info() | {"gpu": torch.cuda.get_device_name(), "fla": fla_missing or True}
    print(info)
    rows = []
    for D in args.dims:
        for T in args.seq_lens:
            B = max(1, args.tokens // T)
            fns = candidates(B, T, args.heads, D, dtype, args.gates, device, fla)
            row = {"B": B, "T": T, "H": args.heads, "D": D}
            for name, c in fns.items():
                try:
                    row[f"{name}_fwd_ms"] = time_ms(c.fwd, args.repeats, device)
                    row[f"{name}_fwdbwd_ms"] = time_ms(c.fwd_bwd, args.repeats, device)
                    row[f"{name}_peak_mib"] = peak_mib(c.fwd_bwd, device)
                except Exception as e:  # noqa: BLE001 - e.g. fla without D = 128 support
                    row[f"{name}_error"] = repr(e)[:200]
                torch.cuda.empty_cache()
            for base in ("sdpa", "fla"):
                for mode in ("fwd", "fwdbwd"):
                    a, b = row.get(f"path_{mode}_ms"), row.get(f"{base}_{mode}_ms")
                    if a is not None and b is not None:
                        row[f"path/{base}_{mode}"] = a / b
            rows.append(row)
            print(" | ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in row.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"config": vars(args) | {"out": str(args.out)}, "system": info, "rows": rows}
    (args.out / "bench_path_attn_gpu.json").write_text(json.dumps(result, indent=1))
    _plot(rows, args.out / "bench_path_attn_gpu.png")
    return 0


def _plot(rows, path: Path) -> None:
    """fwd+bwd time vs T per head dim (log-log), one line per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(5 * len(dims), 4), squeeze=False)
    for ax, D in zip(axes[0], dims, strict=True):
        sel = [r for r in rows if r["D"] == D]
        for name in ("sdpa", "path", "fla"):
            pts = [(r["T"], r[f"{name}_fwdbwd_ms"]) for r in sel if f"{name}_fwdbwd_ms" in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="T (B * T constant)", ylabel="fwd+bwd ms",
               title=f"D = {D}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
