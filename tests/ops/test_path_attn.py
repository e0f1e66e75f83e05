"""path_attn (blockwise op) against the float64 naive reference: forward and every gradient.

float32 must match to a relative error (||ours - ref|| / ||ref||) below 1e-4; float16 and
bfloat16 are judged the flash-attention way, against plain PyTorch at the same precision.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch

from pathattn import path_attn
from pathattn.ops import path_attn_naive

from ._helpers import (
    NAMES,
    assert_close_to_reference,
    cast,
    errors,
    make_dout,
    make_inputs,
    run_with_grads,
)

F32_TOL = 1e-4


@dataclass(frozen=True)
class Case:
    """One input configuration; `special` edits the layer-like inputs of `make_inputs`:
    "gate_cliff" (g = -50 on tokens 100..149), "beta0", "beta2", "beta0or2", "w_free"
    (w of norm in (0, 1) instead of unit), "w_big" (norms in (1, 1.5): transforms that
    expand), "sharp" (q * 10: logits far above the running max, so the forward scan must
    rescale instead of taking its no-rescale shortcut), or "gate_ramp" (g = -0.5 on every
    token: probabilities fall smoothly through blockwise.py's exp cutoff, exp(-64), down to
    exp(-150))."""

    B: int = 2
    T: int = 65
    HQ: int = 4
    H: int = 2
    D: int = 64
    Dv: int = 64
    gates: bool = True
    cu: tuple[int, ...] | None = None
    scale: float | None = None
    special: str = ""

    def inputs(self, dtype: torch.dtype = torch.float32) -> tuple:
        q, k, v, w, beta, g = make_inputs(self.B, self.T, self.HQ, self.H, self.D, self.Dv,
                                          self.gates)
        gen = torch.Generator().manual_seed(1)
        if self.special == "gate_cliff":
            g[:, 100:150] = -50.0
        elif self.special == "gate_ramp":
            g = torch.full_like(g, -0.5)
        elif self.special == "beta0":
            beta = torch.zeros_like(beta)
        elif self.special == "beta2":
            beta = torch.full_like(beta, 2.0)
        elif self.special == "beta0or2":
            beta = 2.0 * (torch.rand(beta.shape, generator=gen) < 0.5)
        elif self.special == "w_free":
            w = w * torch.rand(self.B, self.T, self.H, 1, generator=gen)  # [B, T, H, 1] norms
        elif self.special == "w_big":
            w = w * (1 + 0.5 * torch.rand(self.B, self.T, self.H, 1, generator=gen))
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
        return s + (f"-{self.special}" if self.special else "")


@functools.cache
def _reference(case: Case):
    """float64 naive (o, grads) of the case; cached, as block sizes share it."""
    return run_with_grads(path_attn_naive, case.inputs(torch.float64), case.dout(),
                          **case.kwargs())


def _check_fp32(case: Case, block_size: int | None = None):
    """Run path_attn in float32 and compare output and gradients to the reference."""
    ours = run_with_grads(path_attn, case.inputs(), case.dout(), block_size=block_size,
                          **case.kwargs())
    assert ours[0].dtype == torch.float32
    assert_close_to_reference(ours, _reference(case), F32_TOL)
    return ours


# every sequence length with every head dim, half of them without gates (gates make far
# keys negligible: without them every Householder product matters); Dv = 32 differs from D
@pytest.mark.parametrize("D, gates", [
    pytest.param(16, True, id="D16-gates"), pytest.param(48, False, id="D48-nogates"),
    pytest.param(64, True, id="D64-gates"), pytest.param(128, False, id="D128-nogates"),
])
@pytest.mark.parametrize("T", [1, 7, 64, 65, 300], ids=lambda t: f"T{t}")
def test_fp32_seq_len_x_head_dim(T, D, gates):
    _check_fp32(Case(T=T, D=D, Dv=32, gates=gates))


HEADS = [pytest.param(2, 2, id="MHA"), pytest.param(4, 2, id="GQA2"),
         pytest.param(8, 2, id="GQA4"), pytest.param(4, 1, id="MQA")]
BLOCK_SIZES = [None, 16, 32, 128]


@pytest.mark.parametrize("block_size", BLOCK_SIZES, ids=lambda c: f"C{c or 'default'}")
@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
@pytest.mark.parametrize("HQ, H", HEADS)
@pytest.mark.parametrize("T", [65, 300], ids=lambda t: f"T{t}")
def test_fp32_heads_gates_block_size(T, HQ, H, gates, block_size):
    _check_fp32(Case(T=T, HQ=HQ, H=H, gates=gates), block_size)


@pytest.mark.parametrize("block_size", [1, 5, 24, 100, 512], ids=lambda c: f"C{c}")
def test_fp32_unusual_block_sizes(block_size):
    _check_fp32(Case(T=300, gates=False), block_size)


CU_70 = (0, 1, 2, 19, 19, 50, 51, 70)  # lengths 1, 1, 17, 0, 31, 1, 19
CU_300 = (0, 3, 3, 131, 132, 300)  # lengths 3, 0, 128, 1, 168: uneven block counts
CU_CASES = [
    pytest.param(Case(B=1, T=70, cu=CU_70), None, id="T70-gates"),
    pytest.param(Case(B=1, T=70, cu=CU_70), 16, id="T70-gates-C16"),
    pytest.param(Case(B=1, T=70, cu=CU_70, gates=False), 16, id="T70-nogates-C16"),
    pytest.param(Case(B=1, T=70, HQ=4, H=1, D=48, Dv=16, cu=CU_70), 5, id="T70-MQA-D48-C5"),
    pytest.param(Case(B=1, T=300, cu=CU_300), None, id="T300-gates"),
    pytest.param(Case(B=1, T=300, cu=CU_300, gates=False), 32, id="T300-nogates-C32"),
]


@pytest.mark.parametrize("case, block_size", CU_CASES)
def test_fp32_cu_seqlens(case, block_size):
    _check_fp32(case, block_size)


def test_fp32_cu_seqlens_int32():
    case = Case(B=1, T=70, cu=CU_70)
    ours = run_with_grads(path_attn, case.inputs(), case.dout(), block_size=16,
                          cu_seqlens=torch.tensor(case.cu, dtype=torch.int32))
    assert_close_to_reference(ours, _reference(case), F32_TOL)


@pytest.mark.parametrize("case", [
    Case(scale=0.3), Case(scale=1.0, gates=False),
    Case(special="beta0"), Case(special="beta2"), Case(special="beta0or2"),
    Case(T=300, gates=False, special="beta0or2"), Case(special="w_free"),
    Case(T=300, gates=False, special="w_free"),
    Case(T=300, gates=False, special="w_big"), Case(T=300, special="w_big"),
    Case(T=300, gates=False, special="sharp"), Case(T=300, special="sharp"),
    Case(T=300, special="gate_ramp"),
], ids=str)
def test_fp32_special_inputs(case):
    _check_fp32(case, block_size=32)


@pytest.mark.parametrize("block_size", [None, 16], ids=lambda c: f"C{c or 'default'}")
def test_fp32_large_gates_stay_finite(block_size):
    """g = -50 on 50 consecutive tokens: G falls by 2500 and keys behind the cliff get
    weight exp(-2500) = 0; nothing may turn into NaN or inf."""
    o, grads = _check_fp32(Case(T=300, special="gate_cliff"), block_size)
    for name, x in zip(("o",) + NAMES, [o, *grads], strict=True):
        assert torch.isfinite(x).all(), name


def test_beta_and_g_in_float64_with_float32_qkvw():
    """beta and g may be of any float dtype; their gradients come back in their dtype."""
    case = Case()
    q, k, v, w, beta, g = case.inputs()
    inputs = (q, k, v, w, beta.double(), g.double())
    o, grads = run_with_grads(path_attn, inputs, case.dout())
    assert o.dtype == torch.float32
    assert [x.dtype for x in grads] == [x.dtype for x in inputs]
    assert_close_to_reference((o, grads), _reference(case), F32_TOL)


def test_non_contiguous_inputs():
    """Inputs as [B, H, T, D] tensors transposed to [B, T, H, D] views (strided)."""
    case = Case()
    inputs = case.inputs()
    strided = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in inputs)
    assert not any(x.is_contiguous() for x in strided)
    ours = run_with_grads(path_attn, strided, case.dout())
    assert_close_to_reference(ours, _reference(case), F32_TOL)


def test_empty_sequence():
    case = Case(T=0)
    o, grads = run_with_grads(path_attn, case.inputs(), case.dout())
    assert o.shape == (2, 0, 4, 64)
    for x, gr in zip(case.inputs(), grads, strict=True):
        assert gr.shape == x.shape


@pytest.mark.parametrize("B, cu, block_size", [
    pytest.param(2, None, 4, id="dense-C4"),
    pytest.param(2, None, 2, id="dense-C2"),
    pytest.param(1, (0, 1, 4, 4, 9), 4, id="cu_seqlens-C4"),
])
def test_gradcheck_float64(B, cu, block_size):
    """Finite differences w.r.t. all six inputs, with gates and GQA (2 query heads per
    key/value head); T = 9 spans several blocks."""
    T, HQ, H, D, Dv = 9, 4, 2, 4, 3
    inputs = make_inputs(B, T, HQ, H, D, Dv, gates=True, dtype=torch.float64)
    inputs = tuple(x.requires_grad_() for x in inputs)
    cu_seqlens = None if cu is None else torch.tensor(cu)

    def fn(*xs):
        return path_attn(*xs, cu_seqlens=cu_seqlens, block_size=block_size)

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("case", [
    Case(T=65), Case(T=300, HQ=4, H=1, D=48, Dv=32), Case(T=300, gates=False),
], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_like_flash_attention(dtype, case):
    """err(ours) <= 2 err(plain PyTorch at `dtype`) + 1e-5 for the output and every gradient,
    both measured against float64 on the same (rounded) inputs and output gradient."""
    inputs, dout = case.inputs(dtype), case.dout().to(dtype)
    ours = run_with_grads(path_attn, inputs, dout)
    plain = run_with_grads(path_attn_naive, inputs, dout, dtype=None)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    assert ours[0].dtype == dtype
    assert all(gr.dtype == dtype for gr in ours[1] if gr is not None)
    e_ours, e_plain = errors(ours, ref), errors(plain, ref)
    bad = {n: (e_ours[n], e_plain[n]) for n in e_ours if not e_ours[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(ours, plain) relative errors: {bad}"


def test_float64_exp_cutoff_is_exact():
    """The blockwise exp cutoff (probabilities < exp(-64) of the row reference set to 0)
    leaves float64 results equal to the naive reference within 1e-10."""
    case = Case(T=300, special="gate_ramp")
    ours = run_with_grads(path_attn, case.inputs(torch.float64), case.dout(), block_size=32)
    assert_close_to_reference(ours, _reference(case), 1e-10)


def test_default_block_size_fits_short_sequences():
    """Short sequences get a block of their length rounded up to 16, not 128 (padding would
    multiply their work); the result is the same as with an explicit block size."""
    from pathattn.ops.path_attn import default_block_size

    assert default_block_size(10) == 16 and default_block_size(300) == 128
    assert default_block_size(70) == 80
    assert default_block_size(300, torch.tensor([0, 5, 30, 300])) == 128
    assert default_block_size(40, torch.tensor([0, 5, 30, 40])) == 32
    case = Case(T=20)
    inputs = case.inputs()
    o_default = path_attn(*inputs)
    torch.testing.assert_close(o_default, path_attn(*inputs, block_size=128), rtol=1e-5,
                               atol=1e-6)
