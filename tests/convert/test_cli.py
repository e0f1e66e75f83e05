"""`pathattn convert` end to end with a tiny Llama teacher folder and tiny prepared data:
the exported model loads with the Auto classes and generates, metrics.json reports both
perplexities after each stage, an interrupted conversion resumes to the same result,
errors are clear; `pathattn pretrain --init` continues from the export."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from pathattn.cli import build_parser, main
from pathattn.cli.convert import convert_options
from pathattn.convert.pipeline import stage_configs
from pathattn.train import Trainer, read_jsonl


def convert_args(teacher_dir, prepared, out) -> list[str]:
    return ["convert", "--teacher", str(teacher_dir), "--data", str(prepared), "--out",
            str(out), "--stage1-tokens", "192", "--stage2-tokens", "128", "--seq-len", "32",
            "--batch-size", "2", "--eval-batches", "1", "--final-eval-batches", "2",
            "--log-every", "1", "--checkpoint-every", "1", "--no-progress"]


@pytest.fixture(scope="module")
def converted(teacher_dir, prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("converted") / "out"
    assert main(convert_args(teacher_dir, prepared, out)) == 0
    return out


def test_export_loads_and_generates(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(converted / "hf").eval()
    tok = AutoTokenizer.from_pretrained(converted / "hf")
    assert model.config.model_type == "pathattn" and model.config.attn_type == "path"
    ids = tok("def main():", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)


def test_metrics_report_each_stage(converted):
    m = json.loads((converted / "metrics.json").read_text())
    assert m["teacher"]["val_ppl"] > 1 and m["teacher_ppl"] == m["teacher"]["val_ppl"]
    for stage in ("init", "stage1", "stage2"):
        assert {"val_student_ppl", "val_kl", "val_mse"} <= set(m[stage])
    assert (m["stage1"]["step"], m["stage2"]["step"]) == (3, 2)
    assert m["final_kl"] == m["stage2"]["val_kl"] >= 0
    assert m["ppl_ratio"] == pytest.approx(m["final_ppl"] / m["teacher_ppl"])
    for stage in ("stage1", "stage2"):
        assert [r["step"] for r in read_jsonl(converted / stage / "log.jsonl")] == \
            list(range(1, m[stage]["step"] + 1))


def test_resume_of_a_finished_conversion_reuses_it(converted, teacher_dir, prepared):
    logs = {p: p.stat().st_mtime_ns for p in converted.glob("stage*/log.jsonl")}
    before = json.loads((converted / "metrics.json").read_text())
    assert main([*convert_args(teacher_dir, prepared, converted), "--resume"]) == 0
    assert {p: p.stat().st_mtime_ns for p in converted.glob("stage*/log.jsonl")} == logs
    after = json.loads((converted / "metrics.json").read_text())
    assert after == before


def test_interrupted_conversion_resumes_to_the_same_result(converted, teacher_dir,
                                                           prepared, tmp_path):
    out = tmp_path / "out"
    argv = convert_args(teacher_dir, prepared, out)
    args = build_parser().parse_args(argv)
    first = stage_configs(args.teacher, args.data, str(out), **{
        k: v for k, v in convert_options(args).items()})[0]
    with Trainer(first) as trainer:  # stage 1 stopped after one of its three steps
        trainer.train(until=1)
    assert main([*argv, "--resume"]) == 0
    for stage in ("stage1", "stage2"):
        assert [r["loss"] for r in read_jsonl(out / stage / "log.jsonl")] == \
            [r["loss"] for r in read_jsonl(converted / stage / "log.jsonl")]
    got = json.loads((out / "metrics.json").read_text())
    want = json.loads((converted / "metrics.json").read_text())
    assert got["final_kl"] == want["final_kl"] and got["final_ppl"] == want["final_ppl"]


def test_existing_output_needs_resume_or_overwrite(converted, teacher_dir, prepared, capsys):
    with pytest.raises(SystemExit):
        main(convert_args(teacher_dir, prepared, converted))
    assert "--resume" in capsys.readouterr().err


def test_fsdp_needs_torchrun(teacher_dir, prepared, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*convert_args(teacher_dir, prepared, tmp_path / "out"), "--dp", "fsdp"])
    assert "torchrun" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unsupported_teacher_is_named(prepared, tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=512)
                    ).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(SystemExit):
        main(convert_args(tmp_path / "gpt2", prepared, tmp_path / "out"))
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel is not supported" in err and "Qwen3ForCausalLM" in err


def test_pretrain_init_continues_from_the_export(converted, prepared, tmp_path, capsys):
    from pathattn.hf import PaTHForCausalLM
    from pathattn.models import PaTHLM
    from pathattn.train.pretrain import init_model_config, load_init_weights

    config = init_model_config(converted / "hf")
    lm = load_init_weights(PaTHLM(config), converted / "hf").eval()
    hf = PaTHForCausalLM.from_pretrained(converted / "hf").eval()
    ids = torch.randint(0, config.vocab_size, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(lm(ids)[0], hf(ids, use_cache=False).logits)

    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(prepared), "--init", str(converted / "hf"),
                 "--steps", "1", "--seq-len", "32", "--batch-size", "2", "--eval-batches",
                 "1", "--final-eval-batches", "1", "--no-progress", "--no-export",
                 "--out", str(run)]) == 0
    stored = json.loads((run / "config.json").read_text())
    assert stored["init"] == str(converted / "hf") and stored["model"] == config.to_dict()
    with pytest.raises(SystemExit):
        main(["pretrain", "--data", str(prepared), "--init", str(converted / "hf"),
              "--attn", "rope", "--out", str(tmp_path / "r2")])
    assert "--attn does not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["pretrain", "--data", str(prepared), "--init", os.fspath(prepared),
              "--out", str(tmp_path / "r3")])
    assert "not a model folder" in capsys.readouterr().err
