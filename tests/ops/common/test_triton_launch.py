"""Kernel launches and the compile-only pass of the first call
(`pathattn.ops.common.triton_launch`).

The pass must compile exactly what the real call launches: same kernels, grids, argument
dtypes and constants. The interpreter's launch log checks that (a compile-only launch is
logged, neither compiled nor run); a child process checks it through Triton's own JIT,
compiling for an H100 stand-in on CPU tensors. The time saved is measured by
`benchmarks/compile_side_by_side.py` and, on a GPU, `benchmarks/gpu_check.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.common import triton_launch as tlaunch  # noqa: E402
from pathattn.ops.fox.triton import op as fox_op  # noqa: E402
from pathattn.ops.path.triton import op as path_op  # noqa: E402
from pathattn.ops.sba.triton import op as sba_op  # noqa: E402

from ..path._helpers import make_dout, make_inputs, make_reflection_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _path_call(inputs, cu_seqlens, block_size: int, seg: int):
    """The forward and backward kernel calls of one PaTH step, as (forward, backward)
    thunks running `op._forward` and `op._backward_kernels` (the bodies of the custom ops,
    without their compile-ahead)."""
    q, k, v, w, beta, g = inputs
    fwd_args = (q, k, v, w, beta, g, cu_seqlens, q.shape[-1] ** -0.5, block_size, seg)
    saved = path_op._forward(*fwd_args)
    do = make_dout(*q.shape[:3], v.shape[-1]).to(q.dtype)
    bwd_args = (do, q, k, v, w, beta, g, cu_seqlens, saved[0], saved[1], *saved[2:],
                *fwd_args[-3:])
    return (lambda: path_op._forward(*fwd_args),
            lambda: path_op._backward_kernels(*bwd_args))


def _assert_same_launches(step) -> list:
    """`step()` run for real and as a compile-only pass: the same launches (kernel, grid,
    argument dtypes, constants) in the same order, the pass running none. Returns the log
    of the real run."""
    with tlaunch.launch_log() as real:
        step()
    with tlaunch.launch_log() as dry, tlaunch.compile_only():
        step()
    assert real and all(not entry[0] for entry in real)
    assert all(entry[0] for entry in dry)
    assert [e[1:] for e in dry] == [e[1:] for e in real]
    return real


@pytest.mark.parametrize("case", ["gates", "nogates-gqa", "packed", "R2-bf16"])
def test_compile_only_pass_covers_the_real_launches(case):
    """PaTH, forward and backward: the compile-only pass submits the launches of the real
    call (`_assert_same_launches`)."""
    cu = None
    if case == "R2-bf16":
        inputs = make_reflection_inputs(1, 40, 2, 1, 32, 32, 2, True, torch.bfloat16)
    else:
        inputs = make_inputs(1, 40, 4 if case == "nogates-gqa" else 2,
                             2 if case == "nogates-gqa" else 1, 32, 32, case != "nogates-gqa")
    if case == "packed":
        cu = torch.tensor([0, 7, 30, 40])
    fwd, bwd = _path_call(inputs, cu, 16, 1)
    assert {e[1] for e in _assert_same_launches(fwd)} == {"_ut_fwd_kernel", "_seg_kernel",
                                                          "_fwd_kernel"}
    names = {e[1] for e in _assert_same_launches(bwd)}
    assert {"_bwd_kernel", "_bwd_kv_kernel", "_ut_bwd_kernel", "_ut_bwd_q_kernel"} <= names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compile_only_pass_covers_fox_and_sba(dtype):
    """FoX forward and backward, stick-breaking backward (its forward is one kernel)."""
    q, k, v, _, _, g = make_inputs(1, 40, 4, 2, 32, 32, True, dtype)
    cu = torch.tensor([0, 9, 40])
    fwd_args = (q, k, v, g, cu, 0.2, 16)
    o, o_lo, lse, G = fox_op._forward(*fwd_args)
    do = make_dout(1, 40, 4, 32).to(dtype)
    _assert_same_launches(lambda: fox_op._forward(*fwd_args))
    names = {e[1] for e in _assert_same_launches(
        lambda: fox_op._backward_kernels(do, q, k, v, g, cu, o, o_lo, lse, G, 0.2, 16))}
    assert {"_dq_kernel", "_dkdv_kernel"} <= names
    _assert_same_launches(lambda: sba_op._backward_kernels(do, q, k, v, cu, 0.2, False, 16))


def test_compile_only_launch_runs_nothing():
    """A launch in a compile-only pass leaves its outputs untouched (under the interpreter,
    where compilation itself does not apply, it is logged and skipped)."""
    inputs = make_inputs(1, 20, 2, 1, 16, 16, True)
    q, k, v, w, beta, g = inputs
    with tlaunch.launch_log(), tlaunch.compile_only():
        o = path_op._forward(q, k, v, w, beta, g, None, 0.25, 16, 1)[0]
    with tlaunch.launch_log():
        o_real = path_op._forward(q, k, v, w, beta, g, None, 0.25, 16, 1)[0]
    assert not torch.equal(o, o_real)  # uninitialised memory, never written by a kernel


def test_every_kernel_launch_goes_through_launch_kernel():
    """No op launches a kernel as `kernel[grid](...)` directly: such a launch would be
    missing from the compile-only pass (and compile alone at its first call)."""
    direct = re.compile(r"\b_\w*kernel\[")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "pathattn").rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if direct.search(line)]
    assert not offenders, offenders


def test_compile_ahead_once_per_key_and_only_where_it_applies(monkeypatch):
    calls = []
    monkeypatch.setattr(tlaunch, "_DONE", set())
    # on the CPU (and under the interpreter) the pass never runs
    tlaunch.compile_ahead(("k",), torch.device("cpu"), lambda: calls.append("cpu"))
    assert calls == []
    monkeypatch.setattr(tlaunch, "_can_compile_ahead", lambda device: True)
    monkeypatch.setattr(tlaunch, "_compiling", tlaunch.compile_only)
    for _ in range(2):
        tlaunch.compile_ahead(("k",), torch.device("cuda"), lambda: calls.append("a"))
    tlaunch.compile_ahead(("k2",), torch.device("cuda"), lambda: calls.append("b"))
    assert calls == ["a", "b"]


def test_a_failing_pass_warns_and_turns_itself_off(monkeypatch):
    monkeypatch.setattr(tlaunch, "_DONE", set())
    monkeypatch.setattr(tlaunch, "_BROKEN", [])
    monkeypatch.setattr(tlaunch, "_compiling", tlaunch.compile_only)
    monkeypatch.setattr(tlaunch, "_can_compile_ahead",
                        lambda device: not tlaunch._BROKEN)

    def broken():
        raise RuntimeError("no compiler")

    with pytest.warns(RuntimeWarning, match="no compiler"):
        tlaunch.compile_ahead(("k",), torch.device("cuda"), broken)
    assert ("k",) not in tlaunch._DONE and tlaunch._BROKEN
    ran = []
    tlaunch.compile_ahead(("k2",), torch.device("cuda"), lambda: ran.append(1))
    assert ran == []


def test_compile_threads(monkeypatch):
    monkeypatch.delenv("PATHATTN_COMPILE_THREADS", raising=False)
    assert tlaunch.compile_threads() >= 1
    monkeypatch.setenv("PATHATTN_COMPILE_THREADS", "3")
    assert tlaunch.compile_threads() == 3
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("PATHATTN_COMPILE_THREADS", bad)
        with pytest.raises(ValueError, match="PATHATTN_COMPILE_THREADS"):
            tlaunch.compile_threads()


def test_compile_key_separates_what_specialises_the_kernels():
    """Calls whose kernels differ get different keys; calls that differ only in sequence
    length (same segment-length specialisation) share one."""
    q, k, v, w, beta, g = make_inputs(1, 64, 2, 1, 16, 16, True)
    key = path_op._compile_key

    def at(T, **over):
        xs = dict(q=q[:, :T], k=k[:, :T], v=v[:, :T], w=w[:, :T], beta=beta[:, :T],
                  g=g[:, :T])
        xs.update(over)
        return key("fwd", xs["q"], xs["k"], xs["v"], xs["w"], xs["beta"], xs["g"], None,
                   16, 0)

    assert at(48) == at(64)  # segment lengths 2 and 2
    assert at(64) != at(64, g=None)
    assert at(64) != at(64, q=q.bfloat16())
    assert at(16) != at(64)  # segment length 1 against 2
    assert key("fwd", q, k, v, w, beta, g, None, 16, 0) != key("bwd", q, k, v, w, beta, g,
                                                               None, 16, 0)



# In a child process without the interpreter, a stand-in for the CUDA driver that names an
# H100 as the current device: Triton's JIT then specialises and compiles kernels for sm_90
# on CPU tensors (nothing is launched). The compile-only passes of a PaTH, FoX and
# stick-breaking step run on a thread pool; the same calls made again must then find every
# kernel in Triton's cache (the real launches look it up the same way), which the JIT's
# cache hook counts: it runs only before a compilation.
_REAL_JIT_CHILD = r"""
import json, sys, time, torch, triton
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
from pathattn.ops.common import triton_launch as tlaunch
from pathattn.ops.fox.triton import op as fox_op
from pathattn.ops.path.triton import op as path_op
from pathattn.ops.sba.triton import op as sba_op
from tests.ops.path._helpers import make_dout, make_inputs

q, k, v, w, beta, g = make_inputs(2, 48, 4, 2, 32, 32, True, torch.bfloat16)
do = make_dout(2, 48, 4, 32).to(torch.bfloat16)
cu = torch.tensor([0, 17, 96], dtype=torch.int32)


def steps():
    # outputs of the right shapes for the backward (garbage: logged launches do nothing)
    with tlaunch.launch_log(), tlaunch.compile_only():
        saved = path_op._forward(q, k, v, w, beta, g, None, 0.2, 16, 0)
        fox = fox_op._forward(q, k, v, g, cu, 0.2, 16)
    return {
        "path_fwd": lambda: path_op._forward(q, k, v, w, beta, g, None, 0.2, 16, 0),
        "path_bwd": lambda: path_op._backward_kernels(do, q, k, v, w, beta, g, None, *saved,
                                                      0.2, 16, 0),
        "fox_fwd": lambda: fox_op._forward(q, k, v, g, cu, 0.2, 16),
        "fox_bwd": lambda: fox_op._backward_kernels(do, q, k, v, g, cu, *fox, 0.2, 16),
        "sba_bwd": lambda: sba_op._backward_kernels(do, q, k, v, cu, 0.2, False, 16),
    }


compiled = []
triton.knobs.runtime.jit_cache_hook = lambda *a, **kw: compiled.append(kw["fn"].name)
out = {}
for name, step in steps().items():
    compiled.clear()
    t0 = time.perf_counter()
    with tlaunch._compiling():
        step()
    ahead = list(compiled)
    compiled.clear()
    with tlaunch.compile_only():
        step()
    out[name] = {"ahead": ahead, "again": list(compiled), "s": time.perf_counter() - t0}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # compiles every kernel of the three ops for sm_90: about 30 s
def test_compile_ahead_through_the_real_jit(tmp_path):
    """The pass through Triton's own JIT and AsyncCompileMode (no interpreter): every step
    compiles its kernels ahead, each once, and running the step again compiles nothing."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path),
               PATHATTN_COMPILE_THREADS="2", TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, "-c", _REAL_JIT_CHILD, str(ROOT)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT")]
    assert res.returncode == 0 and line, res.stderr[-3000:]
    out = json.loads(line[-1][len("RESULT"):])
    expect = {"path_fwd": {"_ut_fwd_kernel", "_seg_kernel", "_fwd_kernel"},
              "path_bwd": {"_seg_kernel", "_pi_kernel", "_bwd_kernel", "_bwd_kv_kernel",
                           "_seg_bwd_kernel", "_ut_bwd_q_kernel", "_ut_bwd_kernel"},
              "fox_fwd": {"_fwd_kernel", "_tile_cumsum_kernel", "_tile_offset_kernel"},
              "fox_bwd": {"_dq_kernel", "_dkdv_kernel", "_tile_cumsum_kernel",
                          "_tile_offset_kernel"},
              "sba_bwd": {"_dq_kernel", "_dkdv_kernel"}}
    for step in expect:
        assert out[step]["again"] == [], (step, out[step])
        assert len(out[step]["ahead"]) == len(set(out[step]["ahead"])), (step, out[step])
    assert set(out["path_fwd"]["ahead"]) == expect["path_fwd"]
    assert set(out["path_bwd"]["ahead"]) == expect["path_bwd"]
    assert {"_fwd_kernel"} <= set(out["fox_fwd"]["ahead"])
    assert {"_dq_kernel", "_dkdv_kernel"} <= set(out["fox_bwd"]["ahead"])
    assert set(out["sba_bwd"]["ahead"]) == expect["sba_bwd"]
