"""`row_dot` (the backward's delta = rowsum(dO * O) in one kernel) against its float64
definition: dtypes, a low part, strided and expanded inputs, row counts that do not fill
the last program, head dims that are not powers of two; and its argument errors."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.common import row_dot as rd  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,H,D", [(37, 3, 64), (5, 2, 48), (1, 1, 16), (300, 4, 256)])
def test_matches_float64(dtype, N, H, D):
    gen = torch.Generator().manual_seed(N * H + D)
    a, b = (torch.randn(N, H, D, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    got = rd.row_dot(a, b)
    assert got.dtype == torch.float32 and got.shape == (N, H)
    # float32 products and sum of the rounded inputs: float32 accuracy, whatever the dtype
    assert _rel(got, rd.row_dot_reference(a, b)) < 1e-6


def test_low_part_is_added():
    gen = torch.Generator().manual_seed(1)
    a, b = (torch.randn(70, 2, 64, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    lo = (1e-3 * torch.randn(70, 2, 64, generator=gen)).bfloat16().to(DEVICE)
    ref = rd.row_dot_reference(a, b, lo)
    assert _rel(rd.row_dot(a, b, lo), ref) < 1e-6
    assert _rel(rd.row_dot(a, b), ref) > 1e-5  # the low part matters at this size


def test_strided_and_expanded_inputs():
    gen = torch.Generator().manual_seed(2)
    big = torch.randn(40, 6, 2 * 64, generator=gen).to(DEVICE)
    a = big[:, ::2, ::2]  # strides along every dim
    b = torch.randn(1, 3, 64, generator=gen).to(DEVICE).expand(40, 3, 64)  # stride 0 on N
    assert _rel(rd.row_dot(a, b), rd.row_dot_reference(a, b)) < 1e-6


def test_rows_past_a_program():
    """More rows than one program holds, the last program partly filled."""
    rows = rd._ELEMENTS[rd.interpreting()] // 64
    a = torch.ones(rows + 3, 1, 64, device=DEVICE)
    b = torch.arange(rows + 3, dtype=torch.float32, device=DEVICE)[:, None, None].expand(
        rows + 3, 1, 64)
    assert torch.equal(rd.row_dot(a, b), 64 * b[:, :, 0])


def test_empty_and_errors():
    assert rd.row_dot(torch.empty(0, 2, 8), torch.empty(0, 2, 8)).shape == (0, 2)
    with pytest.raises(ValueError, match="b must be"):
        rd.row_dot(torch.ones(2, 3, 4), torch.ones(2, 3, 5))
    with pytest.raises(ValueError, match="b_lo must be"):
        rd.row_dot(torch.ones(2, 3, 4), torch.ones(2, 3, 4), torch.ones(6, 4))
    with pytest.raises(ValueError, match="a must be"):
        rd.row_dot(torch.ones(6, 4), torch.ones(6, 4))
