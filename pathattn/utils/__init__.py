"""Helpers that every part of pathattn shares and that depend on nothing else in it (only
the standard library and torch):

* `pathattn.utils.io`: durable file output (temp file, fsync, replace), used by every
  writer;
* `pathattn.utils.checks`: `is_int`, `is_real` (bools excluded) for argument checks;
* `pathattn.utils.precision`: the compute dtypes by name (`DTYPES`) and `autocast_context`.
"""

from .checks import is_int, is_real
from .precision import DTYPES, autocast_context

__all__ = ["is_int", "is_real", "DTYPES", "autocast_context"]
