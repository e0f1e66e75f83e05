"""`pathattn eval ppl`: per-position losses against a direct forward + cross-entropy, ppl
as exp(mean loss), the chunked LM head against the unchunked one, the per-document mode,
and the command's errors (model folders: test_ppl_models.py)."""

from __future__ import annotations

import argparse
import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pathattn.cli import main
from pathattn.cli.eval.ppl import add_arguments
from pathattn.evaluation.ppl import (
    PplError,
    Scorer,
    document_windows,
    evaluate_documents,
    evaluate_ppl,
    held_out_documents,
    held_out_tokens,
    loss_by_position,
    num_windows,
    token_losses,
)
from pathattn.models import ModelConfig
from tests.train.test_pretrain import make_prepared

TRAIN_LEN = 48


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict:
    """Prepared data (512-token tokenizer), a random PaTH model exported like `pathattn
    pretrain` does (RUN/hf beside RUN/config.json) and a random Llama, both saved with the
    data's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from pathattn.hf import PaTHConfig, PaTHForCausalLM

    root = tmp_path_factory.mktemp("ppl")
    data = make_prepared(root)
    tok = AutoTokenizer.from_pretrained(root / "tok")
    torch.manual_seed(0)
    path = PaTHForCausalLM(PaTHConfig.from_model_config(ModelConfig.preset(
        "cpu-tiny", vocab_size=512, hidden_size=32, intermediate_size=64, w_rank=8)))
    (root / "run").mkdir()
    (root / "run" / "config.json").write_text(json.dumps({"seq_len": TRAIN_LEN}))
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
        tie_word_embeddings=False))
    dirs = {"path": root / "run" / "hf", "llama": root / "llama"}
    for name, model in (("path", path), ("llama", llama)):
        model.save_pretrained(dirs[name])
        tok.save_pretrained(dirs[name])
    return {"root": root, "data": data, "models": {"path": path.eval(), "llama": llama.eval()},
            "dirs": dirs, "tokens": held_out_tokens(data, "val", max_docs=1)}


MODELS = ["path", "llama"]


def _direct_losses(model, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Full forward + cross-entropy of the whole logits: [B, T] float32."""
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(
        targets.shape)


def _windows(tokens, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All windows of length L: inputs and targets [W, L]."""
    stream = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
    W = num_windows(len(stream), L)
    idx = torch.arange(W)[:, None] * L + torch.arange(L)  # [W, L]
    return stream[idx], stream[idx + 1]


@pytest.mark.parametrize("name", MODELS)
def test_position_losses_equal_a_direct_forward(assets, name):
    model = assets["models"][name]
    ids, targets = _windows(assets["tokens"], 80)
    ours = token_losses(model, ids[:2], targets[:2], chunk_size=37)
    torch.testing.assert_close(ours, _direct_losses(model, ids[:2], targets[:2]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_ppl_is_exp_of_the_mean_window_loss(assets, name):
    model, tokens = assets["models"][name], assets["tokens"]
    res = evaluate_ppl(model, tokens, [80, 32], batch_size=3, chunk_size=64)
    assert res["lengths"] == [32, 80] and res["chunked_head"]
    for L in (32, 80):
        ids, targets = _windows(tokens, L)
        direct = _direct_losses(model, ids, targets)  # [W, L]
        assert res["windows"][L] == len(ids) and res["tokens"][L] == direct.numel()
        assert res["loss"][L] == pytest.approx(float(direct.double().mean()), rel=1e-5)
        assert res["ppl"][L] == pytest.approx(math.exp(float(direct.double().mean())), rel=1e-5)
    np.testing.assert_allclose(res["position_loss"], direct.double().mean(0).numpy(),
                               rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_chunked_head_equals_unchunked(assets, name):
    model = assets["models"][name]
    ids, targets = _windows(assets["tokens"], 64)
    chunked = Scorer.of(model, chunk_size=5)
    whole = Scorer.of(model, chunk_size=None)
    assert chunked.chunked_head and whole.chunked_head
    torch.testing.assert_close(chunked.losses(ids[:3], targets[:3]),
                               whole.losses(ids[:3], targets[:3]), rtol=1e-6, atol=1e-6)


def test_a_head_that_does_not_split_falls_back_to_the_full_forward(assets, monkeypatch):
    """When head(base model) is not the model's own logits, the scorer uses the forward."""
    model = assets["models"]["llama"]
    other = torch.nn.Linear(32, 512, bias=False)
    monkeypatch.setattr(model, "get_output_embeddings", lambda: other)
    scorer = Scorer.of(model, chunk_size=7)
    assert not scorer.chunked_head
    ids, targets = _windows(assets["tokens"], 40)
    torch.testing.assert_close(scorer.losses(ids[:2], targets[:2]),
                               _direct_losses(model, ids[:2], targets[:2]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_per_document_losses_equal_one_forward_per_document(assets, name):
    """With L at least the document length each document is one forward of [BOS] + its
    tokens; with a shorter L every token is scored once, in windows of L inputs."""
    model = assets["models"][name]
    docs, prefix = held_out_documents(assets["data"], "val", max_docs=2)
    data = held_out_tokens(assets["data"], "val", max_docs=1)
    assert prefix == data[0] and list(docs[0]) == list(data[1:-1])  # no BOS / EOS
    docs = [docs[0][:40], docs[1][:33], docs[1][:5]]  # short, so the test stays fast
    direct = []
    for doc in docs:
        seq = torch.as_tensor(np.concatenate([[prefix], doc]).astype(np.int64))  # [n + 1]
        direct.append(_direct_losses(model, seq[None, :-1], seq[None, 1:])[0])  # [n]
    longest = max(len(d) for d in docs)
    res = evaluate_documents(model, docs, prefix, [longest, 16], batch_size=2, chunk_size=7)
    n = sum(len(d) for d in docs)
    whole = float(torch.cat(direct).double().sum())
    assert res["tokens"] == {16: n, longest: n} and res["windows"][longest] == len(docs)
    assert res["windows"][16] == sum(len(document_windows(len(d), 16)) for d in docs)
    assert res["loss"][longest] == pytest.approx(whole / n, rel=1e-5)
    expected = [np.mean([float(x[i]) for x in direct if len(x) > i]) for i in range(longest)]
    np.testing.assert_allclose(res["position_loss"], expected, rtol=1e-5)  # [n max]
    windowed = 0.0  # L = 16: each window [end - T, end) alone, its last `scored` targets
    for doc in docs:
        seq = torch.as_tensor(np.concatenate([[prefix], doc]).astype(np.int64))
        T = min(16, len(doc))
        for end, scored in document_windows(len(doc), 16):
            loss = _direct_losses(model, seq[None, end - T:end], seq[None, end - T + 1:end + 1])
            windowed += float(loss[0, T - scored:].double().sum())
    assert res["loss"][16] == pytest.approx(windowed / n, rel=1e-5)


def test_per_document_command(assets, tmp_path, capsys):
    d = assets["dirs"]
    assert _run(["--model", str(d["path"]), "--data", str(assets["data"]), "--per-document",
                 "--lengths", "2048", "--max-docs", "1", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    report = json.loads((tmp_path / "ppl.json").read_text())
    docs, prefix = held_out_documents(assets["data"], "val", max_docs=1)
    direct = evaluate_documents(assets["models"]["path"], docs, prefix, [2048])
    assert report["mode"] == "per-document" and report["documents"] == 1
    assert report["models"][0]["ppl"]["2048"] == pytest.approx(direct["ppl"][2048], rel=1e-6)
    assert "ppl @ max 2048" in capsys.readouterr().out


def test_loss_by_position_bins_cover_every_position():
    values = np.arange(1, 101, dtype=np.float64)  # loss = position
    bins = loss_by_position(values, bins_per_octave=4)
    assert bins[0]["start"] == 1 and bins[-1]["end"] == 101
    assert all(a["end"] == b["start"] for a, b in zip(bins[:-1], bins[1:], strict=True))
    for b in bins:
        assert b["loss"] == pytest.approx((b["start"] + b["end"] - 1) / 2)
    assert [b["end"] - b["start"] for b in bins[:4]] == [1, 1, 1, 1]  # 1, 2, 3, 4 alone


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pathattn eval ppl")
    add_arguments(p)
    return p


def _run(argv: list[str]) -> int:
    """`pathattn eval ppl ARGV` as registered in the command line."""
    return main(["eval", "ppl", *argv])


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        _run(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_errors_name_the_argument(assets, tmp_path, capsys):
    d, data = assets["dirs"], str(assets["data"])
    model = str(d["path"])
    err = _error(["--model", str(tmp_path / "nope"), "--data", data], capsys)
    assert "--model" in err and "not a folder" in err
    err = _error(["--model", model, "--data", str(tmp_path / "nope")], capsys)
    assert "--data" in err and "not a folder" in err
    weights_only = tmp_path / "weights_only"
    shutil.copytree(d["llama"], weights_only,
                    ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*"))
    err = _error(["--model", model, str(weights_only), "--data", data], capsys)
    assert "--model" in err and "tokenizer" in err
    n = len(held_out_tokens(data, max_docs=1))
    err = _error(["--model", model, "--data", data, "--max-docs", "1", "--lengths", "64",
                  str(n)], capsys)
    assert "--lengths" in err and f"has {n}" in err and f"{n - 1}" in err
    err = _error(["--model", model, "--data", data, "--lengths", "0", "64"], capsys)
    assert "--lengths" in err and "positive" in err
    err = _error(["--model", model, "--data", data, "--lengths", "1.5"], capsys)
    assert "--lengths" in err
    err = _error(["--model", model, "--data", data, "--max-docs", "0"], capsys)
    assert "--max-docs" in err
    err = _error(["--model", model, "--data", data, "--split", "test"], capsys)
    assert "--split" in err


@pytest.mark.parametrize("name", MODELS)
def test_bfloat16_autocast_is_close_to_float32(assets, name):
    model, tokens = assets["models"][name], assets["tokens"][:257]
    full = evaluate_ppl(model, tokens, [64])["loss"][64]
    low = evaluate_ppl(model, tokens, [64], dtype="bfloat16", chunk_size=None)["loss"][64]
    assert low == pytest.approx(full, rel=2e-2)


def test_library_errors(assets):
    model = assets["models"]["path"]
    with pytest.raises(PplError, match="lengths: must be positive ints"):
        evaluate_ppl(model, assets["tokens"], [-1])
    with pytest.raises(PplError, match=r"lengths: 100 needs 101 held-out tokens .* has 50"):
        evaluate_ppl(model, assets["tokens"][:50], [100])
    with pytest.raises(PplError, match="batch_size"):
        evaluate_ppl(model, assets["tokens"], [8], batch_size=0)
