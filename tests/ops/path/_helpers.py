"""Helpers of the PaTH op tests: seeded inputs, forward + backward runs, error measures.

Inputs follow `pathattn.path_attn`: q [B, T, HQ, D]; k, w [B, T, H, D]; v [B, T, H, Dv];
beta [B, T, H]; g [B, T, HQ] or None. They travel as a tuple in that order (`NAMES`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._numerics import rel_err

NAMES = ("q", "k", "v", "w", "beta", "g")


def make_inputs(B: int, T: int, HQ: int, H: int, D: int, Dv: int, gates: bool = True,
                dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple:
    """Random (q, k, v, w, beta, g), all in `dtype`, the layer's way: unit w, beta in (0, 2),
    g = logsigmoid(randn + 2) (or None without gates).

    Values are drawn in float32 and then cast, so the same seed gives the same numbers
    (up to rounding) in every dtype.
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen)
    k = torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H, Dv, generator=gen)
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HQ, generator=gen) + 2) if gates else None
    return cast((q, k, v, w, beta, g), dtype)


def make_reflection_inputs(B: int, T: int, HQ: int, H: int, D: int, Dv: int, R: int,
                           gates: bool = True, dtype: torch.dtype = torch.float32,
                           seed: int = 0) -> tuple:
    """`make_inputs` with R reflections per token: w [B, T, H, R, D] (unit rows) and beta
    [B, T, H, R] in (0, 2) drawn afresh; q, k, v, g as `make_inputs`."""
    q, k, v, _, _, g = make_inputs(B, T, HQ, H, D, Dv, gates, torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 2)
    w = F.normalize(torch.randn(B, T, H, R, D, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, T, H, R, generator=gen)
    return cast((q, k, v, w, beta, g), dtype)


def make_dout(B: int, T: int, HQ: int, Dv: int, seed: int = 0) -> torch.Tensor:
    """Random output cotangent [B, T, HQ, Dv] (float32) for the backward passes."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randn(B, T, HQ, Dv, generator=gen)


def strided_view(x: torch.Tensor) -> torch.Tensor:
    """x's values in a view whose rows lie further apart (as slices of a fused projection
    do), unit stride along the last dim: not contiguous."""
    wide = torch.zeros(x.shape[:-1] + (2 * x.shape[-1] + 3,), dtype=x.dtype)
    wide[..., 1: 1 + x.shape[-1]] = x
    return wide[..., 1: 1 + x.shape[-1]]


def cast(inputs: tuple, dtype: torch.dtype) -> tuple:
    """Every tensor of `inputs` in `dtype`; None stays None."""
    return tuple(None if x is None else x.to(dtype) for x in inputs)


def run_with_grads(fn, inputs: tuple, dout: torch.Tensor, **kwargs):
    """o = fn(*inputs, **kwargs) on fresh leaves, and the gradient of sum(o * dout) w.r.t.
    every input. Returns (o, grads) with grads[i] None where inputs[i] is None."""
    xs = tuple(None if x is None else x.detach().clone().requires_grad_() for x in inputs)
    o = fn(*xs, **kwargs)
    used = [x for x in xs if x is not None]
    # a single-token sequence leaves w and beta out of the reference's graph: zero gradient
    grads = iter(torch.autograd.grad(o, used, dout.to(o.dtype), materialize_grads=True))
    return o.detach(), [None if x is None else next(grads) for x in xs]


def errors(ours, ref) -> dict[str, float]:
    """rel_err of the output ("o") and of every gradient, both (o, grads) pairs as returned
    by `run_with_grads`."""
    (o, grads), (o_ref, grads_ref) = ours, ref
    errs = {"o": rel_err(o, o_ref)}
    for name, gr, gr_ref in zip(NAMES, grads, grads_ref, strict=True):
        if gr_ref is not None:
            errs[name] = rel_err(gr, gr_ref)
    return errs


def assert_close_to_reference(ours, ref, tol: float) -> None:
    """Every relative error of `errors(ours, ref)` is below tol (NaN fails)."""
    __tracebackhide__ = True  # report the failing test, not this helper and its tensors
    errs = errors(ours, ref)
    bad = {name: e for name, e in errs.items() if not e < tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errs})"
