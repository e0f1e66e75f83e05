"""The op's execution paths, for fault tests that must hold on every one of them.

- "cpu-kernel": the blockwise algorithm with the fused C++ kernels (the CPU default);
- "torch": the same algorithm in PyTorch ops (PATHATTN_CPU_KERNEL=0);
- "triton": the Triton kernels under Triton's CPU interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import pytest

from pathattn import path_attn
from pathattn.ops.cpu import load_kernels

BACKENDS = ["cpu-kernel", "torch", "triton"]


@pytest.fixture(params=BACKENDS)
def op(request, monkeypatch):
    """path_attn restricted to one backend (skips the kernel path where it cannot build)."""
    name = request.param
    if name == "cpu-kernel" and not load_kernels():
        pytest.skip("CPU kernel could not be built")
    if name == "torch":
        monkeypatch.setenv("PATHATTN_CPU_KERNEL", "0")
    if name == "triton":
        pytest.importorskip("triton")

    def run(*inputs, **kwargs):
        if name == "triton":
            kwargs = {**kwargs, "backend": "triton", "block_size": 16}
        return path_attn(*inputs, **kwargs)

    run.name = name
    return run
