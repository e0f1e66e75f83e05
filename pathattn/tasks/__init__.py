"""Synthetic tasks of the paper's section "Synthetic Tasks" :
flip-flop language modelling, word problems on A5 / S5, and MQRAR-N. Each task is an
endless, seeded iterable of (tokens, targets) batches, LongTensor [B, T] each, with a
`vocab` mapping ids <-> strings; `IGNORE_INDEX` marks unscored targets.

Each task declares its options, splits and metrics once, in a `TaskSpec` next to its code,
registered here (`register_task`); the command line, `SyntheticConfig` and the evaluation read
the registry (`get_task`). `TASKS` is the registered names, in registration order."""

from .export import IGNORE_INDEX, Vocab, make_generator, to_records, write_jsonl
from .flipflop import SPEC as FLIPFLOP_SPEC
from .flipflop import SPLITS, FlipFlop, FlipFlopConfig, read_errors, read_indices, read_mask
from .metrics import METRICS, TaskMetrics, flat_key, flatten_metrics
from .mqrar import MQRAR, MQRARConfig, nback_targets
from .mqrar import SPEC as MQRAR_SPEC
from .registry import (
    TaskOption,
    TaskSpec,
    get_task,
    options_by_name,
    register_task,
    registered_task,
    task_names,
    unregister_task,
)
from .word_problems import SPECS as WORD_PROBLEM_SPECS
from .word_problems import WordProblem, WordProblemConfig

for _spec in (FLIPFLOP_SPEC, *WORD_PROBLEM_SPECS, MQRAR_SPEC):  # the order of TASKS
    register_task(_spec)

__all__ = ["TASKS", "IGNORE_INDEX", "Vocab", "make_generator", "to_records", "write_jsonl",
           "SPLITS", "FlipFlop", "FlipFlopConfig", "read_mask", "read_indices", "read_errors",
           "WordProblem", "WordProblemConfig", "MQRAR", "MQRARConfig", "nback_targets",
           "TaskSpec", "TaskOption", "TaskMetrics", "METRICS", "register_task",
           "unregister_task", "registered_task", "get_task", "task_names", "options_by_name",
           "flat_key", "flatten_metrics"]


def __getattr__(name: str):
    """`TASKS`: the registered tasks' names (`task_names()`), tasks registered later
    included."""
    if name == "TASKS":
        return task_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
