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

from .._jit_stub import run_child  # noqa: E402
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


# the gates' sums and block offsets (`pathattn.ops.common.triton_gates`)
GATE_KERNELS = {"_tile_cumsum_kernel", "_tile_offset_kernel", "_block_offsets_kernel"}


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
    gates = set() if case == "nogates-gqa" else GATE_KERNELS
    assert {e[1] for e in _assert_same_launches(fwd)} == {"_ut_fwd_kernel", "_seg_kernel",
                                                          "_fwd_kernel"} | gates
    names = {e[1] for e in _assert_same_launches(bwd)}
    assert {"_bwd_kernel", "_bwd_kv_kernel", "_ut_bwd_kernel", "_ut_bwd_q_kernel",
            "_ut_bwd_inv_kernel", "_ut_bwd_dk_kernel"} <= names


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


@pytest.mark.parametrize("op", ["path", "fox", "sba"])
def test_a_training_forward_compiles_its_backward_too(monkeypatch, op):
    """With an input requiring grad, the forward's pass launches the forward's kernels and
    then the backward's as the real backward launches them (dO contiguous like o)."""
    q, k, v, w, beta, g = make_inputs(1, 40, 4, 2, 32, 32, True)
    do = make_dout(1, 40, 4, 32)
    cu = torch.tensor([0, 9, 40])
    if op == "path":
        fwd_args = (q, k, v, w, beta, g, cu, 0.2, 16, 0)
        saved = path_op._forward(*fwd_args)
        real = [lambda: path_op._forward(*fwd_args),
                lambda: path_op._backward_kernels(do, *fwd_args[:7], *saved, 0.2, 16, 0)]
        step = lambda: path_op._compile_step(fwd_args, True)  # noqa: E731
        keys = [path_op._compile_key(s, q, k, v, w, beta, g, cu, 16, 0) for s in ("fwd",
                                                                                "bwd")]
    elif op == "fox":
        fwd_args = (q, k, v, g, cu, 0.2, 16)
        saved = fox_op._forward(*fwd_args)
        real = [lambda: fox_op._forward(*fwd_args),
                lambda: fox_op._backward_kernels(do, *fwd_args[:5], *saved, 0.2, 16)]
        step = lambda: fox_op._compile_step(fwd_args, True)  # noqa: E731
        keys = [fox_op._compile_key("bwd", do, *fwd_args)]
    else:
        fwd_args = (q, k, v, cu, 0.2, False, 16)
        real = [lambda: sba_op._forward(*fwd_args),
                lambda: sba_op._backward_kernels(do, *fwd_args)]
        step = lambda: sba_op._compile_step(fwd_args)  # noqa: E731
        keys = [sba_op._compile_key("bwd", do, *fwd_args)]
    with tlaunch.launch_log() as log:
        for call in real:
            call()
    with tlaunch.launch_log() as dry, tlaunch.compile_only():
        step()
    assert [e[1:] for e in dry] == [e[1:] for e in log]
    assert len(set(keys)) == len(keys)
    # the forward's keys include the real backward's (dO contiguous, as make_dout's)
    calls = []
    module = {"path": path_op, "fox": fox_op, "sba": sba_op}[op]
    monkeypatch.setattr(module, "compile_ahead", lambda ks, device, run: calls.extend(ks))
    q.requires_grad_()
    if op == "path":
        path_op.path_attn_fwd(q, k, v, w, beta, g, cu, 0.2, 16, 0)
    elif op == "fox":
        fox_op.fox_fwd(q, k, v, g, cu, 0.2, 16)
    else:
        sba_op.sb_triton_fwd(q, k, v, cu, 0.2, False, 16)
    assert set(keys) <= set(calls)


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
    tlaunch.compile_ahead(["k"], torch.device("cpu"), lambda: calls.append("cpu"))
    assert calls == []
    monkeypatch.setattr(tlaunch, "_can_compile_ahead", lambda device: True)
    monkeypatch.setattr(tlaunch, "_compiling", tlaunch.compile_only)
    for _ in range(2):
        tlaunch.compile_ahead(["k"], torch.device("cuda"), lambda: calls.append("a"))
    tlaunch.compile_ahead(["k2"], torch.device("cuda"), lambda: calls.append("b"))
    assert calls == ["a", "b"]
    # a forward's pass covering its backward marks both; either missing runs it again
    tlaunch.compile_ahead(["f", "b"], torch.device("cuda"), lambda: calls.append("fb"))
    tlaunch.compile_ahead(["b"], torch.device("cuda"), lambda: calls.append("b again"))
    tlaunch.compile_ahead(["f", "b2"], torch.device("cuda"), lambda: calls.append("fb2"))
    assert calls == ["a", "b", "fb", "fb2"]


def test_a_failing_pass_warns_and_turns_itself_off(monkeypatch):
    monkeypatch.setattr(tlaunch, "_DONE", set())
    monkeypatch.setattr(tlaunch, "_BROKEN", [])
    monkeypatch.setattr(tlaunch, "_compiling", tlaunch.compile_only)
    monkeypatch.setattr(tlaunch, "_can_compile_ahead",
                        lambda device: not tlaunch._BROKEN)

    def broken():
        raise RuntimeError("no compiler")

    with pytest.warns(RuntimeWarning, match="no compiler"):
        tlaunch.compile_ahead(["k"], torch.device("cuda"), broken)
    assert "k" not in tlaunch._DONE and tlaunch._BROKEN
    ran = []
    tlaunch.compile_ahead(["k2"], torch.device("cuda"), lambda: ran.append(1))
    assert ran == []
    status = tlaunch.compile_ahead_status()
    assert status["keys"] == 0 and "no compiler" in status["error"]


def test_compile_threads(monkeypatch):
    monkeypatch.delenv("PATHATTN_COMPILE_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(tlaunch.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    assert tlaunch.compile_threads() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun, 8 processes on this node
    assert tlaunch.compile_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert tlaunch.compile_threads() == 1
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



# In a child process with Triton's JIT on an H100 stand-in (`tests/ops/_jit_stub.py`),
# kernels specialise and compile for sm_90 on CPU tensors (nothing is launched). The
# compile-only pass of a training forward of PaTH, FoX and stick-breaking attention runs
# on a thread pool; the forward and backward calls made afterwards must find every kernel
# in Triton's cache (the real launches look it up the same way), which the JIT's cache
# hook counts: it runs only before a compilation.
_REAL_JIT_CHILD = r"""
import json, time, torch, triton
from pathattn.ops.common import triton_launch as tlaunch
from pathattn.ops.fox.triton import op as fox_op
from pathattn.ops.path.triton import op as path_op
from pathattn.ops.sba.triton import op as sba_op
from tests.ops.path._helpers import make_dout, make_inputs

q, k, v, w, beta, g = make_inputs(2, 48, 4, 2, 32, 32, True, torch.bfloat16)
do = make_dout(2, 48, 4, 32).to(torch.bfloat16)
cu = torch.tensor([0, 17, 96], dtype=torch.int32)


def steps():
    # name -> (the training forward's compile-only pass, the real calls of forward and
    # backward), on the garbage outputs of logged compile-only calls (which do nothing)
    pa = (q, k, v, w, beta, g, None, 0.2, 16, 0)
    fa = (q, k, v, g, cu, 0.2, 16)
    sa = (q, k, v, cu, 0.2, False, 16)
    with tlaunch.launch_log(), tlaunch.compile_only():
        saved = path_op._forward(*pa)
        fox = fox_op._forward(*fa)
    return {
        "path": (lambda: path_op._compile_step(pa, True),
                 lambda: (path_op._forward(*pa),
                          path_op._backward_kernels(do, *pa[:7], *saved, *pa[7:]))),
        "fox": (lambda: fox_op._compile_step(fa, True),
                lambda: (fox_op._forward(*fa),
                         fox_op._backward_kernels(do, *fa[:5], *fox, *fa[5:]))),
        "sba": (lambda: sba_op._compile_step(sa),
                lambda: (sba_op._forward(*sa), sba_op._backward_kernels(do, *sa))),
    }


compiled = []
triton.knobs.runtime.jit_cache_hook = lambda *a, **kw: compiled.append(kw["fn"].name)
out = {}
for name, (ahead_step, calls) in steps().items():
    compiled.clear()
    t0 = time.perf_counter()
    with tlaunch._compiling():
        ahead_step()
    ahead = list(compiled)
    compiled.clear()
    with tlaunch.compile_only():
        calls()
    out[name] = {"ahead": ahead, "again": list(compiled), "s": time.perf_counter() - t0}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # compiles every kernel of the three ops for sm_90: about 30 s
def test_compile_ahead_through_the_real_jit(tmp_path):
    """The pass through Triton's own JIT and AsyncCompileMode (no interpreter): a training
    forward's pass compiles every kernel of forward and backward, and the real calls'
    launches then compile nothing."""
    out = run_child(_REAL_JIT_CHILD, tmp_path)
    expect = {"path": {"_ut_fwd_kernel", "_seg_kernel", "_fwd_kernel", "_pi_kernel",
                       "_bwd_kernel", "_bwd_kv_kernel", "_seg_bwd_kernel", "_ut_bwd_q_kernel",
                       "_ut_bwd_kernel", "_ut_bwd_inv_kernel", "_ut_bwd_dk_kernel",
                       "_row_dot_kernel", *GATE_KERNELS},
              "fox": {"_fwd_kernel", "_dq_kernel", "_dkdv_kernel", "_tile_cumsum_kernel",
                      "_tile_offset_kernel", "_row_dot_kernel"},
              "sba": {"_fwd_kernel", "_dq_kernel", "_dkdv_kernel"}}
    # a kernel shared by the ops may be found compiled by an op before, with the same
    # arguments (FoX's gate sums after PaTH's)
    earlier: set = set()
    for op, kernels in expect.items():
        assert out[op]["again"] == [], (op, out[op])
        ahead = set(out[op]["ahead"])
        assert ahead <= kernels and kernels - ahead <= earlier, (op, out[op])
        earlier |= ahead
