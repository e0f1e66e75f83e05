"""What the benchmark scripts record about the machine they ran on."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> float | None:
    """1-minute load average (other processes on the box skew the timings), if known."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def system_info() -> dict:
    """torch version, thread count, CPU, Python, date and the load average at the start."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "loadavg_start": load_average(),
    }


def maxrss_mib() -> float:
    """Peak resident set size of this process so far, in MiB."""
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, else KiB
