"""Building the CPU kernel: the switch and the fallback when the build fails."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.path.cpu import build


def test_env_switch(monkeypatch):
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv("PATHATTN_CPU_KERNEL", off)
        assert not build.kernel_enabled()
        assert build.load_kernels() is False
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "1")
    assert build.kernel_enabled()


def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ext

    def broken(*args, **kwargs):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(ext, "load", broken)
    monkeypatch.setattr(build, "_state", {})
    monkeypatch.delenv("PATHATTN_CPU_KERNEL", raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # a cold cache: must build
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert build.load_kernels() is False
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build.load_kernels() is False  # tried once: no second build, no warning
    paths = build.build_paths()
    assert not paths.final.exists()  # nothing published
    assert not list(tmp_path.glob(paths.tmp_prefix + "*"))  # the private folder is gone


def test_isa_flags_match_torch_capability():
    isa = build._isa()
    assert isa in ("AVX512", "AVX2", "DEFAULT")
    if isa != "DEFAULT":
        assert torch.backends.cpu.get_cpu_capability() == isa


@pytest.mark.parametrize("raw,want", [("", 600.0), ("2.5", 2.5), (" 0 ", 0.0)],
                         ids=["unset", "2.5", "0"])
def test_build_timeout_from_env(monkeypatch, raw, want):
    monkeypatch.setenv("PATHATTN_CPU_KERNEL_BUILD_TIMEOUT", raw)
    assert build.build_timeout() == want


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"], ids=str)
def test_build_timeout_rejects_bad_values(monkeypatch, raw):
    monkeypatch.setenv("PATHATTN_CPU_KERNEL_BUILD_TIMEOUT", raw)
    with pytest.raises(ValueError, match="PATHATTN_CPU_KERNEL_BUILD_TIMEOUT"):
        build.build_timeout()


def test_cache_key_follows_sources_and_flags(monkeypatch, tmp_path):
    """The cache folder's key is a content hash: the same for the same sources and flags
    (a warm cache stays warm in every process), a new one when a header or a flag changes
    (never a stale library)."""
    import shutil

    isa = build._isa()
    key = build._build_key(isa)
    for src in list(build._HERE.glob("*.cpp")) + list(build._HERE.glob("*.h")):
        shutil.copy(src, tmp_path / src.name)
    monkeypatch.setattr(build, "_HERE", tmp_path)
    assert build._build_key(isa) == key
    with open(tmp_path / "common.h", "a") as f:
        f.write("\n// edited\n")
    edited = build._build_key(isa)
    assert edited != key
    monkeypatch.setattr(build, "_CFLAGS", build._CFLAGS + ["-DPATHATTN_TEST_FLAG"])
    assert build._build_key(isa) not in (key, edited)
