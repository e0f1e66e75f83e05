"""The stick-breaking kernels as compiled for sm_90 (H100) and sm_80 (A100), checked
without a GPU: every kernel of a forward + backward at bfloat16 with the launcher's tile
lengths, warps and stages (`pathattn.ops.sba.triton.fit`), at D = 64 on both and D = 128
on sm_90, has no register spills, no spill loads or stores inside loops, no atomics and
no memory fences, shared memory within the device's limit, and at least two thread blocks
per SM. The figures are in docs/sba.md.

Compilation needs TRITON_INTERPRET unset, which the test session sets, so the kernels
compile in two child processes, once per module (about 30 s on two idle cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # nine ptxas runs

ROOT = Path(__file__).resolve().parents[4]
SHARED = {90: 232448, 80: 166912}  # bytes per block, opt-in maximum
MIN_BLOCKS_PER_SM = 2
KERNELS = ("fwd", "dq", "dkdv")

_CHILD = """
import json, sys
import torch
from pathattn.ops.sba.triton.fit import specializations
from pathattn.ops.path.triton.fit import compile_jit
from pathattn.ops.path.triton.inspect_kernels import analyze, blocks_per_sm, disassemble
out = {}
for cap, D in json.loads(sys.argv[1]):
    for s in specializations(D, torch.bfloat16):
        c = compile_jit(s.fn, s.signature, s.constexprs, cap, s.num_warps, s.num_stages,
                        "cubin", s.attrs)
        blocks, limiter = blocks_per_sm(c.regs, s.num_warps, c.shared, cap)
        a = analyze(c.ptx, disassemble(c.cubin))
        out[f"sm{cap}-D{D}-{s.name}"] = {
            "regs": c.regs, "spills": c.spills, "shared": c.shared, "blocks": blocks,
            "limiter": limiter, "atomics": {**a["atomics_in_loops"],
                                            **a["atomics_outside_loops"]},
            "fences_in_loops": a["fences_in_loops"],
            "local_in_loops": a.get("sass_local_in_loops") or 0,
            "mma_per_pair": a["mma_per_block_pair"], "BT": s.constexprs["BT"],
            "warps": s.num_warps, "widths": list(a["wgmma_widths"])}
print(json.dumps(out))
"""
JOBS = ([[90, 64], [80, 64]], [[90, 128]])  # two children of about equal cost


@pytest.fixture(scope="module")
def reports() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(job)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for job in JOBS]
    out = {}
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"compilation failed:\n{stderr[-4000:]}"
        out.update(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_every_kernel_fits(reports):
    want = {f"sm{cap}-D{D}-{k}" for job in JOBS for cap, D in job for k in KERNELS}
    assert set(reports) == want
    bad = {k: r for k, r in reports.items()
           if r["spills"] or r["local_in_loops"] or r["atomics"] or r["fences_in_loops"]
           or r["shared"] > SHARED[int(k[2:4])]}
    assert not bad, f"spills, atomics, fences or too much shared memory: {bad}"


@pytest.mark.parametrize("key", [f"sm{cap}-D{D}-{k}" for job in JOBS for cap, D in job
                                 for k in KERNELS])
def test_two_blocks_per_sm(reports, key):
    r = reports[key]
    assert r["blocks"] >= MIN_BLOCKS_PER_SM, f"{key}: {r}"
    assert r["mma_per_pair"] > 0, f"{key}: the tile-pair loop has no MMA: {r}"


@pytest.mark.parametrize("key", [f"sm90-D64-{k}" for k in KERNELS])
def test_no_narrow_wgmma_beside_wider(reports, key):
    """No wgmma narrower than 64 columns beside wider ones at D = 64 on an H100 (the pattern
    of the kernels that faulted there; `inspect_kernels.narrow_beside_wide`)."""
    from pathattn.ops.path.triton.inspect_kernels import narrow_beside_wide

    assert not narrow_beside_wide(reports[key]["widths"]), f"{key}: {reports[key]}"


def test_ahead_of_time_compilations_are_the_jits(tmp_path):
    """The specializations compiled here are what Triton's JIT compiles for the op's real
    launches of a training step (argument types, divisibility, constants, num_warps /
    num_stages per kernel), seen through the JIT on an H100 stand-in
    (`tests/ops/_jit_stub.py`)."""
    from ..._jit_stub import assert_jit_matches_fit

    assert_jit_matches_fit([("sba", "bfloat16", 64, True, 32, 16, 1),
                            ("sba", "bfloat16", 128, True, 16, 16, 1),
                            ("sba", "float32", 64, True, 16, 16, 1)], tmp_path)
