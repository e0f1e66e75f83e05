"""Building the CPU kernel: the switch and the fallback when the build fails."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.cpu import build


def test_env_switch(monkeypatch):
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv("PATHATTN_CPU_KERNEL", off)
        assert not build.kernel_enabled()
        assert build.load_kernels() is False
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "1")
    assert build.kernel_enabled()


def test_failed_build_warns_once_and_falls_back(monkeypatch):
    import torch.utils.cpp_extension as ext

    def broken(*args, **kwargs):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(ext, "load", broken)
    monkeypatch.setattr(build, "_state", {})
    monkeypatch.delenv("PATHATTN_CPU_KERNEL", raising=False)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert build.load_kernels() is False
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build.load_kernels() is False  # tried once: no second build, no warning


def test_isa_flags_match_torch_capability():
    isa = build._isa()
    assert isa in ("AVX512", "AVX2", "DEFAULT")
    if isa != "DEFAULT":
        assert torch.backends.cpu.get_cpu_capability() == isa
