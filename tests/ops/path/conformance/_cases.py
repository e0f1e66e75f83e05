"""Input cases of the conformance suite and the float32 check against the float64 reference.

float32 tolerance: every backend must match the float64 naive reference to a relative error
||ours - ref|| / ||ref|| below 1e-4, for the output and every gradient. float32 rounds at
6e-8; the op's sums run over at most a few hundred tokens and head dims of at most 256, and
its Householder products over at most a sequence, so a correct float32 implementation lands
near 1e-6 (measured on the float32 cases here: largest error of output and
gradients 3e-7 to 3.3e-6 on every backend). A real defect (a token masked wrongly, a
transform or a gate term missing, a block boundary off by one) shows up as 1e-2 or worse.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from pathattn.ops import path_attn_naive

from .._helpers import (
    assert_close_to_reference,
    cast,
    make_dout,
    make_inputs,
    make_reflection_inputs,
    run_with_grads,
)

F32_TOL = 1e-4
CU_70 = (0, 1, 2, 19, 19, 50, 51, 70)  # lengths 1, 1, 17, 0, 31, 1, 19


@dataclass(frozen=True)
class Case:
    """One input configuration; `special` edits the layer-like inputs of `make_inputs`:
    "beta0", "beta2", "beta0or2" (identities and reflections), "w_free" (w of norm in
    (0, 1) instead of unit), "w_big" (norms in (1, 1.5): transforms that expand), "sharp"
    (q * 10: logits far above the running max, so a scan must rescale), "gate_cliff"
    (g = -50 on tokens 20..39: G falls by 1000, keys behind the cliff get weight 0),
    "gate_wall" (g = -1e5 on tokens 3 and 21, inside blocks: the keys just after a wall
    meet later queries with small gate terms that float32 differences of G, or of offsets
    from a reference point before the wall, would round away) or "gate_ramp" (g = -1.5
    on every token: probabilities fall smoothly, at T = 48 down to exp(-70), through the
    blockwise exp cutoff exp(-64)). reflections: R > 1 gives w
    [B, T, H, R, D] and beta [B, T, H, R] (`make_reflection_inputs`)."""

    B: int = 1
    T: int = 48
    HQ: int = 2
    H: int = 1
    D: int = 32
    Dv: int = 32
    gates: bool = True
    cu: tuple[int, ...] | None = None
    scale: float | None = None
    special: str = ""
    reflections: int = 1

    def inputs(self, dtype: torch.dtype = torch.float32) -> tuple:
        if self.reflections > 1:
            q, k, v, w, beta, g = make_reflection_inputs(
                self.B, self.T, self.HQ, self.H, self.D, self.Dv, self.reflections, self.gates)
        else:
            q, k, v, w, beta, g = make_inputs(self.B, self.T, self.HQ, self.H, self.D,
                                              self.Dv, self.gates)
        gen = torch.Generator().manual_seed(1)
        norms = torch.rand(self.B, self.T, self.H, 1, generator=gen)  # [B, T, H, 1]
        if w.ndim == 5:  # one norm per token, for all its reflections
            norms = norms[..., None]  # [B, T, H, 1, 1]
        if self.special == "gate_cliff":
            g[:, 20:40] = -50.0
        elif self.special == "gate_wall":
            g[:, [3, 21]] = -1e5
        elif self.special == "gate_ramp":
            g = torch.full_like(g, -1.5)
        elif self.special == "beta0":
            beta = torch.zeros_like(beta)
        elif self.special == "beta2":
            beta = torch.full_like(beta, 2.0)
        elif self.special == "beta0or2":
            beta = 2.0 * (torch.rand(beta.shape, generator=gen) < 0.5)
        elif self.special == "w_free":
            w = w * norms
        elif self.special == "w_big":
            w = w * (1 + 0.5 * norms)
        elif self.special == "sharp":
            q = q * 10
        else:
            assert not self.special, self.special
        return cast((q, k, v, w, beta, g), dtype)

    def dout(self) -> torch.Tensor:
        return make_dout(self.B, self.T, self.HQ, self.Dv)

    def kwargs(self) -> dict:
        cu = None if self.cu is None else torch.tensor(self.cu)
        return {"cu_seqlens": cu, "scale": self.scale}

    def __str__(self) -> str:
        s = f"B{self.B}-T{self.T}-HQ{self.HQ}H{self.H}-D{self.D}-Dv{self.Dv}"
        s += "-gates" if self.gates else "-nogates"
        if self.cu is not None:
            s += "-cu" + "_".join(map(str, self.cu))
        if self.scale is not None:
            s += f"-scale{self.scale}"
        if self.reflections > 1:
            s += f"-R{self.reflections}"
        return s + (f"-{self.special}" if self.special else "")


@functools.cache
def reference(case: Case):
    """float64 naive (o, grads) of the case; cached, as backends and block sizes share it."""
    return run_with_grads(path_attn_naive, case.inputs(torch.float64), case.dout(),
                          **case.kwargs())


def check_fp32(backend, case: Case, block_size: int | None = None, inputs: tuple | None = None,
               **kwargs):
    """Run the backend in float32 (or on `inputs`), compare output and every gradient to the
    float64 reference of `case`; returns (o, grads)."""
    __tracebackhide__ = True
    inputs = case.inputs() if inputs is None else inputs
    ours = run_with_grads(backend.op, inputs, case.dout(), block_size=block_size,
                          **{**case.kwargs(), **kwargs})
    assert ours[0].dtype == torch.float32
    assert_close_to_reference(ours, reference(case), F32_TOL)
    return ours
