"""Graceful stop of a training loop on SIGINT (Ctrl-C) or SIGTERM (`kill`, a scheduler).

`StopRequests` is the context the `Trainer` runs its loop in: the first SIGINT or SIGTERM is
only recorded, the loop finishes the step it is in, writes a checkpoint (atomically, as
always) and raises `TrainingInterrupted`; the command line prints how to resume and exits
with 128 + the signal number (130 for SIGINT, 143 for SIGTERM, the shell's convention).

A second signal acts at once (our choice): the first one puts the previous handlers back,
so a second Ctrl-C raises KeyboardInterrupt in the middle of whatever runs (Python's
default) and a second SIGTERM terminates the process; the checkpoint on disk is then the
last complete one (writes are atomic). The handlers are installed only for the duration of
the context and the previous ones are restored after it. Python can only install handlers
in the main thread; elsewhere the context records nothing and signals act as before.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

__all__ = ["StopRequests", "TrainingInterrupted", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """The training loop stopped on a signal after writing a checkpoint. A KeyboardInterrupt
    so that code which lets Ctrl-C through (no `except Exception` catches it) lets this
    through too.

    Attributes: signum, step (the checkpoint's), out_dir, exit_code (128 + signum)."""

    def __init__(self, signum: int, step: int, out_dir: str | Path):
        self.signum, self.step, self.out_dir = int(signum), int(step), Path(out_dir)
        self.exit_code = 128 + self.signum
        name = signal.Signals(self.signum).name
        super().__init__(f"stopped by {name} after step {step}; checkpoint of step {step} "
                         f"saved in {self.out_dir / 'checkpoints'}; continue with --resume "
                         "(Python: Trainer(cfg, resume=True))")


class StopRequests:
    """Context manager recording the first SIGINT / SIGTERM in `signum` (module docstring).

    Args:
        enabled: False records nothing and leaves the handlers alone (e.g. under torchrun,
            where every rank would have to agree on the step to stop at).
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        self._restore()  # the next signal gets the previous behaviour

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __enter__(self) -> StopRequests:
        if self.enabled:
            for signum in STOP_SIGNALS:
                previous = signal.getsignal(signum)
                if previous is None:  # installed outside Python: cannot be put back
                    continue
                self._previous[signum] = previous
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()
