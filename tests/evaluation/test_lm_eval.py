"""`pathattn eval lm-eval` on the local held-out perplexity task: the wrapper's perplexity
equals the one computed here from the same text with one forward per document and, with
a max length that splits documents into windows, `pathattn eval ppl --per-document` on the
same documents; lm-eval's own `model="hf"` entry loads a pathattn folder once pathattn is
imported. The long-context tasks run through lm-eval with the prompts' tokens unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pathattn.cli import main

pytest.importorskip("lm_eval")
pytest.importorskip("lm_eval.models.huggingface")  # needs accelerate (lm-eval[hf])

from pathattn.data import load_tokenizer  # noqa: E402
from pathattn.evaluation import lmeval  # noqa: E402
from tests._tiny_text import tiny_prepared  # noqa: E402

pytestmark = pytest.mark.slow  # lm-eval runs, about a minute in all

LIMIT = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared folder, model folder): sixteen short documents (about 7 in val), a
    300-token tokenizer, a randomly initialised two-layer pathattn model with it."""
    from pathattn.hf import PaTHConfig, PaTHForCausalLM

    root = tmp_path_factory.mktemp("lmeval")
    tiny_prepared(root)
    tok = load_tokenizer(root / "tok")
    torch.manual_seed(0)
    config = PaTHConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, w_rank=8,
                        max_position_embeddings=256, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    PaTHForCausalLM(config).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "data", root / "model"


def direct_loglikelihoods(model_dir: Path, texts: list[str], double_bos: bool = False
                          ) -> list[float]:
    """Sum of log p(token | previous tokens) over each text's tokens (without special
    tokens) after a BOS, one forward per text; double_bos also scores a second BOS first
    (what HFLM does with a tokenizer that adds BOS unless add_bos_token=False)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ids = [tok.bos_token_id] * double_bos + ids
        assert len(ids) <= model.config.max_position_embeddings  # one window
        inputs = torch.tensor([[tok.bos_token_id] + ids[:-1]])  # [1, T]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=inputs).logits[0].float(), -1)  # [T, V]
        out.append(float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum()))
    return out


def run_cli(argv: list[str]) -> int:
    """`pathattn eval lm-eval ARGV` as registered in the command line."""
    return main(["eval", "lm-eval", *argv])


def test_held_out_perplexity_equals_the_direct_computation(setup, tmp_path, capsys):
    data, model_dir = setup
    out = tmp_path / "out"
    assert run_cli(["--model", str(model_dir), "--data", str(data), "--limit", str(LIMIT),
                    "--device", "cpu", "--out", str(out)]) == 0
    assert "token_perplexity" in capsys.readouterr().out
    results = json.loads((out / "lm_eval_results.json").read_text())["results"]
    ppl = results[lmeval.PPL_TASK]
    docs = [json.loads(line) for line in
            (out / "tasks" / f"{lmeval.PPL_TASK}.jsonl").read_text().splitlines()]
    assert len(docs) >= LIMIT and all(d["text"].endswith(".\n") for d in docs)
    docs = docs[:LIMIT]  # --limit takes the first documents
    ll = sum(direct_loglikelihoods(model_dir, [d["text"] for d in docs]))
    tokens = sum(d["num_tokens"] for d in docs)
    words = sum(len(d["text"].split()) + 1 for d in docs)  # lm-eval: re.split(r"\s+") parts
    direct = math.exp(-ll / tokens)
    print(f"token perplexity: lm-eval {ppl['token_perplexity,none']:.6f}, "
          f"direct {direct:.6f}")
    assert ppl["token_perplexity,none"] == pytest.approx(direct, rel=1e-5)
    assert ppl["word_perplexity,none"] == pytest.approx(math.exp(-ll / words), rel=1e-5)
    assert (out / "lm_eval_results.md").read_text().startswith("|")


def test_lm_eval_hf_entry_loads_a_pathattn_folder(setup, tmp_path):
    """lm_eval.simple_evaluate(model="hf", model_args="pretrained=DIR") after `import
    pathattn`: the same log-likelihood with add_bos_token=False; with HFLM's default the
    tokenizer's own BOS is scored too (after the prefix BOS)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import pathattn  # noqa: F401

    data, model_dir = setup
    lmeval.write_ppl_task(data, tmp_path / "tasks")
    texts = [json.loads(line)["text"] for line in
             (tmp_path / "tasks" / f"{lmeval.PPL_TASK}.jsonl").read_text().splitlines()]
    words = sum(len(t.split()) + 1 for t in texts[:LIMIT])
    tasks = TaskManager(include_path=[str(tmp_path / "tasks")])  # indexing takes seconds
    for extra, double_bos in ((",add_bos_token=False", False), ("", True)):
        results = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={model_dir},device=cpu,dtype=float32{extra}",
            tasks=[lmeval.PPL_TASK], limit=LIMIT, task_manager=tasks)
        ll = sum(direct_loglikelihoods(model_dir, texts[:LIMIT], double_bos))
        assert results["results"][lmeval.PPL_TASK]["word_perplexity,none"] == \
            pytest.approx(math.exp(-ll / words), rel=1e-5)


def test_longctx_tasks_through_lm_eval(setup, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pathattn.evaluation.longctx import evaluate_task, make_task

    _, model_dir = setup
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    task = make_task("phonebook")
    paths = lmeval.write_longctx_tasks(task, tok, [200, 300], 1, tmp_path / "tasks")
    assert [p.name for p in paths] == ["longctx_phonebook_default_200.yaml",
                                       "longctx_phonebook_default_300.yaml"]
    record = json.loads((tmp_path / "tasks" / "longctx_phonebook_default_200.jsonl")
                        .read_text().splitlines()[0])
    example = task.example(tok, 200, 0)
    assert record["prompt"] == tok.bos_token + example.prompt  # the same token ids:
    assert tok(record["prompt"], add_special_tokens=False)["input_ids"] == \
        tok(example.prompt)["input_ids"]
    results = lmeval.evaluate_lm(model, tok, ["longctx_phonebook_default"],
                                 tmp_path / "tasks", max_length=1024, log_samples=True)
    direct = evaluate_task(model, tok, task, [200, 300], 1, progress=False)
    for row in direct["rows"]:
        name = f"longctx_phonebook_default_{row['length']}"
        assert results["results"][name]["score,none"] == pytest.approx(row["accuracy"])
    assert len(results["samples"]["longctx_phonebook_default_200"]) == 1


@pytest.mark.parametrize("num_tokens", [1, 5, 16, 17, 31, 32, 33, 70])
@pytest.mark.parametrize("max_length", [1, 4, 16])
def test_document_windows_are_lm_evals_rolling_windows(num_tokens, max_length):
    """Inputs, targets and scored tokens of `document_windows` against lm-eval's own
    get_rolling_token_windows + make_disjoint_window (context_len 1, as HFLM calls them)
    and its input rule (context + continuation, minus the last token)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from pathattn.evaluation.ppl import document_windows

    tokens, prefix = list(range(100, 100 + num_tokens)), 7
    seq = [prefix] + tokens  # s = [prefix] + tokens
    theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(
        tokens, prefix_token=prefix, max_seq_len=max_length, context_len=1)]
    ours = document_windows(num_tokens, max_length)
    assert len(ours) == len(theirs)
    for (end, scored), (context, continuation) in zip(ours, theirs, strict=True):
        start = max(end - max_length, 0)
        assert seq[start:end] == (context + continuation)[-(max_length + 1):][:-1]
        assert tokens[end - scored:end] == continuation


def test_wrapper_perplexity_equals_eval_ppl_per_document(setup, tmp_path):
    """The lm-eval wrapper's token perplexity on the local held-out task equals `pathattn
    eval ppl --per-document` on the same documents: the same tokens, the same windows (a
    short max length, so most documents take several, the last one partial)."""
    data, model_dir = setup
    max_length = 16
    assert run_cli(["--model", str(model_dir), "--data", str(data), "--max-length",
                    str(max_length), "--device", "cpu", "--out", str(tmp_path / "lm")]) == 0
    ppl = json.loads((tmp_path / "lm" / "lm_eval_results.json").read_text())
    ppl = ppl["results"][lmeval.PPL_TASK]["token_perplexity,none"]
    docs = [json.loads(line) for line in
            (tmp_path / "lm" / "tasks" / f"{lmeval.PPL_TASK}.jsonl").read_text().splitlines()]
    assert main(["eval", "ppl", "--model", str(model_dir), "--data", str(data),
                 "--per-document", "--lengths", str(max_length), "--out",
                 str(tmp_path / "ppl"), "--no-progress"]) == 0
    report = json.loads((tmp_path / "ppl" / "ppl.json").read_text())
    (record,) = report["models"]
    assert report["mode"] == "per-document" and report["documents"] == len(docs)
    assert record["tokens"][str(max_length)] == sum(d["num_tokens"] for d in docs)
    assert record["windows"][str(max_length)] > len(docs)  # several windows per document
    print(f"token perplexity: lm-eval {ppl:.7f}, eval ppl --per-document "
          f"{record['ppl'][str(max_length)]:.7f}")
    assert record["ppl"][str(max_length)] == pytest.approx(ppl, rel=1e-6)
