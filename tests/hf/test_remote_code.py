"""Exports load by name where pathattn was never imported (`pathattn.hf.export`): auto_map
and its modules beside the weights, a tokenizer that adds no BOS of its own, lm-eval's own
command line giving `pathattn eval lm-eval`'s numbers, and exports made before auto_map
still loading after `import pathattn`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pathattn

pytest.importorskip("transformers")

from pathattn.hf.export import AUTO_MAP, REMOTE_CODE_FILES  # noqa: E402

PROMPT = "the river stone mill"
NEW_TOKENS = 8

# run in a fresh interpreter: never imports pathattn itself
FRESH_PROCESS = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

folder, prompt, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.modules["pathattn"] = None  # as if pathattn were not installed
try:
    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    missing = "loaded without pathattn"
except ImportError as e:
    missing = str(e)
del sys.modules["pathattn"]
imported_before = "pathattn" in sys.modules
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
ids = tok(prompt)["input_ids"]
with torch.no_grad():
    out = model.generate(torch.tensor([[tok.bos_token_id] + ids]), max_new_tokens=new,
                         do_sample=False)
print(json.dumps({"missing": missing, "imported_before": imported_before,
                  "class": f"{type(model).__module__}.{type(model).__name__}",
                  "ids": ids, "generated": out[0].tolist()}))
"""


def fresh_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a fresh process: pathattn importable as when installed, offline,
    transformers' module cache under tmp_path."""
    root = str(Path(pathattn.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_MODULES_CACHE": str(tmp_path / "modules"), "TOKENIZERS_PARALLELISM": "false"}


def test_export_writes_auto_map_modules_and_a_tokenizer_without_bos(tiny_export, tmp_path):
    from transformers import AutoTokenizer

    from pathattn.convert import export_student
    from pathattn.data import TokenDataset, load_tokenizer
    from pathattn.data.identity import data_identity
    from pathattn.hf import PaTHForCausalLM
    from pathattn.train.pretrain import check_init_tokenizer

    source = load_tokenizer(tiny_export.tokenizer)
    student = PaTHForCausalLM.from_pretrained(tiny_export.model)
    converted = export_student(student, tmp_path / "converted", source)
    for folder in (tiny_export.model, converted):  # pathattn pretrain, pathattn convert
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == AUTO_MAP
        for name in REMOTE_CODE_FILES:
            assert (folder / name).read_bytes() == (
                Path(pathattn.__file__).parent / "hf" / "remote_code" / name).read_bytes()
        tok = AutoTokenizer.from_pretrained(folder)
        assert source(PROMPT)["input_ids"] == [source.bos_token_id] + tok(PROMPT)["input_ids"]
        assert tok.bos_token_id == source.bos_token_id
        # the same tokenizer for pathattn: an export still initialises a run on its data
        check_init_tokenizer(folder, data_identity(TokenDataset(tiny_export.data, "train").meta))
    assert source(PROMPT)["input_ids"][0] == source.bos_token_id  # the source is unchanged


def test_a_fresh_process_loads_the_export_by_name(tiny_export, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tiny_export.model), PROMPT,
                          str(NEW_TOKENS)], capture_output=True, text=True, timeout=300,
                         env=fresh_env(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert "pip install 'pathattn[hf]'" in got["missing"]
    assert got["imported_before"] is False
    assert got["class"] == "pathattn.hf.modeling.PaTHForCausalLM"  # the installed code
    model = AutoModelForCausalLM.from_pretrained(tiny_export.model).eval()
    tok = AutoTokenizer.from_pretrained(tiny_export.model)
    ids = tok(PROMPT)["input_ids"]
    assert got["ids"] == ids and ids[0] != tok.bos_token_id
    with torch.no_grad():
        want = model.generate(torch.tensor([[tok.bos_token_id] + ids]),
                              max_new_tokens=NEW_TOKENS, do_sample=False)
    assert got["generated"] == want[0].tolist()
    assert len(got["generated"]) == 1 + len(ids) + NEW_TOKENS


def test_an_export_without_auto_map_loads_after_import(tiny_export, tmp_path):
    """A folder saved before exports wrote auto_map: loads once pathattn is imported, with
    or without trust_remote_code, to the same logits."""
    from transformers import AutoModelForCausalLM

    old = tmp_path / "old"
    shutil.copytree(tiny_export.model, old)
    config = json.loads((old / "config.json").read_text())
    del config["auto_map"]
    (old / "config.json").write_text(json.dumps(config))
    for name in REMOTE_CODE_FILES:
        (old / name).unlink()
    ids = torch.tensor([[0, 5, 9, 20, 7]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(tiny_export.model)(ids).logits
        for trust in (False, True):
            model = AutoModelForCausalLM.from_pretrained(old, trust_remote_code=trust)
            assert torch.equal(model(ids).logits, want)
    model.save_pretrained(tmp_path / "again")  # saving it again adds what was missing
    assert json.loads((tmp_path / "again" / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert all((tmp_path / "again" / name).is_file() for name in REMOTE_CODE_FILES)


def test_lm_eval_cli_matches_pathattn_eval_lm_eval(tiny_export, tmp_path):
    """`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True` (lm-eval's
    defaults otherwise, no add_bos_token) on the held-out perplexity task scores what
    `pathattn eval lm-eval` scores, to 1e-6. The two run at the same time (each spends
    most of its time importing lm-eval and indexing its task folders)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("lm_eval.models.huggingface")
    from pathattn.cli import main
    from pathattn.evaluation import lmeval

    tasks = tmp_path / "tasks"
    lmeval.write_ppl_task(tiny_export.data, tasks)
    cli = subprocess.Popen(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
         f"pretrained={tiny_export.model},trust_remote_code=True", "--device", "cpu",
         "--tasks", lmeval.PPL_TASK, "--include_path", str(tasks), "--limit", "3",
         "--output_path", str(tmp_path / "cli")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=fresh_env(tmp_path),
        cwd=tmp_path)
    try:
        assert main(["eval", "lm-eval", "--model", str(tiny_export.model), "--tasks",
                     lmeval.PPL_TASK, "--include-path", str(tasks), "--limit", "3",
                     "--device", "cpu", "--out", str(tmp_path / "ours")]) == 0
        _, stderr = cli.communicate(timeout=300)
    finally:
        cli.kill()
    assert cli.returncode == 0, stderr[-3000:]
    want = json.loads((tmp_path / "ours" / "lm_eval_results.json").read_text())
    want = want["results"][lmeval.PPL_TASK]
    (path,) = (tmp_path / "cli").rglob("results_*.json")
    got = json.loads(path.read_text())["results"][lmeval.PPL_TASK]
    metrics = [k for k in want if k.endswith(",none") and "stderr" not in k]
    assert {"token_perplexity,none", "word_perplexity,none"} <= set(metrics)
    for key in metrics:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=0), key
