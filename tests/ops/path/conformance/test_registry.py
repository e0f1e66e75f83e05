"""The backend registry: `select_backend("auto", q)` follows the documented rule (triton for
CUDA tensors but float64 when triton is installed; cpu for float32 / float64 CPU tensors
when the kernels build and PATHATTN_CPU_KERNEL is not 0; torch otherwise), an explicit
backend that cannot take the inputs or an unknown name raises, and a backend added with
`register_backend` gets every test of this suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pathattn.ops.path.backends import get_backend, select_backend
from pathattn.ops.path.triton import available as triton_available

ROOT = Path(__file__).resolve().parents[4]


def _q(dtype=torch.float32, device="cpu") -> torch.Tensor:
    return torch.zeros(1, 4, 2, 16, dtype=dtype, device=device)  # [B, T, HQ, D]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_auto_on_cpu_takes_the_kernels_when_they_build(dtype, monkeypatch):
    """TRITON_INTERPRET=1 (set for these tests without CUDA) does not make auto pick the
    interpreter: CPU tensors get "cpu" or, with the kernels off or unbuildable, "torch"."""
    kernels = get_backend("cpu").refuses(_q(dtype)) is None
    assert select_backend("auto", _q(dtype)).name == ("cpu" if kernels else "torch")
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "0")
    assert select_backend("auto", _q(dtype)).name == "torch"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_auto_on_cpu_16_bit_takes_torch(dtype):
    assert select_backend("auto", _q(dtype)).name == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64],
                         ids=["bf16", "f32", "f64"])
def test_auto_on_cuda(dtype):
    want = "triton" if triton_available() and dtype != torch.float64 else "torch"
    assert select_backend("auto", _q(dtype, "cuda")).name == want


def test_explicit_backend_that_cannot_take_the_inputs_raises(monkeypatch):
    with pytest.raises(ValueError, match=r"^backend='cpu': .*float32 or float64"):
        select_backend("cpu", _q(torch.bfloat16))
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "0")
    with pytest.raises(ValueError, match=r"^backend='cpu': .*PATHATTN_CPU_KERNEL=0"):
        select_backend("cpu", _q())
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend("cuda", _q())


def _collected(env: dict) -> list[str]:
    """Node ids of this folder's tests, collected in a fresh pytest run."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         str(Path(__file__).parent)],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_registered_backend_gets_every_test():
    """PATHATTN_CONFORMANCE_TOY=1 registers "toy" (the "torch" algorithm, no `with_keys`)
    in conftest.py before collection: it then has a test for every test "torch" has, with
    the same cases, and nothing else changes."""
    ids = _collected({"PATHATTN_CONFORMANCE_TOY": "1"})
    name = re.compile(r"(?<=[\[-])(torch|toy)(?=[\]-])")
    torch_ids = {i for i in ids if re.search(r"[\[-]torch[\]-]", i)}
    toy_ids = {i for i in ids if re.search(r"[\[-]toy[\]-]", i)}
    assert torch_ids and {name.sub("torch", i) for i in toy_ids} == torch_ids
    without = _collected({"PATHATTN_CONFORMANCE_TOY": "0"})
    assert sorted(set(ids) - toy_ids) == sorted(without)


def test_unregister_backend_undoes_register():
    from pathattn.ops.path.backends import (
        Backend,
        backend_names,
        register_backend,
        unregister_backend,
    )

    before = backend_names()
    toy = register_backend(Backend("toy_unregister", get_backend("torch").attention,
                                   lambda q: None, auto=lambda q: False))
    assert backend_names() == before + ("toy_unregister",)
    assert unregister_backend("toy_unregister") is toy
    assert backend_names() == before
    with pytest.raises(ValueError, match="backend must be one of"):
        unregister_backend("toy_unregister")
    with pytest.raises(ValueError, match="selection rule"):
        unregister_backend("auto")
    register_backend(toy)  # the name is free again
    unregister_backend("toy_unregister")
