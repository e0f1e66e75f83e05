"""Shared helpers of the GPU attention benchmarks (`bench_path_attn_gpu.py`, `gpu_check.py`):
PaTH inputs, the candidates (flash SDPA, fla's parallel_path_attn, path_attn on the Triton
kernels) as forward and forward + backward closures, timing, peak memory and relative
errors. Everything also runs on the CPU (wall-clock timing, no memory figure): the CPU smoke
run of `gpu_check.py` uses that.

fla's conventions (docs/ops.md): w and beta in float32, and it multiplies the gate term by
the scale, so it gets g / scale for the same op. Its inputs are made once, untimed.
"""

from __future__ import annotations

import gc
import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pathattn import path_attn
from pathattn.ops.path.fla import kernel as fla_kernel

__all__ = ["fla_kernel", "path_inputs", "fla_inputs", "Candidate", "candidates", "time_ms",
           "peak_mib", "rel_err", "sync", "timed_columns", "free", "grads", "optional_fla"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def path_inputs(B: int, T: int, HQ: int, H: int, D: int, dtype: torch.dtype, gates: bool,
                device: torch.device, R: int = 1, seed: int = 0) -> tuple:
    """(q, k, v, w, beta, g) leaves requiring grad, the layer's way: unit w, beta in (0, 2),
    g = logsigmoid(randn + 2) [B, T, HQ] or None. Drawn in float32 on `device`, then cast to
    `dtype` (beta and g stay float32). R > 1: w [B, T, H, R, D], beta [B, T, H, R]."""
    gen = torch.Generator(device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    q, k, v = randn(B, T, HQ, D), randn(B, T, H, D), randn(B, T, H, D)
    rs = (R,) if R > 1 else ()
    w = F.normalize(randn(B, T, H, *rs, D), dim=-1)  # [B, T, H, (R,) D]
    beta = 2 * torch.rand(B, T, H, *rs, generator=gen, device=device)
    g = F.logsigmoid(randn(B, T, HQ) + 2) if gates else None
    xs = [x.to(dtype) for x in (q, k, v, w)] + [beta, g]
    return tuple(None if x is None else x.requires_grad_() for x in xs)


def fla_inputs(q, k, v, w, beta, g, scale: float) -> tuple:
    """The same op's inputs in fla's conventions, as new leaves: w, beta float32, g / scale
    float32 (or None)."""
    g_fla = None if g is None else g.detach().float() / scale
    xs = (q.detach(), k.detach(), v.detach(), w.detach().float(), beta.detach().float(), g_fla)
    return tuple(None if x is None else x.clone().requires_grad_() for x in xs)


@dataclass
class Candidate:
    """One implementation on one shape: fwd() under no_grad, fwd_bwd() the forward and the
    gradients of every input (torch.autograd.grad: nothing accumulates between runs)."""

    fwd: Callable[[], None]
    fwd_bwd: Callable[[], None]


def _candidate(f: Callable[[], torch.Tensor], leaves: list, dout: torch.Tensor) -> Candidate:
    leaves = [x for x in leaves if x is not None]

    def fwd():
        with torch.no_grad():
            f()

    def fwd_bwd():
        torch.autograd.grad(f(), leaves, dout)

    return Candidate(fwd, fwd_bwd)


def candidates(B: int, T: int, H: int, D: int, dtype: torch.dtype, gates: bool,
               device: torch.device, fla: Callable | None, names=("sdpa", "fla", "path"),
               sdpa_backend: SDPBackend = SDPBackend.FLASH_ATTENTION) -> dict[str, Candidate]:
    """name -> Candidate among `names`: "sdpa" (causal SDPA pinned to `sdpa_backend`, inputs
    pre-transposed to [B, H, T, D]; no gates), "fla" (when `fla` is given) and "path"
    (path_attn, backend="triton"), all on the same inputs with H = HQ heads."""
    xs = path_inputs(B, T, H, H, D, dtype, gates, device)
    dout = torch.randn(B, T, H, D, device=device, dtype=dtype)  # [B, T, HQ, D]
    out = {}
    if "sdpa" in names:
        qs, ks, vs = (x.detach().transpose(1, 2).contiguous().requires_grad_()
                      for x in xs[:3])  # [B, H, T, D]
        dout_s = dout.transpose(1, 2).contiguous()

        def sdpa():
            with sdpa_kernel(sdpa_backend):
                return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

        out["sdpa"] = _candidate(sdpa, [qs, ks, vs], dout_s)
    if "fla" in names and fla is not None:
        scale = D**-0.5
        ys = fla_inputs(*xs, scale)
        out["fla"] = _candidate(lambda: fla(*ys, scale=scale)[0], list(ys), dout)
    if "path" in names:
        out["path"] = _candidate(lambda: path_attn(*xs, backend="triton"), list(xs), dout)
    return out


def time_ms(fn: Callable[[], None], repeats: int, device: torch.device,
            warmup: int = 1) -> float:
    """Median milliseconds of fn() over `repeats` runs after `warmup` runs: CUDA events on
    a GPU, wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def peak_mib(fn: Callable[[], None], device: torch.device) -> float | None:
    """Peak CUDA memory allocated by fn() beyond what was allocated before (the inputs), in
    MiB; None on the CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (0 when both are 0)."""
    x, ref = x.detach().double(), ref.detach().double()
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


def timed_columns(fns: dict, ours: str, device: torch.device, repeats: int,
                  warmup: int) -> dict:
    """Speed columns of one shape: fns maps a name to (f, leaves, dout) (f() returns the
    output; leaves require grad). Per name `{name}_fwd_ms` (no_grad) and
    `{name}_fwdbwd_ms`, "n/a" for the names "sdpa" / "fla" that fns lacks, an error
    recorded as `{name}_error`; `{ours}_peak_mib`; ratios `{ours}/{base}_{fwd|fwdbwd}` to
    sdpa and fla. Runs fla last (its first calls autotune)."""
    row: dict = {}
    for name in [n for n in fns if n != "fla"] + ["sdpa", "fla"]:
        if name not in fns:
            row.setdefault(f"{name}_fwd_ms", "n/a")
            continue
        if f"{name}_fwd_ms" in row:
            continue
        cand = _candidate(*fns[name])
        try:
            row[f"{name}_fwd_ms"] = time_ms(cand.fwd, repeats, device, warmup)
            row[f"{name}_fwdbwd_ms"] = time_ms(cand.fwd_bwd, repeats, device, warmup)
            if name == ours:
                row[f"{ours}_peak_mib"] = peak_mib(cand.fwd_bwd, device)
        except Exception as e:  # noqa: BLE001 - recorded in the row
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
    for base in ("sdpa", "fla"):
        for m in ("fwd", "fwdbwd"):
            a, b = row.get(f"{ours}_{m}_ms"), row.get(f"{base}_{m}_ms")
            if isinstance(a, float) and isinstance(b, float):
                row[f"{ours}/{base}_{m}"] = a / b
    return row


def free(device: torch.device) -> None:
    """Collect garbage and, on a GPU, return cached blocks (between rows of a section)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def grads(fn, xs: tuple, dout: torch.Tensor) -> list[torch.Tensor]:
    """[o = fn(*xs), *gradients of sum(o * dout) w.r.t. every input], on fresh leaves (zeros
    for an input o does not depend on)."""
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    o = fn(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, dout.to(o.dtype),
                                             materialize_grads=True)]


def optional_fla(module: str, name: str):
    """fla's function `name` from `module` (e.g. "fla.ops.forgetting_attn"), or
    (None, why) when fla-core cannot be imported."""
    try:
        return getattr(importlib.import_module(module), name), ""
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return None, f"{type(e).__name__}: {e}"[:200]
