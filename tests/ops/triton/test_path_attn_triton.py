"""path_attn(backend="triton") against the float64 naive reference: forward and every
gradient (q, k, v, w, beta, g), as tests/ops/test_path_attn.py does for the PyTorch path.

float32 must match to a relative error below 1e-4; bfloat16 / float16 are judged the
flash-attention way, against plain PyTorch at the same precision. Without CUDA the kernels
run on Triton's interpreter (see conftest.py), so the sizes are small; block_size=16 makes
T <= 100 span up to 7 blocks, and `seg` sets the backward's segment length (its state
recomputation has a separate path for the query block's own segment and earlier ones).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from pathattn import path_attn  # noqa: E402
from pathattn.ops import path_attn_naive  # noqa: E402
from pathattn.ops.triton.op import path_attn_triton  # noqa: E402

from .._helpers import assert_close_to_reference, cast, errors, make_dout, make_inputs  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32_TOL = 1e-4
CU_70 = (0, 1, 2, 19, 19, 50, 51, 70)  # lengths 1, 1, 17, 0, 31, 1, 19


@dataclass(frozen=True)
class Case:
    B: int = 1
    T: int = 65
    HQ: int = 2
    H: int = 1
    D: int = 32
    Dv: int = 32
    gates: bool = True
    cu: tuple[int, ...] | None = None
    block_size: int | None = None
    seg: int = 0
    scale: float | None = None
    special: str = ""  # "sharp" (q * 10), "beta0or2" (beta in {0, 2})

    def inputs(self, dtype: torch.dtype = torch.float32) -> tuple:
        q, k, v, w, beta, g = make_inputs(self.B, self.T, self.HQ, self.H, self.D, self.Dv,
                                          self.gates)
        if self.special == "sharp":
            q = q * 10
        elif self.special == "beta0or2":
            gen = torch.Generator().manual_seed(1)
            beta = 2.0 * (torch.rand(beta.shape, generator=gen) < 0.5)
        else:
            assert not self.special, self.special
        return cast((q, k, v, w, beta, g), dtype)

    def dout(self) -> torch.Tensor:
        return make_dout(self.B, self.T, self.HQ, self.Dv)

    def cu_seqlens(self):
        return None if self.cu is None else torch.tensor(self.cu)

    def __str__(self) -> str:
        s = f"B{self.B}-T{self.T}-HQ{self.HQ}H{self.H}-D{self.D}-Dv{self.Dv}"
        s += "-gates" if self.gates else "-nogates"
        s += "" if self.cu is None else "-cu" + "_".join(map(str, self.cu))
        s += "" if self.block_size is None else f"-C{self.block_size}"
        s += f"-seg{self.seg}" if self.seg else ""
        s += "" if self.scale is None else f"-scale{self.scale}"
        return s + (f"-{self.special}" if self.special else "")


def _run(fn, inputs, dout, device=DEVICE, **kwargs):
    """o and the gradients of sum(o * dout) (None for a None input), all on the CPU."""
    xs = tuple(None if x is None else x.detach().to(device).requires_grad_() for x in inputs)
    o = fn(*xs, **kwargs)
    used = [x for x in xs if x is not None]
    grads = iter(torch.autograd.grad(o, used, dout.to(device, o.dtype), materialize_grads=True))
    return o.detach().cpu(), [None if x is None else next(grads).cpu() for x in xs]


@functools.cache
def _reference(case: Case):
    return _run(path_attn_naive, case.inputs(torch.float64), case.dout(), device="cpu",
                cu_seqlens=case.cu_seqlens(), scale=case.scale)


def _triton(case: Case, dtype=torch.float32, inputs=None):
    inputs = case.inputs(dtype) if inputs is None else inputs
    cu = case.cu_seqlens()
    return _run(path_attn_triton, inputs, case.dout().to(dtype), scale=case.scale,
                cu_seqlens=None if cu is None else cu.to(DEVICE), block_size=case.block_size,
                seg=case.seg)


def _check_fp32(case: Case):
    ours = _triton(case)
    assert ours[0].dtype == torch.float32
    assert_close_to_reference(ours, _reference(case), F32_TOL)


@pytest.mark.parametrize("D, gates", [pytest.param(32, True, id="D32-gates"),
                                      pytest.param(64, False, id="D64-nogates")])
@pytest.mark.parametrize("T", [1, 7, 64, 65, 100], ids=lambda t: f"T{t}")
def test_fp32_seq_len_x_head_dim(T, D, gates):
    """Default block size (64): one or two blocks per sequence, tails masked; B = 2, GQA."""
    _check_fp32(Case(B=2, T=T, D=D, Dv=D, gates=gates))


@pytest.mark.parametrize("case", [
    Case(T=100, block_size=16), Case(T=100, block_size=16, seg=1),
    Case(T=100, block_size=16, seg=2, gates=False), Case(T=100, block_size=32, gates=False),
    Case(B=2, T=50, HQ=2, H=2, block_size=16, seg=2),
], ids=str)
def test_fp32_many_blocks(case):
    """Several key blocks per query block: the forward scan, and the backward's segments."""
    _check_fp32(case)


@pytest.mark.parametrize("HQ, H", [pytest.param(2, 2, id="MHA"), pytest.param(4, 2, id="GQA2"),
                                   pytest.param(4, 1, id="MQA")])
def test_fp32_heads(HQ, H):
    _check_fp32(Case(T=40, HQ=HQ, H=H, block_size=16))


@pytest.mark.parametrize("D", [128, 256], ids=lambda d: f"D{d}")
def test_fp32_large_head_dims(D):
    _check_fp32(Case(T=20, HQ=1, D=D, Dv=32, block_size=16))


@pytest.mark.parametrize("case", [
    Case(T=70, cu=CU_70, block_size=16, D=48, Dv=16),
    Case(T=70, cu=CU_70, block_size=16, seg=1, gates=False),
], ids=str)
def test_fp32_cu_seqlens(case):
    """Packed sequences of uneven lengths (1, 1, 17, 0, 31, 1, 19); D = 48 pads to 64."""
    _check_fp32(case)


@pytest.mark.parametrize("case", [
    Case(T=50, block_size=16, scale=0.3), Case(T=50, block_size=16, special="sharp"),
    Case(T=50, block_size=16, gates=False, special="beta0or2"),
], ids=str)
def test_fp32_special_inputs(case):
    """A custom scale, logits far above the running max, singular transitions (beta = 1
    never occurs here, but beta in {0, 2} gives identities and reflections)."""
    _check_fp32(case)


def test_dtypes_and_strides():
    """Non-contiguous q, k, v, w; beta and g in float64; int32 cu_seqlens."""
    case = Case(T=70, cu=CU_70, block_size=16)
    q, k, v, w, beta, g = case.inputs()
    strided = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, w))
    inputs = (*strided, beta.double(), g.double())
    cu = torch.tensor(case.cu, dtype=torch.int32, device=DEVICE)
    o, grads = _run(path_attn_triton, inputs, case.dout(), cu_seqlens=cu, block_size=16)
    assert [x.dtype for x in grads] == [x.dtype for x in inputs]
    assert_close_to_reference((o, grads), _reference(case), F32_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_like_flash_attention(dtype):
    """err(ours) <= 2 err(plain PyTorch at dtype) + 1e-5, output and every gradient, both
    against float64 on the same rounded inputs."""
    case = Case(T=65, block_size=16)
    inputs, dout = case.inputs(dtype), case.dout().to(dtype)
    ours = _triton(case, dtype)
    plain = _run(path_attn_naive, inputs, dout, device="cpu", dtype=None)
    ref = _run(path_attn_naive, cast(inputs, torch.float64), dout, device="cpu")
    assert ours[0].dtype == dtype and all(gr.dtype == dtype for gr in ours[1])
    e_ours, e_plain = errors(ours, ref), errors(plain, ref)
    bad = {n: (e_ours[n], e_plain[n]) for n in e_ours if not e_ours[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(ours, plain) relative errors: {bad}"


def test_public_op_backend_triton_matches_torch():
    """path_attn(backend="triton") is the Triton path; results agree with backend="torch"."""
    case = Case(T=30, block_size=16)
    ours = _run(path_attn, case.inputs(), case.dout(), backend="triton", block_size=16)
    torch_path = _run(path_attn, case.inputs(), case.dout(), device="cpu", backend="torch")
    assert_close_to_reference(ours, torch_path, F32_TOL)


def test_empty_and_errors():
    q, k, v, w, beta, g = (x.to(DEVICE) for x in make_inputs(2, 0, 2, 1, 32, 32, True))
    assert path_attn_triton(q, k, v, w, beta, g).shape == (2, 0, 2, 32)
    q, k, v, w, beta, g = (x.to(DEVICE) for x in make_inputs(1, 8, 2, 1, 32, 32, True))
    with pytest.raises(ValueError, match="block_size"):
        path_attn_triton(q, k, v, w, beta, g, block_size=24)
    with pytest.raises(ValueError, match="float64"):
        path_attn_triton(*(x.double() for x in (q, k, v, w, beta, g)))


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU-only behaviour")
def test_backend_selection_on_cpu(monkeypatch):
    inputs = make_inputs(1, 8, 2, 1, 16, 16, True)
    with pytest.raises(ValueError, match="backend"):
        path_attn(*inputs, backend="cuda")
    # auto never picks the interpreter: CPU tensors stay on the PyTorch path
    o_auto = path_attn(*inputs)
    assert torch.equal(o_auto, path_attn(*inputs, backend="torch"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='triton'.*TRITON_INTERPRET"):
        path_attn(*inputs, backend="triton")
