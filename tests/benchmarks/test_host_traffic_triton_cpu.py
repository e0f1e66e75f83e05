"""`benchmarks/host_traffic_triton_cpu.py` at a small shape: the PyTorch work around the
Triton path's kernels is counted (operations, bytes moved), the counter sees through the
path's custom ops and charges nothing for views and allocations; without fla-core its
columns read "n/a"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_small_shape(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p)}
    out = tmp_path / "traffic.json"
    run = subprocess.run([sys.executable, "benchmarks/host_traffic_triton_cpu.py",
                          "--seq-lens", "256", "--tokens", "512", "--heads", "2", "--ops",
                          "--min-mib", "0", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["T"], r["B"], r["gates"]) for r in rows] == [(256, 2, False), (256, 2, True)]
    # the backward's accumulators alone are zeroed float32 [N, H, 64] buffers (dv, dkt, du,
    # dwp): at least 4 * 512 * 2 * 64 * 4 bytes; with gates more operations run
    assert all(r["ours"]["mib"] >= 4 * 512 * 2 * 64 * 4 / 2**20 for r in rows)
    assert rows[1]["ours"]["calls"] > rows[0]["ours"]["calls"] > 0
    # the custom ops are opened: their host code, not the ops, is listed
    assert "bwd.py" in run.stdout and "path_attn_bwd" not in run.stdout
    if rows[0]["fla"] is None:
        assert "n/a" in run.stdout


def test_views_and_allocations_are_free():
    from host_traffic_triton_cpu import Traffic

    x = torch.ones(64, 64)
    with Traffic() as t:
        x.t().reshape(-1)[:10]  # views (reshape of a transpose copies: counted)
        torch.empty(1000)
        x.add_(1)
    assert set(t.ops) == {"clone", "add_"} or set(t.ops) == {"_unsafe_view", "clone", "add_"}
    assert t.ops["add_"][1:3] == [64 * 64 * 4, 64 * 64 * 4]


@pytest.mark.parametrize("op", ["zeros", "fill_"])
def test_writes_without_reads(op):
    from host_traffic_triton_cpu import Traffic

    x = torch.ones(32)
    with Traffic() as t:
        torch.zeros(32) if op == "zeros" else x.fill_(2.0)
    assert t.ops[op][1:3] == [0, 32 * 4]


def test_fox_small_shape(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")) if p)}
    out = tmp_path / "traffic.json"
    run = subprocess.run([sys.executable, "benchmarks/host_traffic_triton_cpu.py", "--op", "fox",
                          "--seq-lens", "128", "--tokens", "256", "--heads", "2", "--ops",
                          "--min-mib", "0", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert (row["T"], row["B"], row["gates"]) == (128, 2, True)
    assert row["ours"]["calls"] > 0 and "fox/triton/op.py" in run.stdout
