"""Triton's JIT on CPU tensors, for child processes of the tests.

`STUB` is Python source that makes a stand-in for the CUDA driver the active one, naming an
H100 (sm_90) as the current device: the JIT then binds and specialises kernel arguments and
compiles for sm_90 exactly as on a GPU, and only a launch would fail. `run_child(source)`
runs STUB + source in a fresh interpreter without Triton's interpreter mode and returns
the JSON it printed on a line starting with RESULT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUB = r"""
import sys
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class H100Stub:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


driver.set_active(H100Stub())
sys.path.insert(0, sys.argv[1])
"""


def run_child(source: str, cache_dir: Path, *args: str, timeout: float = 600) -> dict:
    """Run STUB + source in a child process (repository root on sys.path and sys.argv[1],
    `args` after it, Triton cache in cache_dir, two compile threads); the JSON of its
    RESULT line."""
    full_env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(cache_dir),
                    PATHATTN_COMPILE_THREADS="2", TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, "-c", STUB + source, str(ROOT), *args], env=full_env,
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT")]
    assert res.returncode == 0 and line, res.stderr[-3000:]
    return json.loads(line[-1][len("RESULT"):])
