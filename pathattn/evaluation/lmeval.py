"""Evaluation with EleutherAI's lm-evaluation-harness (`pip install "lm-eval[hf]"`),
offline, on any Hugging Face causal LM and on pathattn's own local tasks.

`evaluate_lm` wraps `lm_eval.simple_evaluate` around an `HFLM` built from a model and a
tokenizer object (`lm_model`), so pathattn models are evaluated without any model name
resolution. pathattn registers its classes with transformers' Auto classes once pathattn
is imported, so `lm_eval.simple_evaluate(model="hf", model_args="pretrained=DIR")` also
works in a process that has imported pathattn. The `lm_eval` command does not import
pathattn; `python -m pathattn.evaluation.lmeval ARGS` runs lm-eval's own command line
with pathattn registered (same arguments, e.g. `--model hf --model_args pretrained=RUN/hf
--tasks ... --device cpu`); an export also loads there by itself with
`trust_remote_code=True`.

Local tasks (generated into a folder passed to lm-eval as an include path; every task
reads its data from a local JSON Lines file, `dataset_path: json`, so nothing is
downloaded):

- `write_ppl_task(prepared_dir, out_dir)`: held-out perplexity of a prepared corpus
  (`pathattn prepare`). The validation documents are decoded back to text
  (`export_documents`; byte-level BPE decodes to the exact text) and scored with
  `loglikelihood_rolling`; metrics token_perplexity (over the prepared tokenizer's tokens
  of the text), word_perplexity, byte_perplexity and bits_per_byte.
- `write_longctx_tasks(task, tokenizer, lengths, n, out_dir)`: a long-context task of
  `pathattn.evaluation.longctx`, one lm-eval task per length
  (`<name>_<length>`, all tagged `<name>`), generate_until scored with
  `longctx.score`.

BOS: `lm_model` passes `add_bos_token=False` to HFLM. A rolling log-likelihood then scores
the document's tokens (encoded without special tokens) after the prefix token, BOS (or EOS
for a tokenizer without BOS): exactly what the model saw in pretraining, where every
document starts with BOS. An export's tokenizer adds no BOS of its own
(`pathattn.hf.export`), so lm_eval run directly on an export scores the same with its
defaults; a tokenizer that adds BOS (the data's, from `pathattn prepare`) would put it
twice under HFLM's `add_bos_token=True`. Generation prompts of the long-context tasks start
with the BOS text whenever the tokenizer has a BOS, as the ids of
`pathattn.evaluation.longctx.common.prompt_ids`.

Lengths: HFLM scores windows of at most `max_length` tokens (default: the model config's
max_position_embeddings) and left-truncates prompts to max_length - max_gen_toks; give
`max_length` above the longest long-context prompt.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from ..utils.io import atomic_write_bytes, atomic_write_json, atomic_write_jsonl, atomic_write_text
from .longctx import LongContextTask, answer_budget, make_task

__all__ = ["require_lm_eval", "lm_model", "evaluate_lm", "results_table", "export_documents",
           "write_ppl_task", "write_longctx_tasks", "save_results", "PPL_TASK",
           "TEMPLATES"]

PPL_TASK = "pathattn_ppl"  # default name of the held-out perplexity task
TEMPLATES = "pathattn.evaluation.lm_eval_tasks"  # package of the YAML templates


def require_lm_eval():
    """The `lm_eval` module; ImportError naming the install command when missing."""
    try:
        import lm_eval
    except ImportError as e:
        raise ImportError(f"pathattn eval lm-eval needs lm-evaluation-harness: pip install "
                          f"'lm-eval[hf]' ({e})") from e
    return lm_eval


def lm_model(model, tokenizer, batch_size: int = 1, max_length: int | None = None,
             add_bos_token: bool = False):
    """An `lm_eval.models.huggingface.HFLM` over a loaded model and tokenizer (module
    docstring for add_bos_token and max_length); the model keeps its device and dtype."""
    require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, backend="causal",
                batch_size=batch_size, max_length=max_length, add_bos_token=add_bos_token)


def evaluate_lm(model, tokenizer, tasks: Sequence[str],
                include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                batch_size: int = 1, limit: int | float | None = None,
                max_length: int | None = None, num_fewshot: int | None = None,
                log_samples: bool = False, seed: int = 0) -> dict:
    """`lm_eval.simple_evaluate` of `tasks` (lm-eval task names, tags or groups; the
    folders of `include_path` add local ones) on `lm_model(model, tokenizer, ...)`.
    `limit` caps the documents per task (an int, or a fraction < 1). Returns lm-eval's
    results dict ("results", "configs", "versions", ...)."""
    lm_eval = require_lm_eval()
    from lm_eval.tasks import TaskManager

    if isinstance(include_path, str | os.PathLike):
        include_path = [include_path]
    paths = [str(p) for p in include_path] if include_path else None
    manager = TaskManager(include_path=paths)
    lm = lm_model(model, tokenizer, batch_size, max_length)
    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager,
                                   limit=limit, num_fewshot=num_fewshot,
                                   log_samples=log_samples, random_seed=seed,
                                   numpy_random_seed=seed, torch_random_seed=seed,
                                   fewshot_random_seed=seed)


def results_table(results: dict) -> str:
    """lm-eval's markdown table of the results (and of the groups, when any)."""
    from lm_eval.utils import make_table

    table = make_table(results)
    if results.get("groups"):
        table += "\n" + make_table(results, "groups")
    return table


def save_results(results: dict, out_dir: str | os.PathLike) -> Path:
    """Write out_dir/lm_eval_results.json (without the per-sample logs) and
    out_dir/lm_eval_results.md, each atomically; returns the JSON path."""
    from lm_eval.utils import handle_non_serializable

    kept = {k: v for k, v in results.items() if k != "samples"}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = atomic_write_json(out / "lm_eval_results.json", kept, indent=2,
                             default=handle_non_serializable, ensure_ascii=False)
    atomic_write_text(out / "lm_eval_results.md", results_table(results))
    return path


# ------------------------------------------------------------------ local tasks

def _render(template: str, out_dir: Path, name: str, **values) -> Path:
    """Fill the packaged template with `values` (string.Template), write it to
    out_dir/<name>.yaml and copy the packaged utils.py next to it."""
    files = resources.files(TEMPLATES)
    text = string.Template(files.joinpath(template).read_text(encoding="utf-8"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = atomic_write_text(out_dir / f"{name}.yaml", text.substitute(**values))
    atomic_write_bytes(out_dir / "utils.py", files.joinpath("utils.py").read_bytes())
    return path


def _quoted(path: Path) -> str:
    return json.dumps(str(path.resolve()))  # a YAML double-quoted scalar


def export_documents(prepared_dir: str | os.PathLike, path: str | os.PathLike,
                     tokenizer=None, split: str = "val") -> int:
    """Write the documents of a prepared folder's split to the .jsonl `path`, one
    {"text", "num_tokens"} record each: the stored ids without BOS / EOS, decoded with
    `tokenizer` (default: the tokenizer folder recorded in meta.json); num_tokens counts
    the text's tokens without special tokens. Returns the number of documents.
    DataError when `tokenizer` is not the one the folder was prepared with
    (`pathattn.data.identity`: other ids would decode to other text) or the split is
    empty."""
    from ..data import DataError, TokenDataset
    from ..data.identity import check_same, data_tokenizer, prepared_identity, tokenizer_identity

    data = TokenDataset(prepared_dir, split)
    if len(data) == 0:
        raise DataError(f"{prepared_dir}: the {split} split holds no document")
    if tokenizer is None:
        tok = data_tokenizer(prepared_dir, data.meta)
    else:
        tok = tokenizer
        check_same(tokenizer_identity(tok), prepared_identity(prepared_dir, data.meta),
                   "the tokenizer given", f"the one {prepared_dir} was prepared with",
                   "tokenizer")
    records = []
    for d in range(len(data)):
        ids = [int(i) for i in data[d]]
        if data.bos_id is not None and ids[:1] == [data.bos_id]:
            ids = ids[1:]
        if ids[-1:] == [data.eos_id]:
            ids = ids[:-1]
        text = tok.decode(ids, clean_up_tokenization_spaces=False)
        num = len(tok(text, add_special_tokens=False, verbose=False)["input_ids"])
        records.append({"text": text, "num_tokens": num})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_jsonl(path, records, ensure_ascii=False)


def write_ppl_task(prepared_dir: str | os.PathLike, out_dir: str | os.PathLike,
                   tokenizer=None, name: str = PPL_TASK, split: str = "val") -> Path:
    """The held-out perplexity task of a prepared folder: out_dir/<name>.jsonl
    (`export_documents`), out_dir/<name>.yaml (lm-eval task `name`) and out_dir/utils.py.
    Returns the YAML path; pass out_dir as lm-eval's include path."""
    out = Path(out_dir)
    data = out / f"{name}.jsonl"
    export_documents(prepared_dir, data, tokenizer, split)
    return _render("ppl.yaml", out, name, task=name, data_file=_quoted(data))


def write_longctx_tasks(task: LongContextTask | str, tokenizer, lengths: Sequence[int],
                        n: int, out_dir: str | os.PathLike, seed: int = 0,
                        name: str | None = None) -> list[Path]:
    """lm-eval tasks `<name>_<length>` (tag `<name>`, default "longctx_<task>_<variant>")
    of `n` examples of a long-context task per length: out_dir/<name>_<length>.jsonl of
    {"prompt", "answers", "target", "length", "index", "num_tokens"} records, the YAML
    files and utils.py. A prompt starts with the BOS text when `tokenizer` has a BOS
    (module docstring). Returns the YAML paths."""
    task = make_task(task) if isinstance(task, str) else task
    name = name or f"longctx_{task.name}_{task.variant}"
    bos = tokenizer.bos_token or ""
    out, paths = Path(out_dir), []
    out.mkdir(parents=True, exist_ok=True)
    for length in lengths:
        examples = task.examples(tokenizer, length, n, seed)
        data = out / f"{name}_{length}.jsonl"
        atomic_write_jsonl(data, [dict(prompt=bos + ex.prompt, answers=list(ex.answers),
                                       target=ex.target, length=ex.length, index=ex.index,
                                       num_tokens=ex.num_tokens) for ex in examples])
        budget = max(answer_budget(tokenizer, ex) for ex in examples)
        paths.append(_render("longctx.yaml", out, f"{name}_{length}", task=f"{name}_{length}",
                             tag=name, data_file=_quoted(data), max_gen_toks=budget))
    return paths


def main() -> None:
    """lm-eval's command line (`lm_eval ...`) with pathattn's models registered."""
    import pathattn  # noqa: F401  (registers pathattn's models with the Auto classes)

    require_lm_eval()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
