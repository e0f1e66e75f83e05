"""Synthetic tasks of the paper's section "Synthetic Tasks" :
flip-flop language modelling, word problems on A5 / S5, and MQRAR-N. Each task is an
endless, seeded iterable of (tokens, targets) batches, LongTensor [B, T] each, with a
`vocab` mapping ids <-> strings; `IGNORE_INDEX` marks unscored targets."""

from .export import IGNORE_INDEX, Vocab, make_generator, to_records, write_jsonl
from .flipflop import SPLITS, FlipFlop, FlipFlopConfig, read_errors, read_indices, read_mask
from .mqrar import MQRAR, MQRARConfig, nback_targets
from .word_problems import WordProblem, WordProblemConfig

TASKS = ("flipflop", "a5", "s5", "mqrar")  # task names of the CLI and TrainConfig

__all__ = ["TASKS", "IGNORE_INDEX", "Vocab", "make_generator", "to_records", "write_jsonl",
           "SPLITS", "FlipFlop", "FlipFlopConfig", "read_mask", "read_indices", "read_errors",
           "WordProblem", "WordProblemConfig", "MQRAR", "MQRARConfig", "nback_targets"]
