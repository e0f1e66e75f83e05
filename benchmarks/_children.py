"""Child processes of gpu_check.py, run `parallel` at a time, each with a wall-time limit
(a hang or a CUDA fault costs only its own process)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Child:
    out: str
    err: str
    returncode: int
    seconds: float  # wall time from its own start
    timed_out: bool


def run_children(jobs: dict[str, list[str]], parallel: int, timeout: float, cwd: Path,
                 env: dict | None = None) -> dict[str, Child]:
    """name -> Child for every command of `jobs`, at most `parallel` at once; a process
    still running `timeout` seconds after its start is killed."""
    results: dict[str, Child] = {}
    running: dict = {}
    queue = list(jobs.items())
    while queue or running:
        while queue and len(running) < parallel:
            name, cmd = queue.pop(0)
            logs = [tempfile.TemporaryFile("w+") for _ in range(2)]  # stdout, stderr
            running[name] = (subprocess.Popen(cmd, stdout=logs[0], stderr=logs[1], cwd=cwd,
                                              env=env), logs, time.time())
        for name, (proc, logs, t0) in list(running.items()):
            late = time.time() > t0 + timeout
            if proc.poll() is None and not late:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            text = []
            for f in logs:
                f.seek(0)
                text.append(f.read())
                f.close()
            results[name] = Child(text[0], text[1], proc.returncode, time.time() - t0,
                                  late)
            del running[name]
        time.sleep(0.1)
    return results
