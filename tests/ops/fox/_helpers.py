"""Helpers of the FoX op tests: seeded inputs (q, k, v, g) and forward + backward runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._numerics import rel_err

NAMES = ("o", "dq", "dk", "dv", "dg")


def make_inputs(B: int, T: int, HQ: int, H: int, D: int, dtype: torch.dtype = torch.float32,
                seed: int = 0) -> tuple:
    """Random q [B, T, HQ, D], k, v [B, T, H, D] in `dtype` and log forget gates g
    [B, T, HQ] = logsigmoid(2 randn + 1) in float32 (the layer's gate dtype)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, n, D, generator=gen).to(dtype) for n in (HQ, H, H))
    g = F.logsigmoid(2 * torch.randn(B, T, HQ, generator=gen) + 1)
    return q, k, v, g


def run_with_grads(fn, inputs: tuple, dout: torch.Tensor, **kwargs) -> list[torch.Tensor]:
    """[o, dq, dk, dv, dg] of fn(q, k, v, g, **kwargs) for the cotangent dout (cast to o's
    dtype), on fresh leaves."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    o = fn(*xs, **kwargs)
    o.backward(dout.to(o.dtype))
    return [o.detach()] + [x.grad for x in xs]


def errors(got: list, ref: list) -> dict[str, float]:
    """Relative error of each of o, dq, dk, dv, dg."""
    return {n: rel_err(a, b) for n, a, b in zip(NAMES, got, ref, strict=True)}
