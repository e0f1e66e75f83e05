"""Just-in-time build of the fused CPU kernels (scan_fwd.cpp, scan_bwd.cpp, ut_fwd.cpp,
ut_bwd.cpp, flops.cpp's FLOP counter and workspace.cpp's reusable memory; the headers
common.h, rows.h, scan_common.h, ut_common.h and workspace.h) with torch.utils.cpp_extension.

The kernel is compiled on first use (about 10 to 30 s, announced by one line on stderr;
cached under torch's extension directory, TORCH_EXTENSIONS_DIR) for the instruction set
torch reports for this CPU, and registered as torch.ops.pathattn_cpu.*. Where it cannot be
built (no C++ compiler, no ninja, a platform we do not know) `load_kernels` warns once and
returns False: every caller then runs the PyTorch implementation, which computes the same
numbers more slowly.

The cache never hangs a process and never serves a half-built library:

* Content-addressed folders. A build lives in `<root>/pathattn_cpu_<isa>_<key>`, key a hash
  of everything the binary depends on (the sources and headers, the flags, the torch and
  Python builds, $CXX). A published folder is never modified, so a process that finds it
  loads the library directly: no compiler, no ninja, no lock (a warm start is one dlopen).
  Changed sources or flags give a new key, hence a new build, never a stale binary.
  (torch's own rebuild test, a hash of sources and flags kept in memory per process plus
  ninja's timestamps in one shared folder, would rebuild in place, which is not atomic.)
* Atomic publication. A cold build compiles in a private folder
  `<root>/.pathattn_cpu_<isa>_<key>.tmp-<random>`, loads the result there and only then
  renames the folder into place (one rename on one file system). A build killed at any
  moment leaves at most a temporary folder that nobody loads; the next builder deletes it.
  torch's FileBaton `lock` file, which records no owner and is never cleared when its
  process dies, is only ever created inside that private folder, so a stale one is never
  waited on.
* An owner-aware lock. Builders of one key serialise on `<root>/pathattn_cpu_<isa>_<key>
  .lock`, an fcntl.flock lock: the OS drops it when its holder dies (SIGKILL included), so a
  killed builder's lock is free at once. The file names the holder (pid, host, start time)
  for messages; a clean release empties it, so a builder that finds it non-empty knows the
  last build was interrupted, says so and builds again. The file itself is kept (deleting
  a flock file would let two processes lock two different files).
* A bounded wait. A process that finds a live builder says so on stderr and waits at most
  PATHATTN_CPU_KERNEL_BUILD_TIMEOUT seconds (default 600; 0 gives up at once), then warns,
  naming the lock file and its holder, and uses the PyTorch path for the rest of the
  process. Without fcntl (Windows) builds do not wait for each other: each builds in its
  own folder and the first rename wins.

Set PATHATTN_CPU_KERNEL=0 to never build or use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from ....utils.io import move_into_place

try:
    import fcntl
except ImportError:  # Windows: no inter-process lock, see the module docstring
    fcntl = None

__all__ = ["load_kernels", "kernel_enabled", "build_timeout", "build_paths", "build_lock",
           "BuildPaths"]

_HERE = Path(__file__).parent
_SOURCES = [_HERE / n for n in ("scan_fwd.cpp", "scan_bwd.cpp", "ut_fwd.cpp", "ut_bwd.cpp",
                                  "flops.cpp", "workspace.cpp")]
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool once a build was tried, "error": its message

# Instruction-set flags per torch CPU capability (x86-64). The extension name carries the
# capability so that a cache shared by different machines never runs foreign code.
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
# as torch's own kernels: no errno and no FP traps, which lets gcc vectorise the exp loop
_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
_LDFLAGS = ["-fopenmp"]

TIMEOUT_ENV = "PATHATTN_CPU_KERNEL_BUILD_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
_LIBRARY_FILE = "LIBRARY"  # in a published folder: the file name of the built library
_POLL_S = 0.1


def kernel_enabled() -> bool:
    """False when the user turned the kernel off with PATHATTN_CPU_KERNEL=0."""
    flag = os.environ.get("PATHATTN_CPU_KERNEL", "1").strip().lower()
    return flag not in ("0", "false", "no", "off")


def build_timeout() -> float:
    """Seconds to wait for another process's build: PATHATTN_CPU_KERNEL_BUILD_TIMEOUT
    (a number >= 0), default 600 (a cold build takes well under a minute)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # also rejects nan
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


def _isa() -> str:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "DEFAULT"
    cap = torch.backends.cpu.get_cpu_capability()
    return cap if cap in _ISA_FLAGS else "DEFAULT"


def _ensure_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; a pip-installed ninja lives next to python."""
    if shutil.which("ninja") is None:
        bindir = str(Path(sys.executable).parent)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


# ------------------------------------------------------------------------- cache layout


def _extensions_root() -> Path:
    """torch's extension root: TORCH_EXTENSIONS_DIR, else its per-user default with the
    Python / accelerator subfolder that torch itself uses (py311_cpu, py311_cu121, ...)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return Path(root)
    from torch.utils.cpp_extension import get_default_build_root

    if torch.version.hip is not None:
        accel = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        accel = "cu" + torch.version.cuda.replace(".", "")
    else:
        accel = "cpu"
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{py}_{accel}"


def _flags(isa: str) -> tuple[list[str], list[str]]:
    return _CFLAGS + _ISA_FLAGS.get(isa, []), list(_LDFLAGS)


def _build_key(isa: str) -> str:
    """Hash of everything the built library depends on (see the module docstring)."""
    h = hashlib.sha256()
    for path in sorted(_HERE.glob("*.cpp")) + sorted(_HERE.glob("*.h")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    cflags, ldflags = _flags(isa)
    for part in (cflags, ldflags, [torch.__version__, str(torch.version.git_version),
                                   sys.version, platform.machine(),
                                   os.environ.get("CXX", "")]):
        h.update("\0".join(part).encode() + b"\1")
    return h.hexdigest()[:16]


class BuildPaths:
    """Where one build lives: `final` (the published folder), `lock` (the build lock file)
    and the temporary folders `root / (tmp_prefix + random)` of builds in progress."""

    def __init__(self, root: Path, isa: str):
        self.root = root
        self.name = f"pathattn_cpu_{isa.lower()}_{_build_key(isa)}"
        self.final = root / self.name
        self.lock = root / f"{self.name}.lock"
        self.tmp_prefix = f".{self.name}.tmp-"


def build_paths() -> BuildPaths:
    """The cache paths of the kernels for this machine, sources and environment."""
    return BuildPaths(_extensions_root(), _isa())


def _published_library(paths: BuildPaths) -> Path | None:
    """The library of a published build, or None when there is none yet."""
    try:
        name = (paths.final / _LIBRARY_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return paths.final / name


# ---------------------------------------------------------------------------- the lock


def _holder_line() -> str:
    return (f"pid {os.getpid()} on {socket.gethostname()} since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}")


def _read_holder(f) -> str:
    f.seek(0)
    return f.read().strip()


@contextlib.contextmanager
def build_lock(lock_path: Path, timeout: float):
    """Hold the build lock of `lock_path` (an fcntl.flock lock, see the module docstring).

    Yields (True, previous) once held, previous the holder line left by an interrupted
    build ("" after a clean release), or (False, holder) when another process still holds
    it after `timeout` seconds. Without fcntl it yields (True, "") at once.
    """
    if fcntl is None:
        yield True, ""
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    f = os.fdopen(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
    try:
        if not _wait_for_lock(f, lock_path, timeout):
            yield False, _read_holder(f) or "unknown holder"
            return
        previous = _read_holder(f)
        f.seek(0)
        f.truncate()
        f.write(_holder_line() + "\n")
        f.flush()
        try:
            yield True, previous
        finally:
            f.seek(0)
            f.truncate()  # a clean release: the next holder finds an empty file
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        f.close()


def _wait_for_lock(f, lock_path: Path, timeout: float) -> bool:
    """flock(f) within `timeout` seconds; says once on stderr who it waits for."""
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not announced:
            announced = True
            print(f"pathattn: waiting up to {left:.0f} s for another process building the "
                  f"CPU kernels ({_read_holder(f) or 'unknown holder'}; lock {lock_path})",
                  file=sys.stderr, flush=True)
        time.sleep(min(_POLL_S, left))


# --------------------------------------------------------------------- build and load


def load_kernels() -> bool:
    """Build (or load from the cache) and register the CPU kernels; True on success."""
    if not kernel_enabled():
        return False
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        timeout = build_timeout()
        try:
            _state["ok"] = _load_or_build(build_paths(), timeout)
            if _state["ok"]:
                _register_fake()
        except Exception as e:  # no compiler, no ninja, build error: fall back, loudly once
            _state["ok"] = False
            _state["error"] = f"{type(e).__name__}: {e}"
            warnings.warn(
                "pathattn: could not build the fused CPU kernel, using the slower PyTorch "
                f"scan instead ({_state['error'][:300]}). Set PATHATTN_CPU_KERNEL=0 to "
                "silence this.", RuntimeWarning, stacklevel=3)
    return bool(_state["ok"])


def _load_or_build(paths: BuildPaths, timeout: float) -> bool:
    """Load the published build, or build it under the lock; False (with a warning) when
    another builder holds the lock past `timeout`."""
    library = _published_library(paths)
    if library is not None:
        torch.ops.load_library(str(library))
        return True
    with build_lock(paths.lock, timeout) as (held, holder):
        if not held:
            _state["error"] = f"timed out waiting for the build lock {paths.lock}"
            warnings.warn(
                f"pathattn: gave up after {timeout:g} s waiting for the CPU kernel build "
                f"lock {paths.lock} (held by {holder}); using the slower PyTorch path in "
                f"this process. Raise {TIMEOUT_ENV} if builds are slow here, or stop the "
                "stuck process.", RuntimeWarning, stacklevel=4)
            return False
        library = _published_library(paths)  # built while we waited
        if library is None:
            _build_and_publish(paths, holder)
        else:
            torch.ops.load_library(str(library))
    return True


def _remove_leftovers(paths: BuildPaths) -> None:
    """Temporary folders of builds of this key that died (only the lock holder builds), and
    a final folder without its LIBRARY file (not made by a rename of ours: never loaded)."""
    for tmp in paths.root.glob(paths.tmp_prefix + "*"):
        shutil.rmtree(tmp, ignore_errors=True)
    if paths.final.exists() and _published_library(paths) is None:
        shutil.rmtree(paths.final, ignore_errors=True)


def _build_and_publish(paths: BuildPaths, interrupted: str) -> None:
    """Compile in a private folder, load the library from there, then rename the folder to
    `paths.final` (a library that fails to build or load is never published)."""
    if fcntl is not None:
        _remove_leftovers(paths)
    again = f"; the last build ({interrupted}) was interrupted" if interrupted else ""
    print(f"pathattn: compiling the fused CPU kernels into {paths.final} (once, about "
          f"10 to 30 s{again})", file=sys.stderr, flush=True)
    paths.root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=paths.tmp_prefix, dir=paths.root))
    try:
        from torch.utils.cpp_extension import load

        _ensure_ninja_on_path()
        cflags, ldflags = _flags(_isa())
        library = load(name=paths.name, sources=[str(p) for p in _SOURCES],
                       extra_cflags=cflags, extra_ldflags=ldflags, build_directory=str(tmp),
                       is_python_module=False, verbose=False)
        (tmp / _LIBRARY_FILE).write_text(Path(library).name + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0o700 would hide a shared TORCH_EXTENSIONS_DIR
        try:
            move_into_place(tmp, paths.final)
        except OSError:
            if _published_library(paths) is None:  # not a concurrent publisher: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename


def _register_fake() -> None:
    """Shapes of the kernel's outputs for fake tensors (torch.compile, meta tracing)."""

    @torch.library.register_fake("pathattn_cpu::scan_fwd")
    def _(qt, kt, pt, s_diag, vb, pred, G, group=4):
        NB, H, R, _ = qt.shape
        return qt.new_empty(NB, H, R, vb.shape[-1]), qt.new_empty(NB, H, R)

    @torch.library.register_fake("pathattn_cpu::ut_fwd")
    def _(qb, kb, wb, bb, scale, sub_block):
        NB, H, Gr, C, D = qb.shape
        return (qb.new_empty(NB, H, Gr * C, D), torch.empty_like(kb), qb.new_empty(NB, H, D, D),
                qb.new_empty(NB, H, Gr * C, C))

    @torch.library.register_fake("pathattn_cpu::scan_fwd_tokens")
    def _(qt, kt, pt, s_diag, v, start, pred, G, group=4):
        HQ = qt.shape[1] * (qt.shape[2] // kt.shape[2])
        return qt.new_empty(v.shape[0], HQ, v.shape[-1]), qt.new_empty(v.shape[0], HQ)

    @torch.library.register_fake("pathattn_cpu::ut_fwd_tokens")
    def _(q, k, w, beta, start, block, scale, sub_block):
        NB, H, Gr, D = start.shape[0], k.shape[1], q.shape[1] // k.shape[1], q.shape[2]
        return (q.new_empty(NB, H, Gr * block, D), q.new_empty(NB, H, block, D),
                q.new_empty(NB, H, D, D), q.new_empty(NB, H, Gr * block, block))

    @torch.library.register_fake("pathattn_cpu::ut_bwd_tokens")
    def _(q, k, w, beta, start, block, scale, sub_block, dqt, dkt, dpt, ds):
        return tuple(x.new_empty(x.shape) for x in (q, k, w, beta))

    @torch.library.register_fake("pathattn_cpu::scan_bwd_tokens")
    def _(qt, kt, pt, s_diag, v, start, pred, G, dout, lse, delta, group=4):
        dcol = qt.new_empty(G.shape) if G is not None else qt.new_empty(0)
        return (torch.empty_like(qt), torch.empty_like(kt), torch.empty_like(pt),
                torch.empty_like(s_diag), v.new_empty(v.shape), dcol)

    @torch.library.register_fake("pathattn_cpu::ut_bwd")
    def _(qb, kb, wb, bb, scale, sub_block, dqt, dkt, dpt, ds):
        return (torch.empty_like(qb), torch.empty_like(kb), torch.empty_like(wb),
                torch.empty_like(bb))

    @torch.library.register_fake("pathattn_cpu::scan_bwd")
    def _(qt, kt, pt, s_diag, vb, pred, G, dout, lse, delta, group=4):
        dcol = qt.new_empty(G.shape) if G is not None else qt.new_empty(0)
        return (torch.empty_like(qt), torch.empty_like(kt), torch.empty_like(pt),
                torch.empty_like(s_diag), torch.empty_like(vb), dcol)
