"""Hostile runs of `pathattn pretrain`, export, `convert` and `eval`: the tokenizer identity
is checked wherever data, models, teachers and init weights meet (both identities named),
resume refuses every changed option, a non-finite training stops with nothing non-finite
saved and strict JSON, symlinked outputs are replaced and never followed, start-up checks
come before any work; one message, exit 2 (1 for the machine), no traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from pathattn.cli import main
from pathattn.data import DataError
from pathattn.data.identity import IDENTITY_FILE, check_same
from pathattn.train.run_dir import holds_run
from tests.faults.lm_assets import TINY_RUN, copy_prepared


def _refused(argv: list[str], capsys) -> str:
    """The message of a usage error (exit 2) of `pathattn ARGV`, without traceback."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _identity_refusal(line: str) -> None:
    """A refusal names both identities (module `pathattn.data.identity`)."""
    assert line.count("sha256 ") == 2 and line.count("300 ids") == 2, line


def _no_constant(name: str):
    raise ValueError(f"{name} is not strict JSON")


def _strict(path: Path):
    return json.loads(path.read_text(), parse_constant=_no_constant)


# ------------------------------------------------------------- tokenizer identity


def test_lm_eval_refuses_data_of_another_tokenizer(lm, tmp_path, capsys):  # 1
    pytest.importorskip("lm_eval")
    line = _refused(["eval", "lm-eval", "--model", str(lm.run_a / "hf"), "--data",
                     str(lm.data_b), "--out", str(tmp_path / "out")], capsys)
    assert line.startswith("pathattn eval lm-eval: error: --model: the tokenizer of ")
    _identity_refusal(line)
    assert not (tmp_path / "out" / "lm_eval_results.json").exists()


def test_eval_ppl_refuses_data_of_another_tokenizer(lm, capsys):  # 5 (eval ppl)
    line = _refused(["eval", "ppl", "--model", str(lm.run_a / "hf"), "--data",
                     str(lm.data_b), "--lengths", "8", "--no-progress"], capsys)
    assert "--model: the tokenizer of" in line and "its identity is" in line


@pytest.mark.parametrize("where", ["teacher-folder", "data"])
def test_convert_refuses_a_tokenizer_mismatch(lm, tmp_path, capsys, where):  # 3
    from tests.convert.conftest import make_teacher

    teacher = tmp_path / "teacher"
    make_teacher("llama", dtype=torch.float32, vocab_size=300, hidden_size=16,
                 intermediate_size=32, num_attention_heads=2, num_key_value_heads=1
                 ).save_pretrained(teacher)
    shutil.copytree(lm.tok_a, teacher, dirs_exist_ok=True)
    data = lm.data_b if where == "data" else lm.data_a
    if where == "teacher-folder":  # another tokenizer replaced the teacher's after export
        recorded = json.loads((lm.run_a / "hf" / IDENTITY_FILE).read_text())
        (teacher / IDENTITY_FILE).write_text(json.dumps(
            {**recorded, **{k: "0" * 64 for k in recorded if k.endswith("sha256")}}))
    line = _refused(["convert", "--teacher", str(teacher), "--data", str(data), "--out",
                     str(tmp_path / "out"), "--stage1-tokens", "64", "--stage2-tokens", "0",
                     "--seq-len", "16", "--batch-size", "2", "--no-progress"], capsys)
    assert ("data: the tokenizer" if where == "data" else "teacher: the tokenizer") in line
    assert line.count("sha256 ") == 2
    assert not (tmp_path / "out" / "stage1").exists()


def test_replaced_tokenizer_folder_is_refused_before_training(lm, tmp_path, capsys):  # 5
    tok, data = copy_prepared(lm, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(lm.tok_b / name, tok / name)  # same size and special ids, other merges
    line = _refused(["pretrain", "--data", str(data), *TINY_RUN, "--out",
                     str(tmp_path / "run")], capsys)
    assert f"data: the tokenizer folder {tok}" in line and "was prepared with" in line
    _identity_refusal(line)
    assert not holds_run(tmp_path / "run")


def test_init_of_another_tokenizer_is_refused(lm, tmp_path, capsys):  # 5 (--init)
    line = _refused(["pretrain", "--data", str(lm.data_b), "--init", str(lm.run_a / "hf"),
                     *TINY_RUN[2:], "--out", str(tmp_path / "run")], capsys)
    assert line.startswith("pathattn: error: init: the tokenizer of")
    _identity_refusal(line)


def test_missing_tokenizer_folder_is_found_before_training(lm, tmp_path, capsys):  # 10
    tok, data = copy_prepared(lm, tmp_path)
    shutil.rmtree(tok)
    line = _refused(["pretrain", "--data", str(data), *TINY_RUN, "--out",
                     str(tmp_path / "run")], capsys)
    assert f"the tokenizer folder {tok} named in {data / 'meta.json'} is missing" in line
    assert not holds_run(tmp_path / "run")


@pytest.mark.parametrize("command", ["longctx", "lm-eval"])
def test_model_folder_without_tokenizer_is_named(lm, tmp_path, capsys, command):  # 13
    if command == "lm-eval":
        pytest.importorskip("lm_eval")
    model = tmp_path / "hf"
    shutil.copytree(lm.run_a / "hf", model)
    for path in model.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens")):
            path.unlink()
    task = ["--task", "niah"] if command == "longctx" else ["--longctx", "niah"]
    line = _refused(["eval", command, "--model", str(model), *task, "--lengths", "64"],
                    capsys)
    assert f"--model: {model} holds no tokenizer (none of tokenizer.json" in line


def test_export_records_the_identity_and_prints_a_working_load_line(lm):  # 5, 6
    recorded = json.loads((lm.run_a / "hf" / IDENTITY_FILE).read_text())
    meta = json.loads((lm.data_a / "meta.json").read_text())
    check_same(recorded, meta["tokenizer"]["identity"], "export", "data", "run_a")
    with pytest.raises(DataError, match="run_a: export .* is not data"):
        check_same({**recorded, "vocab_size": 301}, meta["tokenizer"]["identity"], "export",
                   "data", "run_a")
    assert lm.load_line.startswith("import pathattn; ")
    model = eval(lm.load_line.rsplit("; ", 1)[1], {"AutoModelForCausalLM": __import__(
        "transformers").AutoModelForCausalLM})
    assert model.config.vocab_size == 300
    assert Path(_strict(lm.run_a / "config.json")["data"]).is_absolute()  # friction


# --------------------------------------------------------------------- resume


def test_resume_refuses_every_changed_option(lm, capsys):  # 4
    line = _refused(["pretrain", "--resume", "--out", str(lm.run_a), "--data",
                     str(lm.data_b), "--preset", "tiny", "--attn", "rope", "--model-arg",
                     "beta_max=1.5", "--steps", "5", "--seq-len", "64"], capsys)
    assert "--resume: --seq-len, --data, --attn, --model-arg beta_max, --preset, --steps " \
           "would change the run (the run's: --seq-len 32, --data " in line
    assert "given: --seq-len 64, " in line and "--attn 'rope'" in line


# --------------------------------------------------------------- non-finite


def test_non_finite_training_stops_with_nothing_non_finite_saved(lm, tmp_path, capsys):  # 2
    run = tmp_path / "run"
    code = main(["pretrain", "--data", str(lm.data_a), *TINY_RUN[:2], "--steps", "6",
                 *TINY_RUN[4:], "--lr", "1e6", "--warmup-steps", "0", "--grad-clip", "0",
                 "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "training stopped at step" in err and "not finite" in err
    assert "learning rate too high" in err
    assert not (run / "hf").exists() and not (run / "metrics.json").exists()
    for path in run.rglob("*.json*"):  # strict JSON: no bare NaN / Infinity
        if path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=_no_constant)
        elif path.suffix == ".json":
            _strict(path)
    from safetensors.torch import load_file
    for path in (run / "checkpoints").glob("model_*.safetensors"):
        assert all(bool(torch.isfinite(t).all()) for t in load_file(path).values()), path


# ------------------------------------------------------------ output folders


def test_symlinked_outputs_are_replaced_never_followed(lm, tmp_path, capsys):  # 9
    outside = {name: tmp_path / f"outside_{name}" for name in ("hf", "checkpoints", "tmp")}
    for name, folder in outside.items():
        folder.mkdir()
        (folder / "model_00000001.safetensors").write_text(name)  # checkpoint-named
        (folder / "config.json").write_text(name)
    run = tmp_path / "run"
    run.mkdir()
    (run / "hf").symlink_to(outside["hf"])
    (run / "checkpoints").symlink_to(outside["checkpoints"])
    (run / ".hf.0123abcd.tmp").symlink_to(outside["tmp"])  # a planted temp name
    (run / "config.json").write_text("{}")  # an old run: --overwrite replaces it
    assert main(["pretrain", "--data", str(lm.data_a), *TINY_RUN, "--out", str(run),
                 "--overwrite"]) == 0
    for name, folder in outside.items():
        assert {p.name: p.read_text() for p in folder.iterdir()} == {
            "model_00000001.safetensors": name, "config.json": name}
    for name in ("hf", "checkpoints"):
        assert (run / name).is_dir() and not (run / name).is_symlink()
    assert (run / "hf" / IDENTITY_FILE).is_file()
    assert not os.path.lexists(run / ".hf.0123abcd.tmp")


@pytest.mark.parametrize("case", ["out-is-a-file", "huge-seq-len", "huge-batch"])
def test_start_up_checks_come_before_any_work(lm, tmp_path, capsys, case):  # 13
    run = tmp_path / "run"
    extra = {"huge-seq-len": ["--seq-len", str(10 ** 9)],
             "huge-batch": ["--batch-size", str(10 ** 9)]}.get(case, [])
    if case == "out-is-a-file":
        run.write_text("x")
    line = _refused(["pretrain", "--data", str(lm.data_a), *TINY_RUN, *extra, "--out",
                     str(run)], capsys)
    expected = {"out-is-a-file": f"--out: {run} exists and is not a folder",
                "huge-seq-len": f"seq_len {10 ** 9} x batch_size 2",
                "huge-batch": f"seq_len 32 x batch_size {10 ** 9}"}[case]
    assert expected in line and ("more than the" in line or case == "out-is-a-file")
    if case != "out-is-a-file":
        assert not holds_run(run)  # a rerun needs no --overwrite


def test_longctx_length_beyond_memory_is_refused(lm, tmp_path, capsys):  # 13
    line = _refused(["eval", "longctx", "--model", str(lm.run_a / "hf"), "--task", "niah",
                     "--lengths", str(10 ** 9), "--n", "1", "--out", str(tmp_path)], capsys)
    assert f"lengths: a prompt of {10 ** 9:,} tokens needs at least" in line


@pytest.mark.parametrize("case", ["empty-val", "max-length-0"])
def test_lm_eval_refuses_empty_val_and_zero_max_length(lm, tmp_path, capsys, case):
    pytest.importorskip("lm_eval")  # 13, friction
    if case == "empty-val":
        _, data = copy_prepared(lm, tmp_path, val_fraction="0")
        argv, expected = ["--data", str(data)], "the val split of"
    else:
        argv, expected = ["--tasks", "x", "--max-length", "0"], "--max-length must be >= 1"
    line = _refused(["eval", "lm-eval", "--model", str(lm.run_a / "hf"), *argv, "--out",
                     str(tmp_path / "out")], capsys)
    assert expected in line


def test_missing_local_teacher_is_named(lm, tmp_path, capsys):  # friction
    line = _refused(["convert", "--teacher", str(tmp_path / "nope"), "--data",
                     str(lm.data_a), "--out", str(tmp_path / "out")], capsys)
    assert f"teacher: no such folder {tmp_path / 'nope'}" in line
    assert "connection" not in line.lower()


def test_full_disk_during_training_exits_1_with_the_resume_command(lm, tmp_path, capsys):
    import resource  # 13: a checkpoint past `ulimit -f`

    run = tmp_path / "run"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        code = main(["pretrain", "--data", str(lm.data_a), *TINY_RUN, "--out", str(run)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert "no space left" in err and "--resume" in err
    assert not [p for p in run.rglob("*.tmp")]
