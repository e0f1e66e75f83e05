"""The score on hand-made outputs, greedy generation through a stand-in model, and
`pathattn eval longctx` end to end with a tiny randomly initialised pathattn model."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from pathattn.cli import build_parser
from pathattn.evaluation.longctx import (
    answer_budget,
    evaluate_task,
    make_task,
    results_table,
    score,
    score_example,
)


@pytest.mark.parametrize(("output", "answers", "expected"), [
    (" 1234567.", ["1234567"], 1.0),
    (" 7654321 and then 1234567", ["1234567", "7654321"], 1.0),
    (" 1234567, 1111111 and", ["1234567", "7654321"], 0.5),
    ("", ["1234567"], 0.0),
    (" abcde, FGHIJ", ["ABCDE", "FGHIJ", "KLMNO"], 2 / 3),  # case-insensitive
    (" 12345678", ["1234567"], 1.0),  # a substring, as in RULER
    (" anything", [], 0.0),
], ids=["one", "all-reordered", "half", "empty", "case", "substring", "no-answers"])
def test_score(output, answers, expected):
    assert score(output, answers) == pytest.approx(expected)


class Parrot(torch.nn.Module):
    """Stands in for a causal LM: generate() appends fixed ids (then EOS and padding)."""

    def __init__(self, reply: list[int]):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.reply = reply
        self.calls = []

    def generate(self, ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
        self.calls.append(dict(tokens=ids.shape[1], max_new_tokens=max_new_tokens,
                               do_sample=do_sample))
        new = torch.tensor([self.reply[:max_new_tokens]], dtype=ids.dtype)
        return torch.cat([ids, new], dim=1)


def test_score_example_decodes_the_continuation_only(bpe):
    ex = make_task("phonebook").example(bpe, 512)
    reply = bpe(f" {ex.answers[0]}.", add_special_tokens=False)["input_ids"] + \
        [bpe.eos_token_id, bpe.pad_token_id]
    model = Parrot(reply)
    record = score_example(model, bpe, ex)
    assert record["output"] == f" {ex.answers[0]}." and record["score"] == 1.0
    assert model.calls == [dict(tokens=ex.num_tokens, max_new_tokens=answer_budget(bpe, ex),
                                do_sample=False)]
    wrong = score_example(Parrot(bpe(" 555-0000.")["input_ids"][1:]), bpe, ex)
    assert wrong["score"] == float(ex.answers[0] == "555-0000")
    results = evaluate_task(model, bpe, make_task("phonebook"), [512, 768], 2, progress=False)
    assert [r["length"] for r in results["rows"]] == [512, 768]
    assert len(results["examples"]) == 4
    assert "| 512 | 2 |" in results_table(results)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, request):
    from pathattn.hf import PaTHConfig, PaTHForCausalLM

    tok = request.getfixturevalue("bpe")
    path = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = PaTHConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, w_rank=8,
                        max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    PaTHForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def parse(argv: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """`pathattn eval longctx ARGV` parsed by the registered command line."""
    parser = build_parser()
    return parser.parse_args(["eval", "longctx", *argv]), parser


@pytest.mark.parametrize(("task", "extra"), [("niah", ["--variant", "multikey"]),
                                             ("vt", ["--chains", "2", "--hops", "2"]),
                                             ("phonebook", [])], ids=["niah", "vt", "phonebook"])
def test_cli_end_to_end(tiny_model_dir, tmp_path, capsys, task, extra):
    out = tmp_path / "results"
    args, parser = parse(["--model", str(tiny_model_dir), "--task", task, "--lengths", "600",
                          "900", "--n", "2", "--seed", "3", "--out", str(out),
                          "--no-progress", *extra])
    assert args.run(args, parser) == 0
    variant = "multikey" if task == "niah" else "default"
    results = json.loads((out / f"longctx_{task}_{variant}.json").read_text())
    assert [r["length"] for r in results["rows"]] == [600, 900]
    assert all(r["examples"] == 2 and 0 <= r["accuracy"] <= 1 and
               0.97 * r["length"] <= r["prompt_tokens"] <= r["length"] for r in results["rows"])
    assert len(results["examples"]) == 4 and results["seed"] == 3
    assert {"answers", "output", "score", "num_tokens"} <= set(results["examples"][0])
    table = (out / f"longctx_{task}_{variant}.md").read_text()
    assert "| length | examples | accuracy (%) |" in table and "| 900 | 2 |" in table
    printed = capsys.readouterr().out
    assert "| 600 | 2 |" in printed
    assert sorted(p.name for p in out.iterdir()) == [f"longctx_{task}_{variant}.json",
                                                     f"longctx_{task}_{variant}.md"]


def test_cli_usage_errors(tiny_model_dir, capsys):
    for argv, message in ((["--variant", "sideways"], "unknown variant"),
                          (["--n", "0"], "--n and --lengths"),
                          (["--hops", "2"], "num_hops")):
        args, parser = parse(["--model", str(tiny_model_dir), "--task", "niah",
                              "--lengths", "600", *argv])
        with pytest.raises(SystemExit) as e:
            args.run(args, parser)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_prompts_start_with_bos_whatever_the_tokenizer_template(bpe):
    """An export's tokenizer adds no BOS of its own (`pathattn.hf.export.without_bos`); the
    prompt a model receives still starts with the BOS that began every training document,
    so data tokenizer and export agree on ids and lengths."""
    from pathattn.evaluation.longctx import count_tokens
    from pathattn.evaluation.longctx.common import prompt_ids
    from pathattn.hf.export import without_bos

    export = without_bos(bpe)
    text = "One of the special magic numbers for calm-otter is: 1234567."
    assert export(text)["input_ids"][0] != bpe.bos_token_id  # the template really differs
    assert prompt_ids(export, text) == prompt_ids(bpe, text) == bpe(text)["input_ids"]
    assert prompt_ids(bpe, text)[0] == bpe.bos_token_id
    assert count_tokens(export, text) == count_tokens(bpe, text)
