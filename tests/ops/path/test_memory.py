"""Memory of the blockwise op: forward + backward at T = 16384 must stay O(T * D), far from
the T x T = 1 GiB (float32) of one attention matrix."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIMIT_MIB = 256

# run in a fresh process: ru_maxrss is the process's high-water mark, so the baseline is
# taken right before the measured call, after the inputs exist and a small warm-up call
# has loaded the libraries
SCRIPT = r"""
import resource
import torch
import torch.nn.functional as F
from pathattn import path_attn

def inputs(T, D=64):
    # q, k, v, w [1, T, 1, D]; beta, g [1, T, 1]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, T, 1, D) for _ in range(3))
    w = F.normalize(torch.randn(1, T, 1, D), dim=-1)
    beta = 2 * torch.rand(1, T, 1)
    g = F.logsigmoid(torch.randn(1, T, 1) + 2)
    return [x.requires_grad_() for x in (q, k, v, w, beta, g)]

def forward_backward(xs):
    o = path_attn(*xs)  # [1, T, 1, D]
    o.backward(torch.ones_like(o))

forward_backward(inputs(256))
xs = inputs(16384)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
forward_backward(xs)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert all(torch.isfinite(x.grad).all() for x in xs)
print((after - before) / 1024)
"""


@pytest.mark.slow
def test_peak_rss_forward_backward_T16384():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    mib = float(res.stdout.split()[-1])
    print(f"peak RSS increase, forward + backward, T=16384 D=64 fp32: {mib:.1f} MiB")
    assert mib < LIMIT_MIB
