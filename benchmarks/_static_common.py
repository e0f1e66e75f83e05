"""What `static_vs_fla.py` and `_static_linear.py` describe a kernel with: its programs
for one head and, per loop, the source line of its `for` and its iterations."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

__all__ = ["Kernel", "Loop", "line"]


def line(fn, text: str) -> str:
    """'file.py:line' of the first source line of fn (a function or module) holding text."""
    fn = getattr(fn, "fn", fn)
    lines, start = inspect.getsourcelines(fn)
    for i, src in enumerate(lines):
        if text in src:
            return f"{os.path.basename(inspect.getsourcefile(fn))}:{start + i}"
    raise LookupError(f"{text!r} not in {fn.__name__}")


@dataclass(frozen=True)
class Loop:
    loc: str  # 'file.py:line' of its `for`, as in `inspect_kernels.LoopInfo.loc`
    trips: object  # program -> iterations of this loop's body in that program, all in all


@dataclass(frozen=True)
class Kernel:
    side: str  # "ours" / "fla"
    part: str  # "fwd" / "bwd"
    name: str
    programs: object  # (T, shape) -> list of programs of one head
    loops: tuple  # Loop per loop of the kernel, in code order
    scan: bool = True  # one of the attention scans (else an O(T) kernel around them)
    launch: int | None = None  # fla's O(T) kernels: the index of the recorded launch
    config: tuple = ()  # its autotune configuration
