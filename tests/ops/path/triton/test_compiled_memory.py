"""The compiled Triton kernels touch only their own memory: every kernel launch of a
training step (PaTH, PaTH-FoX gates, FoX, stick-breaking), compiled by Triton's JIT for an
H100 from the op's real arguments, runs in the PTX emulator
(`pathattn.ops.common.compiled_launches`) over all its programs, and no global access may
leave the launch's tensors, no shared one the block's shared memory, no wgmma tile the
shared memory either, and no address may stay unevaluated. The interpreter's memory
checks (`test_memory_safety.py`) run the Python source; this runs what the GPU would.

A kernel reading past its tensor's end, compiled and emulated the same way, is reported
with its source line: the check can fail. The cases cross segments (several segments per
sequence), pack sequences of odd lengths, take strided inputs and GQA, at D = 64 (the
H100's head dim of the 760M model; `benchmarks/memcheck_compiled.py` checks other head dims,
reflections and an A100's kernels). Compilation runs in two child processes
(TRITON_INTERPRET unset): about 30 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[4]
pytestmark = pytest.mark.slow

# name -> (op, capability, B, T, HQ, H, D, R, gates, packed lengths or None, strided q)
CASES = {
    "path-d64-gates-gqa-packed": ("path", 90, 1, 512, 2, 1, 64, 1, True, (1, 300, 211), False),
    "path-d64-dense-strided": ("path", 90, 2, 512, 1, 1, 64, 1, False, None, True),
    "fox-packed": ("fox", 90, 1, 512, 2, 1, 64, 1, True, (1, 300, 211), False),
    "sba-packed": ("sba", 90, 1, 512, 2, 1, 64, 1, False, (1, 300, 211), False),
}
GROUPS = (("path-d64-gates-gqa-packed", "sba-packed"),
          ("path-d64-dense-strided", "fox-packed", "probe"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pathattn.ops.common.compiled_launches import memcheck, record_launches  # noqa: E402
from pathattn.ops.common.triton_launch import launch_kernel  # noqa: E402
from pathattn.ops.fox.triton.op import fox_attn_triton  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402
from pathattn.ops.sba.triton.op import sb_attn_triton  # noqa: E402

from .._helpers import make_inputs, make_reflection_inputs, strided_view  # noqa: E402


@triton.jit
def _past_the_end(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs + 1, mask=offs < n), mask=offs < n)


def _step(op, B, T, HQ, H, D, R, gates, lengths, strided) -> None:
    """One forward + backward of `op` (bfloat16, CPU tensors: only the host code runs)."""
    if R == 1:
        q, k, v, w, beta, g = make_inputs(B, T, HQ, H, D, D, gates, torch.bfloat16)
    else:
        q, k, v, w, beta, g = make_reflection_inputs(B, T, HQ, H, D, D, R, gates,
                                                     torch.bfloat16)
    if strided:
        q = strided_view(q)
    cu = None if lengths is None else torch.tensor(
        [0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    for x in (q, k, v, w, beta, g):
        if x is not None:
            x.requires_grad_()
    if op == "path":
        o = path_attn_triton(q, k, v, w, beta, g, cu_seqlens=cu)
    elif op == "fox":
        o = fox_attn_triton(q, k, v, g, D ** -0.5, cu, None)
    else:
        o = sb_attn_triton(q, k, v, D ** -0.5, cu, False, None)
    o.backward(torch.ones_like(o))


def _memcheck_jobs(names: list) -> dict:
    """Child process: case name -> per launch its memcheck summary."""
    out = {}
    for name in names:
        if name == "probe":
            with record_launches(90) as launches:
                x, y = torch.randn(1000), torch.empty(1000)
                launch_kernel(_past_the_end, (4,))(x, y, 1000, BLOCK=256)
        else:
            case = CASES[name]
            with record_launches(case[1]) as launches:
                _step(case[0], *case[2:])
        out[name] = []
        for x in launches:
            r = memcheck(x)
            out[name].append({"name": r.name, "programs": r.programs,
                              "global": r.global_accesses, "shared": r.shared_accesses,
                              "faults": [repr(f) for f in r.faults],
                              "fault_lines": [f.loc for f in r.faults],
                              "unknown": [list(u) for u in r.unknown]})
    return out


_CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("tests.ops.path.triton.compiled_memory",
                                              sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print("RESULT" + json.dumps(mod._memcheck_jobs(json.loads(sys.argv[2]))))
"""


def _run_groups(cache: Path) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1",
               TRITON_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen(
        [sys.executable, "-c", _CHILD, __file__, json.dumps(list(group))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for group in GROUPS]
    out = {}
    for p in procs:
        stdout, stderr = p.communicate(timeout=1200)
        line = [x for x in stdout.splitlines() if x.startswith("RESULT")]
        assert p.returncode == 0 and line, stderr[-4000:]
        out.update(json.loads(line[-1][len("RESULT"):]))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return _run_groups(tmp_path_factory.mktemp("triton-cache"))


# launches of one training step (row_dot included); PaTH with gates 5 more: the gates'
# sums and block offsets, and the backward's suffix sums (`common.triton_gates`); FoX's
# include the gates' block offsets once per tile length (two at D 64 on an H100)
KERNELS = {"path": 13, "fox": 10, "sba": 3}
GATE_LAUNCHES = {"path": 5, "fox": 0, "sba": 0}


@pytest.mark.parametrize("case", list(CASES))
def test_every_access_inside_its_memory(results, case):
    launches = results[case]
    op, gates = CASES[case][0], CASES[case][8]
    assert len(launches) == KERNELS[op] + (GATE_LAUNCHES[op] if gates else 0)
    for x in launches:
        assert x["faults"] == [], f"{x['name']}: {x['faults'][:3]}"
        assert x["unknown"] == [], f"{x['name']}: addresses not evaluated at {x['unknown']}"
        assert x["global"] > 0 and x["programs"] > 0


def test_a_read_past_the_end_is_found(results):
    (x,) = results["probe"]
    line = next(i + 1 for i, t in enumerate(Path(__file__).read_text().splitlines())
                if "tl.store(y_ptr + offs" in t)
    assert x["faults"] and set(x["fault_lines"]) == {f"{Path(__file__).name}:{line}"}
    assert "'x_ptr', 4000, 4000" in x["faults"][0]  # 4 bytes past x's 1000 floats
