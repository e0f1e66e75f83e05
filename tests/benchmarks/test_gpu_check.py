"""`benchmarks/gpu_check.py --cpu-smoke` runs every section's plumbing at tiny sizes on the
CPU (Triton's interpreter, SDPA's math backend, the "tiny" model preset): one run in a
subprocess, then its JSON and markdown are checked section by section. The lm_commands
section is left out (a few minutes of subprocesses on 2 cores; every command it runs has its
own tests) and must show as not asked.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # one run of ~40 s on 2 cores, shared by the tests below
SECTIONS = ("environment", "first_call", "triage", "speed", "pipelining", "lm_step",
            "profile", "correctness", "fox_kernels", "sba_kernels", "generate",
            "launch_settings")
NOT_ASKED = ("lm_commands",)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[dict, str]:
    """(gpu_check.json, gpu_check.md) of one --cpu-smoke run."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PATHATTN_CPU_KERNEL": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    run = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--cpu-smoke", "--out",
                          str(out), "--label", "smoke", "--sections", *SECTIONS], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def _rows(smoke, name: str) -> list[dict]:
    return smoke[0]["sections"][name]["rows"]


def test_every_section_ran(smoke):
    data, md = smoke
    assert data["meta"]["finished"] and data["meta"]["label"] == "smoke"
    assert list(data["sections"]) == list(SECTIONS + NOT_ASKED)
    for name in NOT_ASKED:
        assert data["sections"][name]["status"] == "skipped (not asked)"
    for name in SECTIONS:
        sec = data["sections"][name]
        assert sec["status"] == "ok", (name, sec.get("error"), sec.get("traceback"))
        assert f"## {name}: ok" in md


def test_environment(smoke):
    info = smoke[0]["sections"]["environment"]["info"]
    assert info["device"] == "cpu" and info["torch"] and info["TRITON_INTERPRET"] == "1"
    assert info["fla"]  # a version, or "n/a: <why>"
    assert info["ptxas"][0].isdigit(), info["ptxas"]  # the installed Triton's ptxas version


def test_first_call_per_dtype(smoke):
    """The smoke plan runs one dtype's child process (the GPU plans run bf16, fp16, fp32)."""
    rows = _rows(smoke, "first_call")
    assert [r["dtype"] for r in rows] == ["fp32"]
    for r in rows:
        assert r["status"] == "ok" and _positive(r["first_s"]) and _positive(r["second_s"])
        # on the CPU the kernels are interpreted: nothing compiles ahead, and nothing failed
        assert r["compiled_ahead"] == 0 and r["compile_ahead_error"] is None
        assert r["compile_threads"] >= 2


def test_triage_rows(smoke):
    """Each variant ran in its own process and is exact; none failed, so no memcheck ran."""
    sec = smoke[0]["sections"]["triage"]
    rows = {r["case"]: r for r in sec["rows"]}
    assert list(rows) == ["D16-gates-G1-dense-BT16", "D16-nogates-G2-packed-BT16"]
    for name, r in rows.items():
        assert r["status"] == "ok" and r["finite"] is True, r
        assert (r["BT"], r["seg"], r["n_seg"]) == (16, 2, 2), r
        names = ("o", "dq", "dk", "dv", "dw", "dbeta") + (("dg",) if "-gates" in name else ())
        assert all(isinstance(r[k], float) and 0 <= r[k] < 0.05 for k in names), r
        assert ("dg" in r) == ("-gates" in name)
    assert not any(t.startswith("memcheck") for t in sec.get("text", {}))


def test_failed_variant_reads_the_triage_rows():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _gpu_triage import failed_variant

    sec = {"rows": [{"case": "D64-nogates-G1-dense-H16-T512", "D": 64, "gates": False,
                     "status": "error"},
                    {"case": "D64-nogates-G2-dense", "D": 64, "gates": False, "status": "ok"},
                    {"case": "D64-gates-G1-dense", "D": 64, "gates": True, "status": "ok"}]}
    assert failed_variant(sec, 64, False)  # any failure at that head dim and gating
    assert not failed_variant(sec, 64, True)
    assert not failed_variant(sec, 128, False)  # not in the rows: not seen failing
    assert not failed_variant({}, 64, False)  # triage skipped or not asked
    # a row of a launch setting the op does not use (rows of E) tells a cause apart only
    diag = {"rows": [{"case": "D64-gates-G2-dense-E32", "D": 64, "gates": True, "rows": 32,
                      "status": "error"}]}
    assert not failed_variant(diag, 64, True)
    diag["rows"][0]["rows"] = None
    assert failed_variant(diag, 64, True)


def test_triage_cases_of_the_gpu_plans():
    """Every case of a GPU plan has its own name (a child finds its case by name); the
    diagnostic rows-of-E cases run the op's own block length at D 64."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _gpu_triage import _case_by_name, cases

    for mode in ("full", "quick"):
        names = [c.name for c in cases(mode)]
        assert len(set(names)) == len(names), names
        assert all(_case_by_name(mode, n).name == n for n in names)
        diag = [c for c in cases(mode) if c.rows is not None]
        assert diag and all(c.D == 64 and c.rows == 32 and c.block_size is None for c in diag)


def test_correctness_errors(smoke):
    rows = _rows(smoke, "correctness")
    cases = {(r["case"], r["dtype"]) for r in rows}
    assert len(cases) == 4
    for case, dtype in cases:
        impls = {r["impl"]: r for r in rows if (r["case"], r["dtype"]) == (case, dtype)}
        # plain PyTorch's error is the 16-bit rule's yardstick only
        expect = ["triton", "torch", "fla"] if dtype == "fp32" else ["triton", "plain",
                                                                     "torch", "fla"]
        assert list(impls) == expect
        outputs = ("o", "dq", "dk", "dv", "dw", "dbeta") + (() if "nogates" in case
                                                            else ("dg",))
        for name in expect[:-1]:
            errs = [impls[name][k] for k in outputs]
            assert all(isinstance(e, float) and 0 <= e < 0.1 for e in errs), (case, name)
            assert ("dg" in impls[name]) == ("nogates" not in case)
        assert impls["triton"]["ok"] is True, impls["triton"]
        if dtype != "fp32":
            assert _positive(impls["triton"]["worst_vs_plain"])
        fla = impls["fla"]
        assert fla.get("status", "").startswith("n/a") or isinstance(fla["o"], float)


def test_speed_rows(smoke):
    rows = _rows(smoke, "speed")
    assert [r["gates"] for r in rows] == [True, False]
    for r in rows:
        for key in ("sdpa_fwd_ms", "sdpa_fwdbwd_ms", "path_fwd_ms", "path_fwdbwd_ms",
                    "ours/sdpa_fwd", "ours/sdpa_fwdbwd"):
            assert _positive(r[key]), (key, r)
        assert r["fla_fwd_ms"] == "n/a" or _positive(r["fla_fwd_ms"])


def test_pipelining_rows(smoke):
    """The defaults, then every other depth of 1..3 for each pipelined kernel, each timed
    with its ratio to the defaults."""
    from pathattn.ops.path.triton.config import PIPELINED

    rows = _rows(smoke, "pipelining")
    assert rows[0]["kernel"] == "default" and all(k in rows[0]["PIPE"] for k in PIPELINED)
    others = rows[1:]
    assert {r["kernel"] for r in others} == set(PIPELINED)
    for k in PIPELINED:  # two depths besides the default's
        assert len({r["PIPE"] for r in others if r["kernel"] == k}) == 2
    for r in rows:
        assert "status" not in r, r
        assert _positive(r["fwd_ms"]) and _positive(r["fwdbwd_ms"])
    for r in others:
        assert _positive(r["fwd/default"]) and _positive(r["fwdbwd/default"])


def test_launch_settings_rows(smoke):
    """The defaults, then each smoke setting, each in its own process, timed with its ratio
    to the defaults; the changed setting shows in the row (twice the segment length, the
    query kernel's walk through loop-invariant offsets)."""
    rows = _rows(smoke, "launch_settings")
    assert [(r["setting"], r["value"]) for r in rows] == [
        ("default", ""), ("seg", "x2"), ("walk_hoist", "on")]
    for r in rows:
        assert r["status"] == "ok", r
        assert _positive(r["fwd_ms"]) and _positive(r["fwdbwd_ms"]) and r["seconds"] > 0
    for r in rows[1:]:
        assert _positive(r["fwd/default"]) and _positive(r["fwdbwd/default"])
    assert rows[1]["seg"] == 2 * rows[0]["seg"] and rows[2]["seg"] == rows[0]["seg"]
    assert [r["warps"] for r in rows] == ["4/4/4"] * 3  # fwd / bwd / bwd_kv
    assert [r["walk_hoist"] for r in rows] == [False, False, True]


def test_profile_table(smoke):
    sec = smoke[0]["sections"]["profile"]
    path = [r for r in sec["rows"] if r["impl"] == "path"]
    assert path[0]["status"] == "ok" and _positive(path[0]["self_ms_total"])
    assert any(title.startswith("path") and "Name" in text for title, text in
               sec["text"].items())
    assert "```" in smoke[1]


def test_lm_step_every_type(smoke):
    rows = _rows(smoke, "lm_step")
    assert [r["attn"] for r in rows] == ["rope", "path", "path_fox", "fox", "sba"]
    for r in rows:
        assert r["status"] == "ok" and _positive(r["step_s"]) and _positive(r["vs_rope"])


@pytest.mark.parametrize("section, impl", [("fox_kernels", "fox"), ("sba_kernels", "sba")])
def test_gated_and_stick_breaking_kernels(smoke, section, impl):
    rows = _rows(smoke, section)
    errors = [r for r in rows if "case" in r]
    speed = [r for r in rows if "case" not in r]
    assert errors and speed
    for r in errors:
        assert r["status"] == "ok", r
        errs = [v for k, v in r.items() if k.startswith("triton_")]
        assert errs and all(isinstance(e, float) and 0 <= e < 0.05 for e in errs), r
    for r in speed:
        for key in ("sdpa_fwd_ms", "sdpa_fwdbwd_ms", f"{impl}_fwd_ms", f"{impl}_fwdbwd_ms",
                    f"{impl}/sdpa_fwdbwd"):
            assert _positive(r[key]), (key, r)


def test_generate_rows(smoke):
    rows = {r["model"]: r for r in _rows(smoke, "generate")}
    assert list(rows) == ["llama", "path", "path_fox", "fox", "rope"]
    for name, r in rows.items():
        assert r["status"] == "ok" or r["status"].startswith("unreliable"), r
        if r["status"] == "ok":
            assert _positive(r["per_token_ms"]) and _positive(r["prompt_ms"])
        if name != "llama" and "host_reads_per_step" in r:
            assert r["host_reads_per_step"] == 0, r


def test_launch_settings_compare_each_head_dim_with_its_own_defaults(monkeypatch):
    """A D = 128 row's ratios are to the D = 128 defaults, not to the first row's D = 64;
    the full list times the key tiles D = 128 took before its defaults changed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _gpu_launch as gl

    full = gl.settings(False)
    assert ("default", "D 128", {"D": 128}) in full
    assert ("walk_hoist", "off", {"fields": {"walk_hoist": False}}) in full
    assert ("own_hoist", "off D 128", {"D": 128, "fields": {"own_hoist": False}}) in full
    assert ("kv_tiles", "32x32 4 warps D 128",
            {"D": 128, "kv": (32, 32), "warps": ("bwd_kv", 4)}) in full
    rows = [("default", "D 128", {"D": 128}), ("kv_tiles", "16x32", {"D": 128, "kv": (16, 32)}),
            ("seg", "x2", {"seg_scale": 2.0})]
    times = {0: (64, 1.0), 1: (128, 4.0), 2: (128, 6.0), 3: (64, 3.0)}
    monkeypatch.setattr(gl, "settings", lambda smoke: rows)
    monkeypatch.setattr(gl, "_run_child", lambda ctx, i: {
        "D": times[i][0], "fwd_ms": times[i][1], "fwdbwd_ms": 2 * times[i][1]})

    class Ctx:
        mode, out = "full", []

        def expired(self):
            return False

        def add_row(self, sec, row):
            self.out.append(row)

    ctx = Ctx()
    gl.launch_settings(ctx, None)
    assert [r.get("fwd/default") for r in ctx.out] == [None, None, 1.5, 3.0]
    assert ctx.out[2]["fwdbwd/default"] == 1.5
