"""The Triton kernels fit real GPUs: compiled ahead of time for sm_80 (A100) and sm_90 (H100)
with the block size, num_warps and num_stages the launcher picks there, every kernel's shared
memory per program is within the device's limit (no GPU needed: Triton's compiler ships in
its wheel), for one and for several reflections per token. The CPU interpreter the other
tests use would not notice a kernel that needs more shared memory than a GPU has.

Compilation needs TRITON_INTERPRET unset, which the test session sets for the CPU kernels,
so the checks run in a child process per device. Set (`pathattn.ops.path.triton.fit.QUICK`,
default block sizes): R = 1 at D 64 and 128 in float32 and bfloat16 and at D = 256 in
bfloat16, R = 2 at D = 128 and R = 4 at D = 64 in bfloat16, read after the shared-memory
allocation pass (about 0.3 s per kernel); `benchmarks/triton_fit.py` runs the full set
(and `--table` remeasures the launcher's tables) and ptxas. Those ahead-of-time
compilations are checked to be the JIT's own for a training step's launches, through the
JIT on an H100 stand-in (`tests/ops/_jit_stub.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.path.triton.config import (  # noqa: E402
    A100_SHARED,
    H100_SHARED,
    SHARED_BYTES,
    SHARED_BYTES_REFLECTIONS,
    block_lengths,
    launch_config,
    padded_reflections,
    register_cap,
)

from ..._jit_stub import assert_jit_matches_fit  # noqa: E402

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.slow  # two compiling child processes, about a minute

_CHILD = """
import json, sys
import torch
from pathattn.ops.path.triton import fit
from pathattn.ops.path.triton.config import LaunchConfig
device = sys.argv[1]
bf16 = (torch.bfloat16,)
grids = [{**fit.QUICK, "D": (64, 128), "reflections": (1,)},
         {**fit.QUICK, "D": (256,), "dtypes": bf16, "reflections": (1,)},
         {**fit.QUICK, "D": (128,), "dtypes": bf16, "reflections": (2,)},
         {**fit.QUICK, "D": (64,), "dtypes": bf16, "reflections": (4,)}]
out = [{"kernel": f.kernel, "D": f.D, "dtype": str(f.dtype), "BT": f.BT, "G": f.G, "R": f.R,
        "cap": f.capability, "shared": f.shared, "limit": f.limit, "stages": f.num_stages}
       for grid in grids for f in fit.run_checks(grid, devices=(device,))]
# control: the forward scan at D = 128 with 64-token blocks and 3 pipeline stages
control = fit.compile_kernel("fwd", 128, torch.float32, True, LaunchConfig(64, 0), 80,
                             num_stages=3).shared if device == "sm_80" else None
print(json.dumps({"fits": out, "control": control}))
"""


def _compile_quick_set() -> dict:
    """The quick set compiled in one child process per device, both at once."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, device], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for device in ("sm_80", "sm_90")]
    result = {"fits": [], "control": None}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"compilation failed:\n{stderr[-4000:]}"
        part = json.loads(stdout.strip().splitlines()[-1])
        result["fits"] += part["fits"]
        result["control"] = result["control"] or part["control"]
    return result


def test_quick_set_fits_sm80_and_sm90():
    """Every kernel of the quick set compiles and fits; the launcher's table is no lower than
    what the compiler allocates (else it could pick a block size that does not fit). A
    configuration known not to fit is measured too, as a control."""
    result = _compile_quick_set()
    # the check can fail: this configuration needs 294,912 bytes, over both devices' limits
    assert result["control"] > H100_SHARED
    fits = result["fits"]
    assert {f["cap"] for f in fits} == {80, 90}
    assert {f["D"] for f in fits} == {64, 128, 256}
    assert {(f["R"], f["cap"]) for f in fits} == {(r, c) for r in (1, 2, 4) for c in (80, 90)}
    too_big = [f for f in fits if f["shared"] > f["limit"]]
    assert not too_big, f"kernels over the shared-memory limit: {too_big}"
    for f in fits:
        fp32 = f["dtype"] == "torch.float32"
        table = (SHARED_BYTES if f["R"] == 1 else SHARED_BYTES_REFLECTIONS[f["R"]])[f["cap"]]
        peak, fwd2 = table[f["D"]][f["BT"]][0 if fp32 else 2:][:2]
        bound = fwd2 if f["kernel"] == "fwd" and f["stages"] == 2 else peak
        assert f["shared"] <= bound, f"table below the compiled kernel: {f}"


@pytest.mark.parametrize("R", [1, 2, 3, 4], ids=lambda r: f"R{r}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("D", [16, 48, 64, 96, 128, 192, 256], ids=lambda d: f"D{d}")
def test_launch_config_picks_a_fitting_block_size(D, dtype, R):
    """The default block size fits the table on A100 and H100 (or none fits and the launcher
    says so); a larger one is refused."""
    RP = padded_reflections(R)
    for limit, cap in ((A100_SHARED, (8, 0)), (H100_SHARED, (9, 0))):
        tables = SHARED_BYTES if R == 1 else SHARED_BYTES_REFLECTIONS[RP]
        row = tables[cap[0] * 10][max(16, 1 << (D - 1).bit_length())]
        col = 0 if dtype == torch.float32 else 2
        if all(row[bt][col] > limit for bt in block_lengths(R)):
            with pytest.raises(ValueError, match="no block length fits"):
                launch_config(D, D, dtype, limit, capability=cap, reflections=R)
            continue
        cfg = launch_config(D, D, dtype, limit, capability=cap, reflections=R)
        BD = max(16, 1 << (D - 1).bit_length())
        assert cfg.R == R and row[cfg.BT][col] <= limit
        assert cfg.BT <= register_cap(BD, dtype, R)
        for bt in [bt for bt in (64, 32, 16) if bt > cfg.BT]:  # refused where they do not fit
            if bt in row and row[bt][col] <= limit:
                assert launch_config(D, D, dtype, limit, bt, cap, R).BT == bt
                assert bt > register_cap(BD, dtype, R) or bt not in block_lengths(R)
            else:
                with pytest.raises(ValueError, match="block_size"):
                    launch_config(D, D, dtype, limit, bt, cap, R)
        assert launch_config(D, D, dtype, None, reflections=R).BT >= 16  # interpreter


def test_no_fit_raises():
    with pytest.raises(ValueError, match="no block length fits"):
        launch_config(256, 256, torch.float32, 64 * 1024, capability=(8, 6))
    with pytest.raises(ValueError, match="block_size=128"):
        launch_config(64, 64, torch.float32, H100_SHARED, 128)


# (dtype, D, gates, HQ, H, R): head counts divisible by 16, as `fit` assumes
JIT_CASES = [("bfloat16", 64, True, 16, 16, 1), ("bfloat16", 128, False, 32, 16, 1),
             ("float32", 64, True, 16, 16, 1), ("bfloat16", 64, False, 16, 16, 2)]


def _store_e(kernel: str, consts: dict, fit_consts: dict) -> None:
    """`fit` compiles the segment-key kernel as the backward launches it (storing E); the
    forward's launch differs in that constant only."""
    if kernel == "_seg_kernel":
        for k, v in fit_consts.items():
            if v == "True" and consts.get(k) == "False":
                consts[k] = "True"


def test_ahead_of_time_compilations_are_the_jits(tmp_path):
    """What `fit` (and so `test_compiled.py` and `benchmarks/triton_fit.py`) compiles ahead
    of time is what Triton's JIT compiles for the op's real launches of a training step:
    per kernel the same argument types, divisibility attributes, constants and num_warps /
    num_stages, seen through the JIT on an H100 stand-in (`tests/ops/_jit_stub.py`)."""
    assert_jit_matches_fit([("path", *c) for c in JIT_CASES], tmp_path, fix=_store_e)
