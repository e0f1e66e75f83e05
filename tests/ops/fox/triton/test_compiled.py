"""The FoX kernels as compiled for sm_90 (H100), checked without a GPU: every kernel of a
forward + backward at bfloat16, D = 64 and 128, with the launcher's tile lengths, warps and
stages (`pathattn.ops.fox.triton.fit`) has no register spills, no atomics (none anywhere,
so none in a loop), shared memory within the H100's limit, and at D = 64 at least two
thread blocks per SM for the forward and both backward kernels.

Compilation needs TRITON_INTERPRET unset, which the test session sets, so the kernels
compile in two child processes, once per module (about 25 s on two idle cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # two ptxas runs of about 20 s (twice that on busy cores)

ROOT = Path(__file__).resolve().parents[4]
H100_SHARED = 232448  # bytes per block, opt-in maximum
MIN_BLOCKS_PER_SM = 2
ATTENTION = ("fwd", "dkdv", "dq")

_CHILD = """
import json, sys
import torch
from pathattn.ops.fox.triton.fit import specializations
from pathattn.ops.path.triton.fit import compile_jit
from pathattn.ops.path.triton.inspect_kernels import analyze, blocks_per_sm
out = {}
for D, names in json.loads(sys.argv[1]):
    for s in specializations(D, torch.bfloat16):
        if s.name not in names:
            continue
        c = compile_jit(s.fn, s.signature, s.constexprs, 90, s.num_warps, s.num_stages,
                        "cubin", s.attrs)
        blocks, limiter = blocks_per_sm(c.regs, s.num_warps, c.shared, 90)
        a = analyze(c.ptx)
        out[f"D{D}-{s.name}"] = {"regs": c.regs, "spills": c.spills, "shared": c.shared,
                                 "blocks": blocks, "limiter": limiter,
                                 "atomics": {**a["atomics_in_loops"],
                                             **a["atomics_outside_loops"]},
                                 "BT": s.constexprs["BT"], "warps": s.num_warps,
                                 "mma_per_pair": a["mma_per_block_pair"],
                                 "widths": list(a["wgmma_widths"])}
print(json.dumps(out))
"""
# two children of about equal cost; the gate kernels do not depend on D
GATES = ("cumsum", "offset", "cumsum_rev", "offset_rev")
JOBS = ([[64, ["fwd", "dkdv", "dq", *GATES]]], [[128, list(ATTENTION)]])


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


def test_every_kernel_fits_an_h100(reports):
    assert set(reports) == {f"D64-{k}" for k in ATTENTION + GATES} | {
        f"D128-{k}" for k in ATTENTION}
    bad = {k: r for k, r in reports.items()
           if r["spills"] or r["atomics"] or r["shared"] > H100_SHARED}
    assert not bad, f"spills, atomics or too much shared memory: {bad}"


@pytest.mark.parametrize("kernel", ATTENTION)
def test_two_blocks_per_sm_at_d64(reports, kernel):
    r = reports[f"D64-{kernel}"]
    assert r["blocks"] >= MIN_BLOCKS_PER_SM, f"{kernel}: {r}"


# products per tile pair (FlashAttention-2's): forward S = Q K^T and P V; key-parallel
# backward S^T, dV += P^T dO, dP^T = V dO^T, dK += dS^T Q; query-parallel S, dP, dQ += dS K.
# One 64 x 64 x 64 product with 16-bit operands is 4 wgmma (m64n64k16) on sm_90.
PRODUCTS_PER_TILE_PAIR = {"fwd": 2, "dkdv": 4, "dq": 3}


@pytest.mark.parametrize("kernel", ATTENTION)
def test_matrix_products_per_tile_pair_at_d64(reports, kernel):
    r = reports[f"D64-{kernel}"]
    assert r["BT"] == 64, f"{kernel}: the cap below is for 64-token tiles: {r}"
    cap = PRODUCTS_PER_TILE_PAIR[kernel] * 4
    assert 0 < r["mma_per_pair"] <= cap, f"{kernel}: {r['mma_per_pair']} wgmma > {cap}: {r}"


@pytest.mark.parametrize("kernel", ATTENTION)
def test_no_narrow_wgmma_beside_wider_at_d64(reports, kernel):
    """No wgmma narrower than 64 columns beside wider ones (the pattern of the kernels that
    faulted on an H100; `inspect_kernels.narrow_beside_wide`)."""
    from pathattn.ops.path.triton.inspect_kernels import narrow_beside_wide

    widths = reports[f"D64-{kernel}"]["widths"]
    assert widths and not narrow_beside_wide(widths), f"{kernel}: wgmma widths {widths}"


def test_ahead_of_time_compilations_are_the_jits(tmp_path):
    """The specializations compiled here are what Triton's JIT compiles for the op's real
    launches of a training step (argument types, divisibility, constants, num_warps /
    num_stages per kernel), seen through the JIT on an H100 stand-in
    (`tests/ops/_jit_stub.py`), the gate sums' forward and reverse launches included."""
    from ..._jit_stub import assert_jit_matches_fit

    assert_jit_matches_fit([("fox", "bfloat16", 64, True, 32, 16, 1),
                            ("fox", "bfloat16", 128, True, 16, 16, 1),
                            ("fox", "float32", 64, True, 16, 16, 1)], tmp_path)
