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


# Child source (after STUB): per case of sys.argv[2], JSON [(op, dtype, D, gates, HQ, H,
# R)], the JIT's view of a training step's launches (the compile-only pass of a forward
# requiring grad, the JIT's cache hook refusing every compilation) and the op's `fit`
# views of its kernels, a list per kernel function: argument types (constexpr ones left
# out), divisibility attributes, constants by argument index and (num_warps, num_stages,
# maxnreg).
JIT_VS_FIT = r"""
import json, torch, triton
from pathattn.ops.common import triton_launch as tlaunch
from pathattn.ops.fox.triton import fit as fox_fit, op as fox_op
from pathattn.ops.path.triton import fit as path_fit, op as path_op
from pathattn.ops.path.triton.config import launch_config
from pathattn.ops.sba.triton import fit as sba_fit, op as sba_op
from tests.ops.path._helpers import make_inputs, make_reflection_inputs


def view(fn, signature, attrs, constexprs, warps, stages, maxnreg=None):
    return {"signature": {k: v for k, v in signature.items() if v != "constexpr"},
            "attrs": {str(list(k)): v for k, v in attrs.items() if v},
            "constants": {str([fn.arg_names.index(k)]): repr(v)
                          for k, v in constexprs.items()},
            "launch": [warps, stages, maxnreg]}


def fit_views(op, dtype, D, gates, HQ, H, R):
    if op == "path":
        cfg = launch_config(D, D, dtype, path_fit.DEVICES["sm_90"][1], None, (9, 0), R)
        out = {}
        for name, fn in path_fit._KERNEL_FN.items():
            sig, attrs = path_fit._signature(fn, dtype, gates, HQ // H)
            consts = path_fit._constexprs(name, D, dtype, gates, cfg, HQ // H)
            out[fn.fn.__name__] = [view(fn, sig, attrs, consts, *cfg.launch(name),
                                        cfg.max_registers(name))]
        return cfg.BT, out
    if op == "fox":
        specs = fox_fit.specializations(D, dtype, HQ // H, heads=HQ)
    else:
        specs = sba_fit.specializations(D, dtype, HQ // H)
    out = {}
    for s in specs:
        out.setdefault(s.fn.fn.__name__, []).append(
            view(s.fn, s.signature, s.attrs, s.constexprs, s.num_warps, s.num_stages))
    return 0, out


out = []
for op, dt, D, gates, HQ, H, R in json.loads(sys.argv[2]):
    dtype = getattr(torch, dt)
    if R == 1:
        q, k, v, w, beta, g = make_inputs(2, 128, HQ, H, D, D, gates, dtype)
    else:
        q, k, v, w, beta, g = make_reflection_inputs(2, 128, HQ, H, D, D, R, gates, dtype)
    BT, fits = fit_views(op, dtype, D, gates, HQ, H, R)
    seen = []

    def hook(*args, **kw):
        c = kw["compile"]
        consts = {str(list(k)): repr(v) for k, v in c["constants"].items()}
        seen.append({"kernel": kw["fn"].name,
                     "signature": {k: v for k, v in c["signature"].items()
                                   if v != "constexpr"},
                     "attrs": {str(list(k)): v for k, v in dict(c["configs"][0]).items() if v},
                     "constants": consts,
                     "launch": [c["num_warps"], c["num_stages"],
                                json.loads(c["specialization_data"])["options"]["maxnreg"]]})
        return True  # no compilation

    triton.knobs.runtime.jit_cache_hook = hook
    with tlaunch.compile_only():
        if op == "path":
            path_op._compile_step((q, k, v, w, beta, g, None, D ** -0.5, BT, 0), True)
        elif op == "fox":
            fox_op._compile_step((q, k, v, g, None, D ** -0.5, 0), True)
        else:
            sba_op._compile_step((q, k, v, None, D ** -0.5, False, 0))
    triton.knobs.runtime.jit_cache_hook = None
    out.append({"case": [op, dt, D, gates, HQ, H, R], "jit": seen, "fit": fits})
print("RESULT" + json.dumps(out))
"""


def assert_jit_matches_fit(cases: list[tuple], cache_dir: Path, fix=None) -> None:
    """Run JIT_VS_FIT on `cases` ((op, dtype, D, gates, HQ, H, R) each): in every case each
    launch has the argument types, divisibility, constants and launch options of one of
    the op's `fit` views of its kernel, and every view is launched; fix(kernel, constants,
    fit_constants) may adjust a launch's constants first (a documented difference)."""
    out = run_child(JIT_VS_FIT, cache_dir, json.dumps(cases))
    assert [c["case"] for c in out] == [list(c) for c in cases]
    for case in out:
        _assert_case(case, fix)


# per op, the kernels it launches from `pathattn.ops.common` outside its `fit` tables:
# row_dot (one elementwise pass) and, in PaTH, the gates' sums and offsets (triton_gates,
# which FoX's fit lists); no loop over block pairs, no atomic (tests/ops/common)
SHARED_KERNELS = {"path": {"_row_dot_kernel", "_tile_cumsum_kernel", "_tile_offset_kernel",
                           "_block_offsets_kernel"},
                  "fox": {"_row_dot_kernel"}, "sba": set()}


def _assert_case(case: dict, fix) -> None:
    fits, where = case["fit"], case["case"]
    jit = [j for j in case["jit"] if j["kernel"] not in SHARED_KERNELS[where[0]]]
    assert {j["kernel"] for j in jit} == set(fits), where
    used = set()
    for j in jit:
        found = None
        for i, f in enumerate(fits[j["kernel"]]):
            consts = dict(j["constants"])
            if fix is not None:
                fix(j["kernel"], consts, f["constants"])
            if consts == f["constants"] and all(j[k] == f[k] for k in
                                                ("signature", "attrs", "launch")):
                found = i
                break
        assert found is not None, (where, j, fits[j["kernel"]])
        used.add((j["kernel"], found))
    assert used == {(k, i) for k, views in fits.items() for i in range(len(views))}, where
