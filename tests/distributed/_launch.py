"""Launch gloo process groups on the CPU for the distributed tests.

`launch(fn, world_size, *args)` starts `world_size` fresh processes (spawn), each running
fn(rank, world_size, *args) inside an initialised gloo group on a free local port with one
thread; returns the list of fn's return values (rank order). A worker that raises, exits
abnormally or outlives `timeout` fails the test instead of blocking it.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path

import torch

DEFAULT_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out: str, fn, args) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        result = fn(rank, world_size, *args)
        torch.save({"ok": True, "result": result}, f"{out}/rank{rank}.pt")
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc()}, f"{out}/rank{rank}.pt")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn, world_size: int, *args, timeout: float = DEFAULT_TIMEOUT) -> list:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pathattn_dist_") as out:
        port = free_port()
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, out, fn, args))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in hung:
            procs[r].kill()
            procs[r].join()
        results = []
        for r in range(world_size):
            path = Path(out) / f"rank{r}.pt"
            if not path.exists():
                raise AssertionError(f"rank {r} wrote no result (hung: {hung}, exit codes "
                                     f"{[p.exitcode for p in procs]})")
            res = torch.load(path, weights_only=False)
            if not res["ok"]:
                raise AssertionError(f"rank {r} failed:\n{res['error']}")
            results.append(res["result"])
        if hung:
            raise AssertionError(f"ranks {hung} did not finish within {timeout} s")
        return results
