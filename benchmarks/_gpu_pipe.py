"""The `pipelining` section of `gpu_check.py`: the pipeline depth (PIPE, loads in flight) of
each scan kernel's loop over earlier segments' blocks, timed against the default.

One row per (kernel, depth) at one shape (bfloat16, gates, D = 64, T = the plan's middle
sequence length, B * T = the plan's tokens): forward and forward + backward ms of
`path_attn(backend="triton")` with that kernel's depth changed (`config.pipe_table`) and
the others at their defaults, and the ratio to the default row. The defaults are chosen
ahead of time (no spill traffic in loops, `benchmarks/triton_fit.py --report --loops`);
a ratio below 1 names a faster depth for `config.PIPE_STAGES` (the device's
architecture, D = 64). Each depth compiles its kernel once (about 15 s on an H100).

`--cpu-smoke` runs the same rows at tiny sizes on Triton's interpreter. Called as
`pipelining(ctx, sec)` with `_gpu_sections.Context`.
"""

from __future__ import annotations

import torch
from _attn_gpu import candidates, free, time_ms

from pathattn.ops.path.triton import config

__all__ = ["pipelining"]

DEPTHS = (1, 2, 3)


def _row(ctx, kernel: str, depth: int | None, shape: tuple) -> dict:
    B, T, H, D = shape
    row = {"kernel": kernel, "PIPE": depth if depth is not None else "default",
           "B": B, "T": T, "H": H, "D": D}
    default = config.pipe_table
    try:
        if depth is not None:  # this kernel's depth changed, the others' kept
            config.pipe_table = lambda *a: tuple({**dict(default(*a)), kernel: depth}.items())
        cand = candidates(B, T, H, D, torch.bfloat16, True, ctx.device, None, ("path",))["path"]
        row["fwd_ms"] = time_ms(cand.fwd, ctx.plan.repeats, ctx.device, ctx.plan.warmup)
        row["fwdbwd_ms"] = time_ms(cand.fwd_bwd, ctx.plan.repeats, ctx.device,
                                   ctx.plan.warmup)
    except Exception as e:  # noqa: BLE001 - recorded in the row
        row |= {"status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        config.pipe_table = default
        free(ctx.device)
    return row


def pipelining(ctx, sec) -> None:
    plan = ctx.plan
    T = plan.seq_lens[len(plan.seq_lens) // 2]
    shape = (max(1, plan.tokens // T), T, plan.heads, plan.dims[0])
    base = _row(ctx, "default", None, shape)
    cfg = config.device_launch_config(shape[3], shape[3], torch.bfloat16, ctx.device)
    base["PIPE"] = ", ".join(f"{k} {cfg.pipe_stages(k)}" for k in config.PIPELINED)
    ctx.add_row(sec, base)
    for kernel in config.PIPELINED:
        for depth in DEPTHS:
            if depth == cfg.pipe_stages(kernel):
                continue  # the default row
            if ctx.expired():
                ctx.add_row(sec, {"kernel": kernel, "PIPE": depth,
                                  "status": "skipped (budget)"})
                continue
            row = _row(ctx, kernel, depth, shape)
            for m in ("fwd_ms", "fwdbwd_ms"):
                if isinstance(row.get(m), float) and isinstance(base.get(m), float):
                    row[f"{m.removesuffix('_ms')}/default"] = row[m] / base[m]
            ctx.add_row(sec, row)
