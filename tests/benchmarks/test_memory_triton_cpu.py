"""`benchmarks/memory_triton_cpu.py` at a small shape: the Triton path's host code runs on
CPU tensors with every kernel launch replaced by nothing, and its peak extra memory is what
its buffers add up to (checked here against the bytes the op allocates for its saved
tensors alone, a lower bound); without fla-core its column reads "n/a"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_small_shape(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p)}
    out = tmp_path / "mem.json"
    run = subprocess.run([sys.executable, "benchmarks/memory_triton_cpu.py", "--seq-lens",
                          "256,512", "--tokens", "1024", "--heads", "2", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["T"], r["B"], r["gates"]) for r in rows] == [
        (256, 4, False), (256, 4, True), (512, 2, False), (512, 2, True)]
    # the forward saves at least m and the inverse (float32 [N, H, 64] each) and u, kt, wt,
    # vc, o (16-bit [N, H, 64]): 2 * 4 + 5 * 2 bytes per token, head and column
    saved = 1024 * 2 * 64 * (2 * 4 + 5 * 2) / 2**20
    for r in rows:
        assert r["ours_mib"] > saved
        if r["fla_mib"] is None:  # fla-core not installed
            assert "n/a" in run.stdout
