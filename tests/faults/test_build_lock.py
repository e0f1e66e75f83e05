"""The CPU kernel build under faults: a lock left by a killed process, a live but stuck
builder, a builder killed in the middle of compiling.

Every scenario uses its own TORCH_EXTENSIONS_DIR; processes that build or load run as
subprocesses with a time limit, so a hang fails the test instead of stalling the run. The
kernels are compiled from scratch once (about 20-40 s on two cores), by the `interrupted`
fixture shared by the two tests of a killed build.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from pathattn.ops import path_attn, path_attn_naive
from pathattn.ops.path.cpu import build

pytestmark = pytest.mark.slow  # a cold build of the C++ kernels, about a minute and a half

REPO = Path(__file__).resolve().parents[2]
COLD_BUILD_S = 600  # a cold build: 20-30 s idle, over 180 s on a 2-core machine under full load;
# only a hang (a build waiting forever on a stale lock) runs into it
WARM_LOAD_S = 60

POSIX = hasattr(os, "killpg") and importlib.util.find_spec("fcntl") is not None
needs_posix = pytest.mark.skipif(not POSIX, reason="needs POSIX signals and fcntl locks")

# A fresh process: load the kernels, then check the op against the float64 reference.
LOAD_AND_CHECK = textwrap.dedent("""
    import torch
    from pathattn.ops import path_attn, path_attn_naive
    from pathattn.ops.path.cpu import load_kernels
    ok = load_kernels()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 20, 2, 8) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(1, 20, 2, 8), dim=-1)
    beta = 1.9 * torch.rand(1, 20, 2)
    ref = path_attn_naive(*(x.double() for x in (q, k, v, w, beta)))
    err = float((path_attn(q, k, v, w, beta).double() - ref).abs().max())
    print(f"LOADED={ok} ERR={err:.2e}", flush=True)
""")

# Holds a lock the way a build does, says READY, then waits to be killed.
HOLD_TORCH_BATON = textwrap.dedent("""
    import os, sys, time
    from torch.utils.file_baton import FileBaton
    os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
    FileBaton(sys.argv[1]).try_acquire()  # as torch.utils.cpp_extension's build (False:
    # a stale lock is already there)
    print("READY", flush=True)
    time.sleep(600)
""")
HOLD_BUILD_LOCK = textwrap.dedent("""
    import time
    from pathattn.ops.path.cpu import build
    with build.build_lock(build.build_paths().lock, 0) as (held, _):
        assert held
        print("READY", flush=True)
        time.sleep(600)
""")


def _env(ext_dir: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATHATTN_")}
    env.update(TORCH_EXTENSIONS_DIR=str(ext_dir), PYTHONPATH=str(REPO), **extra)
    return env


def _spawn(script: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    """A subprocess in its own session (so that its compiler children die with it)."""
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill(proc: subprocess.Popen) -> str:
    """SIGKILL the subprocess and everything it started (no cleanup code runs); the output
    it had not read yet."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.communicate()[0] or ""


def _hold(script: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    proc = _spawn(script, env, *args)
    line = proc.stdout.readline()
    if line.strip() != "READY":
        pytest.fail(f"lock holder did not start: {line}{_kill(proc)}")
    return proc


def _run(script: str, env: dict[str, str], timeout: float) -> str | None:
    """Run to the end within `timeout` seconds; its output, or None when it hung (killed)."""
    proc = _spawn(script, env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None
    assert proc.returncode == 0, out
    return out


def _assert_loaded_and_correct(out: str) -> None:
    m = re.search(r"LOADED=(\w+) ERR=(\S+)", out)
    assert m is not None, out
    assert m.group(1) == "True", out
    assert float(m.group(2)) < 1e-4, out


@needs_posix
def test_lock_of_killed_builder_is_free_at_once(tmp_path, monkeypatch):
    """SIGKILL releases the build lock (an flock lock); the next holder learns that the
    last build was interrupted, from the pid line the dead builder left."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    holder = _hold(HOLD_BUILD_LOCK, _env(tmp_path))
    pid = holder.pid
    _kill(holder)
    start = time.monotonic()
    with build.build_lock(build.build_paths().lock, timeout=5) as (held, previous):
        assert held and time.monotonic() - start < 1
        assert f"pid {pid} " in previous
    with build.build_lock(build.build_paths().lock, timeout=0) as (held, previous):
        assert held and previous == ""  # a clean release leaves no holder behind


@needs_posix
def test_live_holder_past_timeout_warns_and_falls_back(tmp_path, monkeypatch, capsys):
    """A live builder that holds the lock too long: after PATHATTN_CPU_KERNEL_BUILD_TIMEOUT
    seconds load_kernels warns, naming the lock file, and the op runs the PyTorch path."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("PATHATTN_CPU_KERNEL_BUILD_TIMEOUT", "1")
    monkeypatch.delenv("PATHATTN_CPU_KERNEL", raising=False)
    monkeypatch.setattr(build, "_state", {})
    lock = build.build_paths().lock
    holder = _hold(HOLD_BUILD_LOCK, _env(tmp_path))
    try:
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match=re.escape(str(lock))):
            assert build.load_kernels() is False
        assert 0.9 < time.monotonic() - start < 10
        q, k, v = (torch.randn(1, 20, 2, 8) for _ in range(3))
        w = torch.nn.functional.normalize(torch.randn(1, 20, 2, 8), dim=-1)
        beta = 1.9 * torch.rand(1, 20, 2)
        ref = path_attn_naive(*(x.double() for x in (q, k, v, w, beta)))
        assert float((path_attn(q, k, v, w, beta).double() - ref).abs().max()) < 1e-4
    finally:
        _kill(holder)
    assert f"pid {holder.pid} " in capsys.readouterr().err  # "waiting for ... pid N ..."
    assert not build.build_paths().final.exists()


@dataclasses.dataclass
class Interrupted:
    """What the killed build left and what the processes after it did."""

    libraries: list[Path]  # *.so files right after the kill
    rebuild: str | None = None  # output of the next process (None: it hung)
    reload: str | None = None  # output of the one after (None: it hung or was not run)


def _can_build() -> bool:
    ninja = shutil.which("ninja") or (Path(sys.executable).parent / "ninja").exists()
    return bool(ninja and shutil.which("c++") and POSIX)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, Interrupted]:
    """A cache after a build killed with SIGKILL a few seconds into compiling, with the
    stale locks it leaves; then a fresh process loads (and builds), then another one.

    The locks: whatever the killed builder held, plus (if that build did not leave one)
    an ownerless FileBaton `lock` of torch in the shared build folder that torch uses for
    the kernels by default, taken by a process killed since: what a kill left there
    before builds moved to private folders, never cleared. One
    cold build for the two tests below; a hang is recorded, not raised, so that each test
    reports it."""
    if not _can_build():
        pytest.skip("needs a C++ compiler, ninja, POSIX signals and fcntl locks")
    ext = tmp_path_factory.mktemp("extensions")
    env = _env(ext)
    builder = _spawn(LOAD_AND_CHECK, env)
    deadline = time.monotonic() + WARM_LOAD_S
    while not any(ext.rglob("build.ninja")):  # ninja is running
        if time.monotonic() > deadline or builder.poll() is not None:
            _kill(builder)
            pytest.fail("the builder never started compiling")
        time.sleep(0.1)
    time.sleep(2)  # a cold build takes far longer (about 7 s of CPU per source file)
    _kill(builder)
    result = Interrupted(libraries=list(ext.rglob("*.so")))
    legacy = ext / f"pathattn_cpu_{build._isa().lower()}" / "lock"
    _kill(_hold(HOLD_TORCH_BATON, env, str(legacy)))
    assert legacy.exists()  # its owner is gone
    result.rebuild = _run(LOAD_AND_CHECK, env, COLD_BUILD_S)
    result.reload = None if result.rebuild is None else _run(LOAD_AND_CHECK, env, WARM_LOAD_S)
    return ext, result


@needs_posix
def test_stale_locks_of_killed_build_do_not_hang(interrupted):
    """Before: the next process waited forever on torch's stale lock, printing nothing.
    Now it finishes load_kernels, with the kernels built, and the op is correct."""
    _, result = interrupted
    assert result.rebuild is not None, \
        f"load_kernels did not finish within {COLD_BUILD_S} s (hung on a stale lock)"
    _assert_loaded_and_correct(result.rebuild)
    assert "interrupted" in result.rebuild  # the dead builder was recognised


@needs_posix
def test_kill_during_build_leaves_nothing_half_built(interrupted):
    """The killed build published nothing (anything it linked stayed in its private
    folder), the next process built again and cleaned up, and the one after loads the
    cached build without compiling (a warm cache stays warm)."""
    ext, result = interrupted
    assert result.rebuild is not None and result.reload is not None, "a process hung"
    paths = build.BuildPaths(ext, build._isa())
    for lib in result.libraries:
        assert lib.parent.name.startswith(paths.tmp_prefix), lib
    assert (paths.final / "LIBRARY").is_file()
    assert not list(ext.glob(paths.tmp_prefix + "*"))
    _assert_loaded_and_correct(result.reload)
    assert "compiling" not in result.reload and "compiling" in result.rebuild
