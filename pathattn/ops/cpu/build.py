"""Just-in-time build of the fused CPU kernels (scan_fwd.cpp, scan_bwd.cpp, ut_fwd.cpp,
ut_bwd.cpp; the headers common.h, scan_common.h and ut_common.h) with
torch.utils.cpp_extension.

The kernel is compiled on first use (about 10 s; cached under torch's extension directory,
TORCH_EXTENSIONS_DIR) for the instruction set torch reports for this CPU, and registered as
torch.ops.pathattn_cpu.*. Where it cannot be built (no C++ compiler, no ninja, a platform we
do not know) `load_kernels` warns once and returns False: every caller then runs the
PyTorch implementation, which computes the same numbers more slowly.

Set PATHATTN_CPU_KERNEL=0 to never build or use it.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["load_kernels", "kernel_enabled"]

_HERE = Path(__file__).parent
_SOURCES = [_HERE / n for n in ("scan_fwd.cpp", "scan_bwd.cpp", "ut_fwd.cpp", "ut_bwd.cpp")]
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


def kernel_enabled() -> bool:
    """False when the user turned the kernel off with PATHATTN_CPU_KERNEL=0."""
    flag = os.environ.get("PATHATTN_CPU_KERNEL", "1").strip().lower()
    return flag not in ("0", "false", "no", "off")


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


def load_kernels() -> bool:
    """Build (or load from the cache) and register the CPU kernels; True on success."""
    if not kernel_enabled():
        return False
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        isa = _isa()
        try:
            from torch.utils.cpp_extension import load

            _ensure_ninja_on_path()
            load(name=f"pathattn_cpu_{isa.lower()}", sources=[str(p) for p in _SOURCES],
                 extra_cflags=_CFLAGS + _ISA_FLAGS.get(isa, []), extra_ldflags=["-fopenmp"],
                 is_python_module=False, verbose=False)
            _register_fake()
            _state["ok"] = True
        except Exception as e:  # no compiler, no ninja, build error: fall back, loudly once
            _state["ok"] = False
            _state["error"] = f"{type(e).__name__}: {e}"
            warnings.warn(
                "pathattn: could not build the fused CPU kernel, using the slower PyTorch "
                f"scan instead ({_state['error'][:300]}). Set PATHATTN_CPU_KERNEL=0 to "
                "silence this.", RuntimeWarning, stacklevel=3)
    return bool(_state["ok"])


def _register_fake() -> None:
    """Shapes of the kernel's outputs for fake tensors (torch.compile, meta tracing)."""

    @torch.library.register_fake("pathattn_cpu::scan_fwd")
    def _(qt, kt, pt, s_diag, vb, pred, gl, G):
        NB, H, R, _ = qt.shape
        return qt.new_empty(NB, H, R, vb.shape[-1]), qt.new_empty(NB, H, R)

    @torch.library.register_fake("pathattn_cpu::ut_fwd")
    def _(qb, kb, wb, bb, scale, sub_block):
        NB, H, Gr, C, D = qb.shape
        return (qb.new_empty(NB, H, Gr * C, D), torch.empty_like(kb), qb.new_empty(NB, H, D, D),
                qb.new_empty(NB, H, Gr * C, C))

    @torch.library.register_fake("pathattn_cpu::ut_bwd")
    def _(qb, kb, wb, bb, scale, sub_block, dqt, dkt, dpt, ds):
        return (torch.empty_like(qb), torch.empty_like(kb), torch.empty_like(wb),
                torch.empty_like(bb))

    @torch.library.register_fake("pathattn_cpu::scan_bwd")
    def _(qt, kt, pt, s_diag, vb, pred, gl, G, dout, lse, delta):
        dcol = torch.empty_like(gl) if gl is not None else qt.new_empty(0)
        return (torch.empty_like(qt), torch.empty_like(kt), torch.empty_like(pt),
                torch.empty_like(s_diag), torch.empty_like(vb), dcol)
