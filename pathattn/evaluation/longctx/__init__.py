"""Long-context synthetic tasks at any length in tokens: needle in a haystack (`niah`),
variable tracking (`vt`) and PhoneBook lookup (`phonebook`), in the style of the RULER
benchmark.

    task = make_task("niah", variant="multikey")
    example = task.example(tokenizer, length=4096, index=0, seed=0)
    example.prompt, example.answers           context + question + answer prefix; answers
    evaluate_task(model, tokenizer, task, lengths=[1024, 4096], n=20)   accuracy by length
    write_training_docs("vt", tokenizer, [1024], 100, "vt.jsonl")       pretraining text

A new task is a `LongContextTask` subclass decorated with `@register_task`; the CLI
(`pathattn eval longctx`) and the lm-eval task writer find it in `TASKS`.
"""

from . import niah, phonebook, vt  # noqa: F401  (registers the tasks)
from .common import (
    SPLITS,
    TASKS,
    Example,
    LongContextTask,
    answer_budget,
    count_tokens,
    fit_length,
    make_task,
    register_task,
    score,
    task_names,
    write_jsonl_atomic,
    write_text_atomic,
)
from .evaluate import (
    check_prompt_lengths,
    evaluate_task,
    generate,
    results_table,
    score_example,
)
from .haystack import NOISE, Haystack, insert, read_corpus
from .niah import NIAH
from .phonebook import PhoneBook
from .training import training_records, write_training_docs
from .vt import VariableTracking

__all__ = ["Example", "LongContextTask", "TASKS", "SPLITS", "register_task", "make_task",
           "task_names", "count_tokens", "fit_length", "score", "answer_budget",
           "write_text_atomic", "write_jsonl_atomic", "generate", "score_example",
           "evaluate_task", "results_table", "check_prompt_lengths", "NOISE", "Haystack",
           "insert", "read_corpus", "NIAH", "VariableTracking", "PhoneBook",
           "training_records", "write_training_docs"]
