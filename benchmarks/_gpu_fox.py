"""The `fox_kernels` section of `gpu_check.py`: forgetting attention's Triton kernels
(`fox_attn(backend="triton")`, gated FlashAttention) on the GPU.

Rows, each guarded (an error is recorded and the next row runs):

  correctness  relative errors of o, dq, dk, dv, dg against the float64 op (the PaTH op
               with identity transforms), bfloat16 and float32, GQA, packed sequences
  speed        forward and forward + backward ms (bfloat16, H = 16, B * T = 32K, D = 64,
               gates g = logsigmoid(randn + 2)) of causal flash SDPA, the kernels and fla's
               parallel_forgetting_attn when fla-core is installed, their ratios (the goal
               at T >= 8192: forward + backward at most 1.5x flash SDPA), and the kernels'
               peak extra memory

`--cpu-smoke` runs the same rows at tiny sizes on Triton's interpreter (no fla). Called as
`fox_kernels(ctx, sec)` with `_gpu_sections.Context`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _attn_gpu import free, grads, optional_fla, rel_err, sync, timed_columns
from torch.nn.attention import sdpa_kernel

from pathattn.ops import fox_attn

__all__ = ["fox_kernels"]

NAMES = ("o", "dq", "dk", "dv", "dg")
# (name, dtype, B, T, HQ, H, D, cu_seqlens)
CASES = (("D64-GQA-packed", torch.bfloat16, 1, 1024, 4, 2, 64, (0, 317, 318, 800, 1024)),
         ("D128-GQA", torch.bfloat16, 2, 512, 4, 2, 128, None),
         ("D64-GQA-packed", torch.float32, 1, 1024, 4, 2, 64, (0, 317, 318, 800, 1024)))
SMOKE_CASES = (("D16-GQA-packed", torch.bfloat16, 1, 24, 2, 1, 16, (0, 1, 10, 24)),)
SPEED = {"seq_lens": (2048, 8192, 16384), "tokens": 32768, "heads": 16, "D": 64}
SMOKE_SPEED = {"seq_lens": (16,), "tokens": 32, "heads": 2, "D": 16}


def _inputs(B, T, HQ, H, D, dtype, device):
    gen = torch.Generator(device).manual_seed(0)
    q = torch.randn(B, T, HQ, D, generator=gen, device=device).to(dtype)
    k, v = (torch.randn(B, T, H, D, generator=gen, device=device).to(dtype) for _ in range(2))
    g = F.logsigmoid(torch.randn(B, T, HQ, generator=gen, device=device) + 2)
    return q, k, v, g


def _correctness_row(case, device) -> dict:
    name, dtype, B, T, HQ, H, D, cu = case
    xs = _inputs(B, T, HQ, H, D, dtype, device)
    dout = torch.randn(B, T, HQ, D, device=device, dtype=dtype)
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    ref = grads(lambda *a: fox_attn(*a, cu_seqlens=cu, backend="path"),
                 tuple(x.double() for x in xs), dout.double())
    got = grads(lambda *a: fox_attn(*a, cu_seqlens=cu, backend="triton"), xs, dout)
    sync(device)
    row = {"case": name, "dtype": str(dtype).removeprefix("torch."), "T": T}
    return row | {f"triton_{n}": rel_err(a, b) for n, a, b in zip(NAMES, got, ref, strict=True)}


def _speed_row(ctx, T: int, sizes: dict, fla) -> dict:
    dev, plan, H, D = ctx.device, ctx.plan, sizes["heads"], sizes["D"]
    B = max(1, sizes["tokens"] // T)
    q, k, v, g = (x.requires_grad_() for x in _inputs(B, T, H, H, D, torch.bfloat16, dev))
    dout = torch.randn_like(q)
    qs, ks, vs = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dout_s = dout.transpose(1, 2).contiguous()

    def sdpa():
        with sdpa_kernel(ctx.sdpa_backend):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    fns = {"sdpa": (sdpa, (qs, ks, vs), dout_s),
           "fox": (lambda: fox_attn(q, k, v, g, backend="triton"), (q, k, v, g), dout)}
    if fla is not None:
        fns["fla"] = (lambda: fla(q, k, v, g), (q, k, v, g), dout)
    row = {"T": T, "B": B, "H": H, "D": D}
    return row | timed_columns(fns, "fox", dev, plan.repeats, plan.warmup)


def fox_kernels(ctx, sec) -> None:
    """Correctness rows, then speed rows, of `fox_attn(backend="triton")` (module
    docstring)."""
    smoke = ctx.mode == "cpu-smoke"
    fla, why = (optional_fla("fla.ops.forgetting_attn", "parallel_forgetting_attn")
                if ctx.device.type == "cuda" else (None, "not on CPU"))
    sec["info"] = {"fla": "available" if fla is not None else f"n/a: {why}",
                   "reference": "fox_attn(backend='path') in float64"}
    for case in SMOKE_CASES if smoke else CASES:
        row = {"case": case[0], "dtype": str(case[1]).removeprefix("torch.")}
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
    for T in sizes["seq_lens"]:
        if ctx.expired():
            ctx.add_row(sec, {"T": T, "status": "skipped (budget)"})
            continue
        try:
            row = _speed_row(ctx, T, sizes, fla) | {"status": "ok"}
        except Exception as e:  # noqa: BLE001 - e.g. out of memory
            row = {"T": T, "status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
        free(ctx.device)
        ctx.add_row(sec, row)
