"""Helpers of the stick-breaking op tests: seeded inputs (q, k, v), forward + backward runs,
relative errors of the output and every gradient."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._numerics import rel_err

NAMES = ("q", "k", "v")


@dataclass(frozen=True)
class Case:
    """One input configuration; `sharp` multiplies q by 8 (logits far from 0: weights near 0
    and 1, stick products that underflow)."""

    B: int = 1
    T: int = 40
    HQ: int = 2
    H: int = 1
    D: int = 16
    Dv: int = 16
    cu: tuple[int, ...] | None = None
    attend_current: bool = False
    block_size: int | None = 16
    scale: float | None = None
    sharp: bool = False

    def __str__(self) -> str:
        s = f"B{self.B}-T{self.T}-HQ{self.HQ}H{self.H}-D{self.D}-Dv{self.Dv}"
        s += f"-C{self.block_size}" + ("-cur" if self.attend_current else "")
        s += "" if self.cu is None else "-cu" + "_".join(map(str, self.cu))
        s += "" if self.scale is None else f"-s{self.scale}"
        return s + ("-sharp" if self.sharp else "")

    def inputs(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple:
        """(q [B, T, HQ, D], k [B, T, H, D], v [B, T, H, Dv]) drawn in float32, then cast."""
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(self.B, self.T, self.HQ, self.D, generator=gen)
        k = torch.randn(self.B, self.T, self.H, self.D, generator=gen)
        v = torch.randn(self.B, self.T, self.H, self.Dv, generator=gen)
        if self.sharp:
            q = 8 * q
        return tuple(x.to(dtype) for x in (q, k, v))

    def dout(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed + 1)
        return torch.randn(self.B, self.T, self.HQ, self.Dv, generator=gen).to(dtype)

    def kwargs(self) -> dict:
        cu = None if self.cu is None else torch.tensor(self.cu, dtype=torch.int32)
        return dict(cu_seqlens=cu, attend_current=self.attend_current, scale=self.scale)


def run_with_grads(fn, inputs: tuple, dout: torch.Tensor, **kwargs):
    """o = fn(*inputs, **kwargs) on fresh leaves and the gradients of sum(o * dout) with
    respect to q, k, v. Returns (o, [dq, dk, dv])."""
    xs = tuple(x.detach().clone().requires_grad_() for x in inputs)
    o = fn(*xs, **kwargs)
    grads = torch.autograd.grad(o, xs, dout.to(o.dtype), materialize_grads=True)
    return o.detach(), list(grads)


def errors(ours, ref) -> dict[str, float]:
    """Relative errors ||x - ref|| / ||ref|| of the output ("o") and each gradient."""
    (o, grads), (o_ref, grads_ref) = ours, ref
    errs = {"o": rel_err(o, o_ref)}
    for name, gr, gr_ref in zip(NAMES, grads, grads_ref, strict=True):
        errs[name] = rel_err(gr, gr_ref)
    return errs
