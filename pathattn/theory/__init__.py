"""Executable theorems: the paper's appendix A constructions, built from pathattn's own
PaTH layer and op with hand-set weights (docs/theory.md walks through them).

* `swap_model(n)`: Theorem A.1, one PaTH layer with two heads decides whether a sequence of
  swaps on 5 elements composes to the identity (an NC^1-complete problem).
* `flipflop_model(n)`: Theorem A.2, two PaTH layers solve flip-flop language modelling.

Each comes with a plain-Python ground truth (`swaps_identity`, `last_written_bit`).
"""

from .flipflop import FlipFlopModel, flipflop_model, last_written_bit
from .swaps import (
    START,
    SWAPS,
    SwapModel,
    compose_swaps,
    swap_model,
    swaps_identity,
    worst_case_ids,
)

__all__ = ["SWAPS", "START", "SwapModel", "swap_model", "compose_swaps", "swaps_identity",
           "worst_case_ids", "FlipFlopModel", "flipflop_model", "last_written_bit"]
