"""GPU timing of path_attn(backend="triton") against flash SDPA and fla's parallel_path_attn.

The paper's kernel setting: H = 32 heads, head dim D = 64 (and D = 128), causal, bfloat16,
T from 1K to 16K with the batch scaled to keep B * T = --tokens constant. For every shape it
times forward and forward + backward of

* sdpa: torch scaled_dot_product_attention(is_causal=True) pinned to the flash backend
        (the RoPE / FlashAttention baseline; inputs in its [B, H, T, D] layout, untimed);
* path: pathattn.path_attn(..., backend="triton") with forget gates off (and, with --gates,
        PaTH-FoX with gates);
* fla:  fla.ops.path_attn.parallel_path_attn, when fla is importable,

with CUDA events (warm-up, then the median of --repeats runs), and records each one's peak
memory (torch.cuda.max_memory_allocated beyond the inputs). Prints a table with the ratios
path / sdpa and path / fla, and writes benchmarks/out/bench_path_attn_gpu.json and .png.

    python benchmarks/bench_path_attn_gpu.py                 # full sweep
    python benchmarks/bench_path_attn_gpu.py --quick         # T = 1024, 4096 only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from _env import system_info  # benchmarks/ is on sys.path
from torch.nn.attention import SDPBackend, sdpa_kernel

from pathattn import path_attn


def _fla():
    """fla's parallel_path_attn, or None when fla is not installed."""
    try:
        import fla.ops.path_attn as fla_path
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    fn = getattr(fla_path, "parallel_path_attn", None) or getattr(
        fla_path, "parallel_path_attention", None)
    if fn is None:
        return None

    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        return out[0] if isinstance(out, tuple) else out  # (o, k_cache) in some versions

    return run


def _inputs(B, T, H, D, dtype, gates):
    """PaTH inputs in [B, T, H, D] layout, the layer's way (unit w, beta in (0, 2))."""
    dev = "cuda"
    q, k, v = (torch.randn(B, T, H, D, device=dev, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, device=dev, dtype=torch.float32), dim=-1).to(dtype)
    beta = 2 * torch.rand(B, T, H, device=dev, dtype=torch.float32)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev) + 2) if gates else None
    xs = [q, k, v, w, beta] + ([g] if gates else [])
    return [x.requires_grad_() for x in xs]


def _time(fn, repeats: int) -> float:
    """Median milliseconds of fn() over `repeats` runs (CUDA events), after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _peak_mib(fn) -> float:
    """Peak memory allocated by fn() beyond what was allocated before, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _candidates(B, T, H, D, dtype, gates, fla):
    """name -> (forward fn, forward+backward fn)."""
    xs = _inputs(B, T, H, D, dtype, gates)
    do = torch.randn(B, T, H, D, device="cuda", dtype=dtype)
    qs, ks, vs = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in xs[:3])
    do_s = do.transpose(1, 2).contiguous()

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    def path():
        return path_attn(*xs, backend="triton")

    out = {"sdpa": (sdpa, do_s), "path": (path, do)}
    if fla is not None:
        q, k, v, w, beta = xs[:5]
        # fla scales its gate term by the softmax scale: pass g / scale for the same op
        g_fla = None if not gates else (xs[5].detach() * D**0.5).requires_grad_()
        out["fla"] = (lambda: fla(q, k, v, w, beta, g_fla, scale=D**-0.5), do)
    fns = {}
    for name, (f, dout) in out.items():
        def fwd(f=f):
            with torch.no_grad():
                f()

        def fwd_bwd(f=f, dout=dout):
            f().backward(dout)

        fns[name] = (fwd, fwd_bwd)
    return fns


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
    fla = _fla()
    info = system_info() | {"gpu": torch.cuda.get_device_name(), "fla": fla is not None}
    print(info)
    rows = []
    for D in args.dims:
        for T in args.seq_lens:
            B = max(1, args.tokens // T)
            fns = _candidates(B, T, args.heads, D, dtype, args.gates, fla)
            row = {"B": B, "T": T, "H": args.heads, "D": D}
            for name, (fwd, fwd_bwd) in fns.items():
                try:
                    row[f"{name}_fwd_ms"] = _time(fwd, args.repeats)
                    row[f"{name}_fwdbwd_ms"] = _time(fwd_bwd, args.repeats)
                    row[f"{name}_peak_mib"] = _peak_mib(fwd_bwd)
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
