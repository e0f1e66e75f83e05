"""The op inside an autocast region computes exactly as outside it (its own precision rule:
float32 accumulation, q's dtype out), on the CPU kernel and the PyTorch path alike."""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn
from pathattn.ops import path_attn_with_keys
from tests.ops.path._helpers import make_dout, make_inputs, run_with_grads


@pytest.mark.parametrize("kernel", ["1", "0"], ids=["cpu-kernel", "torch"])
def test_autocast_region_changes_nothing(kernel, monkeypatch):
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", kernel)
    inputs = make_inputs(1, 40, 2, 1, 16, 16)
    dout = make_dout(1, 40, 2, 16)
    plain = run_with_grads(path_attn, inputs, dout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = run_with_grads(path_attn, inputs, dout)
        o_keys = path_attn_with_keys(*inputs)
    assert mixed[0].dtype == torch.float32
    torch.testing.assert_close(mixed[0], plain[0], rtol=0, atol=0)
    for got, ref in zip(mixed[1], plain[1], strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    torch.testing.assert_close(o_keys[0], plain[0], rtol=0, atol=0)
