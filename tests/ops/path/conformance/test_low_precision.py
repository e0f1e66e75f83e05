"""bfloat16 / float16 on every backend that takes them, judged the flash-attention way: the
error of the backend against float64 may be at most twice the error of plain PyTorch doing
the same computation at that precision (`path_attn_naive` with dtype=None), plus 1e-5, for
the output and every gradient; both are measured on the same rounded inputs and output
gradient, so only the computation's own rounding counts.
"""

from __future__ import annotations

import pytest
import torch

from pathattn.ops import path_attn_naive

from .._helpers import cast, errors, run_with_grads
from ._cases import Case
from ._specs import LOW_DTYPES

# (backend, dtype, case) -> why its error is above the rule (strict: a pass fails the
# test, so the entry goes when the defect does)
KNOWN_DEFECTS: dict[tuple[str, str, str], str] = {}


@pytest.mark.parametrize("case", [
    Case(T=65, HQ=4, H=2), Case(T=65, HQ=4, H=1, D=48, gates=False),
    Case(T=50, cu=(0, 1, 20, 50)),
], ids=str)
def test_low_precision_like_flash_attention(request, backend, low_dtype, case):
    why = KNOWN_DEFECTS.get((backend.name, LOW_DTYPES[low_dtype], str(case)))
    if why is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))
    inputs, dout = case.inputs(low_dtype), case.dout().to(low_dtype)
    kwargs = case.kwargs()
    ours = run_with_grads(backend.op, inputs, dout, block_size=backend.block_size, **kwargs)
    plain = run_with_grads(path_attn_naive, inputs, dout, dtype=None, **kwargs)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, **kwargs)
    assert ours[0].dtype == low_dtype
    assert all(gr.dtype == low_dtype for gr in ours[1] if gr is not None)
    e_ours, e_plain = errors(ours, ref), errors(plain, ref)
    bad = {n: (e_ours[n], e_plain[n]) for n in e_ours if not e_ours[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(ours, plain) relative errors: {bad}"
