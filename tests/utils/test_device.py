"""`pathattn.utils.device`: the --device value, the torchrun rank's GPU, the distributed
backend, AdamW's implementation and the batch transfer, with CUDA's availability
monkeypatched (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from pathattn.utils.device import (
    distributed_backend,
    fused_optimizer,
    resolve_device,
    to_device,
)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two CUDA devices that exist for resolve_device; set_device calls are recorded."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return calls


def test_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=r"^--device cuda(:0)?: CUDA is not available"):
            resolve_device(name)
    with pytest.raises(ValueError, match="^--teacher-device cuda"):
        resolve_device("cuda", flag="--teacher-device")


def test_not_a_device():
    with pytest.raises(ValueError, match="^--device: 'gpu0' is not a torch device"):
        resolve_device("gpu0")


def test_with_cuda(fake_cuda, monkeypatch):
    assert resolve_device(None) == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda") and fake_cuda == []
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert fake_cuda == [torch.device("cuda", 1)]
    with pytest.raises(ValueError, match="has 2 CUDA device"):
        resolve_device("cuda:2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # torchrun: "cuda" is this rank's GPU
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")


def test_what_the_device_decides():
    assert distributed_backend("cpu") == "gloo"
    assert distributed_backend(torch.device("cuda", 3)) == "nccl"
    assert fused_optimizer("cpu") == {} and fused_optimizer("cuda:0") == {"fused": True}
    x = torch.arange(4)
    assert to_device(x, torch.device("cpu")) is x  # the CPU path: a plain .to


def test_trainer_optimizer_on_cpu_unchanged():
    """The CPU's AdamW keeps torch's default implementation (bit-identical runs)."""
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.AdamW(params, **fused_optimizer(torch.device("cpu")))
    assert not opt.defaults.get("fused")
