"""Scoring a Hugging Face causal language model on long-context tasks, and the results
table.

`generate` continues a prompt greedily (`model.generate`, do_sample=False, with the
model's cache) for `answer_budget` new tokens or until EOS, and returns the decoded
continuation; `evaluate_task` does that for `n` examples per length and scores each output
with `score` (the fraction of the expected answers found in it; `common`). A length's
accuracy is the mean score of its examples, in [0, 1]. Before any example is built,
`check_prompt_lengths` refuses a length whose prompt cannot fit the device's memory.

`results_table` renders the rows as markdown, one row per length:

    | length | examples | accuracy (%) | prompt tokens (mean) |
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from ...utils.precision import DTYPES, autocast_context
from .common import Example, LongContextTask, answer_budget, prompt_ids, score

__all__ = ["generate", "score_example", "evaluate_task", "results_table",
           "check_prompt_lengths", "prompt_memory_floor"]


def prompt_memory_floor(model, length: int) -> int:
    """Bytes a prompt of `length` tokens needs at the least: its text (4 bytes), its ids (8
    bytes) and the float32 keys and values of every layer (2 x 4 x hidden_size x
    num_hidden_layers bytes) per token."""
    config = getattr(model, "config", None)  # a model without one: the prompt alone
    width = getattr(config, "hidden_size", 0) * getattr(config, "num_hidden_layers", 0)
    return length * (12 + 8 * width)


def check_prompt_lengths(model, lengths: Sequence[int]) -> None:
    """ValueError naming the length when a prompt of that many tokens cannot fit the
    memory of the model's device (`prompt_memory_floor`, `pathattn.utils.system`)."""
    from ...utils.system import check_fits_memory

    device = next((p.device for p in model.parameters()), None)
    for length in lengths:
        check_fits_memory(prompt_memory_floor(model, length),
                          f"lengths: a prompt of {length:,} tokens", device)


@torch.no_grad()
def generate(model, tokenizer, prompt: str, max_new_tokens: int, dtype: str = "float32"
             ) -> str:
    """The greedy continuation of `prompt` (its ids: `prompt_ids`; at most `max_new_tokens`
    tokens, stopping at EOS), decoded without special tokens; dtype "bfloat16": under
    autocast (`pathattn.utils.autocast_context`)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids(tokenizer, prompt)], device=device)  # [1, T]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
        tokenizer.eos_token_id
    with autocast_context(dtype, device):
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def score_example(model, tokenizer, example: Example, max_new_tokens: int | None = None,
                  dtype: str = "float32") -> dict:
    """{"length", "index", "num_tokens", "answers", "output", "score"} of one example;
    max_new_tokens defaults to `answer_budget`; dtype as `generate`'s."""
    budget = answer_budget(tokenizer, example) if max_new_tokens is None else max_new_tokens
    output = generate(model, tokenizer, example.prompt, budget, dtype)
    return dict(length=example.length, index=example.index, num_tokens=example.num_tokens,
                answers=list(example.answers), output=output,
                score=score(output, example.answers))


def evaluate_task(model, tokenizer, task: LongContextTask, lengths: Sequence[int], n: int,
                  seed: int = 0, max_new_tokens: int | None = None,
                  progress: bool = True, dtype: str = "float32") -> dict:
    """Score `n` examples of `task` at each length (dtype "bfloat16": generation under
    autocast).

    Returns {"task", "variant", "options", "seed", "n", "rows": [{"length", "examples",
    "accuracy", "prompt_tokens"}], "examples": [score_example records]}, accuracy the mean
    score in [0, 1] and prompt_tokens the mean prompt length in tokens.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    check_prompt_lengths(model, lengths)
    model.eval()
    records, rows = [], []
    bar = tqdm(total=n * len(lengths), desc=f"longctx {task.name}", disable=not progress)
    with bar:
        for length in lengths:
            scored = []
            for i in range(n):
                example = task.example(tokenizer, length, i, seed)
                scored.append(score_example(model, tokenizer, example, max_new_tokens,
                                            dtype))
                bar.update(1)
            rows.append(dict(length=length, examples=n,
                             accuracy=sum(r["score"] for r in scored) / n,
                             prompt_tokens=sum(r["num_tokens"] for r in scored) / n))
            records += scored
    return dict(task=task.name, variant=task.variant, options=task.options(), seed=seed, n=n,
                rows=rows, examples=records)


def results_table(results: dict) -> str:
    """The markdown table of `evaluate_task`'s rows (module docstring)."""
    lines = ["| length | examples | accuracy (%) | prompt tokens (mean) |",
             "|---:|---:|---:|---:|"]
    lines += [f"| {r['length']} | {r['examples']} | {100 * r['accuracy']:.1f} | "
              f"{r['prompt_tokens']:.1f} |" for r in results["rows"]]
    return "\n".join(lines) + "\n"
