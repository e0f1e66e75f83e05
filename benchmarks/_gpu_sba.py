"""The `sba_kernels` section of `gpu_check.py`: stick-breaking attention's Triton kernels
(`sb_attn(backend="triton")`) on the GPU.

Rows of two kinds, each guarded (an error is recorded and the next row runs):

  correctness  relative errors of o, dq, dk, dv of the kernels against the float64 op
               (the blockwise backend in float64), and of the blockwise backend on the same
               16-bit inputs (which computes in float32 and rounds only its outputs); ok:
               float32 within F32_TOL, 16-bit within LOW_FACTOR x the blockwise error +
               LOW_SLACK (the naive PyTorch op at 16 bits needs O(T^3) memory at these T)
  speed        forward and forward + backward ms (bfloat16, H = 16, B * T = 32K) of causal
               flash SDPA, the kernels and fla's parallel_stickbreaking_attn when fla-core
               is installed, their ratios, and the kernels' peak extra memory

`--cpu-smoke` runs the same rows at tiny sizes on Triton's interpreter (SDPA's math
backend, no fla). Called as `sba_kernels(ctx, sec)` with `_gpu_sections.Context`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from _attn_gpu import free, grads, optional_fla, rel_err, sync, timed_columns
from torch.nn.attention import sdpa_kernel

from pathattn.ops import sb_attn

__all__ = ["sba_kernels"]

F32_TOL = 1e-4
LOW_FACTOR, LOW_SLACK = 2.0, 1e-5
NAMES = ("o", "dq", "dk", "dv")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class SBACase:
    """q [B, T, HQ, D], k / v with H heads, packed sequences `cu` (B = 1) or None."""

    name: str
    dtype: str
    B: int
    T: int
    HQ: int
    H: int
    D: int
    cu: tuple[int, ...] | None = None
    attend_current: bool = False


CASES = (
    SBACase("D64-GQA-packed", "bf16", 1, 1024, 4, 2, 64, (0, 317, 318, 800, 1024)),
    SBACase("D128-GQA", "bf16", 2, 512, 4, 2, 128),
    SBACase("D64-GQA-current", "bf16", 2, 768, 8, 2, 64, attend_current=True),
    SBACase("D64-GQA-packed", "fp32", 1, 1024, 4, 2, 64, (0, 317, 318, 800, 1024)),
)
SMOKE_CASES = (SBACase("D16-GQA-packed", "bf16", 1, 24, 2, 1, 16, (0, 1, 10, 24)),
               SBACase("D16", "fp32", 2, 12, 2, 1, 16, attend_current=True))
SPEED = {"seq_lens": (2048, 8192), "tokens": 32768, "heads": 16, "dims": (64, 128)}
SMOKE_SPEED = {"seq_lens": (16,), "tokens": 32, "heads": 2, "dims": (16,)}


def _correctness_row(case: SBACase, device: torch.device) -> dict:
    dtype = DTYPES[case.dtype]
    gen = torch.Generator(device).manual_seed(0)
    shapes = ((case.HQ, case.D), (case.H, case.D), (case.H, case.D))
    xs = tuple(torch.randn(case.B, case.T, n, d, generator=gen, device=device).to(dtype)
               for n, d in shapes)
    dout = torch.randn(case.B, case.T, case.HQ, case.D, generator=gen, device=device)
    dout = dout.to(dtype)
    cu = None if case.cu is None else torch.tensor(case.cu, dtype=torch.int32, device=device)

    def op(backend):
        return lambda q, k, v: sb_attn(q, k, v, cu_seqlens=cu, backend=backend,
                                       attend_current=case.attend_current)

    ref = grads(op("blockwise"), tuple(x.double() for x in xs), dout.double())
    got = grads(op("triton"), xs, dout)
    sync(device)
    row = {"case": case.name, "dtype": case.dtype, "T": case.T}
    e = [rel_err(a, b) for a, b in zip(got, ref, strict=True)]
    row |= {f"triton_{n}": x for n, x in zip(NAMES, e, strict=True)}
    if dtype == torch.float32:
        row["ok"] = all(x <= F32_TOL for x in e)
        return row
    base = [rel_err(a, b) for a, b in zip(grads(op("blockwise"), xs, dout), ref,
                                          strict=True)]
    row |= {f"blockwise_{n}": x for n, x in zip(NAMES, base, strict=True)}
    row["worst_vs_blockwise"] = max(a / max(b, 1e-30) for a, b in zip(e, base, strict=True))
    row["ok"] = all(a <= LOW_FACTOR * b + LOW_SLACK for a, b in zip(e, base, strict=True))
    return row


def _speed_row(ctx, T: int, D: int, sizes: dict, fla) -> dict:
    """Forward and forward + backward ms of SDPA, the kernels and fla on the same bfloat16
    inputs [B, T, H, D] (`_attn_gpu.timed_columns`)."""
    dev, plan, H = ctx.device, ctx.plan, sizes["heads"]
    B = max(1, sizes["tokens"] // T)
    gen = torch.Generator(dev).manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, device=dev, dtype=torch.bfloat16)
               .requires_grad_() for _ in range(3))
    dout = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
    qs, ks, vs = (x.detach().transpose(1, 2).contiguous().requires_grad_()
                  for x in (q, k, v))  # [B, H, T, D]

    def sdpa():
        with sdpa_kernel(ctx.sdpa_backend):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    fns = {"sdpa": (sdpa, [qs, ks, vs], dout.transpose(1, 2).contiguous()),
           "sba": (lambda: sb_attn(q, k, v, backend="triton"), [q, k, v], dout)}
    if fla is not None:
        fns["fla"] = (lambda: fla(q, k, v, scale=D**-0.5)[0], [q, k, v], dout)
    row = {"T": T, "B": B, "H": H, "D": D}
    return row | timed_columns(fns, "sba", dev, plan.repeats, plan.warmup)


def sba_kernels(ctx, sec) -> None:
    """Correctness rows, then speed rows, of `sb_attn(backend="triton")` (module
    docstring)."""
    smoke = ctx.mode == "cpu-smoke"
    fla, why = (optional_fla("fla.ops.stickbreaking_attn", "parallel_stickbreaking_attn")
                if ctx.device.type == "cuda" else (None, "not on CPU"))
    sec["info"] = {"fla": "available" if fla is not None else f"n/a: {why}",
                   "reference": "sb_attn(backend='blockwise') in float64"}
    for case in SMOKE_CASES if smoke else CASES:
        row = {"case": case.name, "dtype": case.dtype}
        if ctx.expired():
            ctx.add_row(sec, row | {"status": "skipped (budget)"})
            continue
        try:
            row = _correctness_row(case, ctx.device) | {"status": "ok"}
        except Exception as e:  # noqa: BLE001 - recorded, the next case runs
            row |= {"status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
        free(ctx.device)
        ctx.add_row(sec, row)
    sizes = SMOKE_SPEED if smoke else SPEED
    for D in sizes["dims"]:
        for T in sizes["seq_lens"]:
            if ctx.expired():
                ctx.add_row(sec, {"T": T, "D": D, "status": "skipped (budget)"})
                continue
            try:
                row = _speed_row(ctx, T, D, sizes, fla) | {"status": "ok"}
            except Exception as e:  # noqa: BLE001 - e.g. out of memory
                row = {"T": T, "D": D, "status": "error",
                       "error": f"{type(e).__name__}: {e}"[:300]}
            free(ctx.device)
            ctx.add_row(sec, row)
