"""Fault injection on run folders (`pathattn.train.run_dir`): a fresh run into a folder that
holds a run is refused unless --resume / --overwrite (train, compare, layers and the Python
API), a folder locked by another process is refused at once and a dead holder leaves no
stale lock, two real runs on one --out never interleave, and every file a run writes has
the ordinary permissions 0666 & ~umask."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pathattn.cli import main
from pathattn.train import RunDirError, SyntheticConfig, Trainer
from pathattn.train.run_dir import LOCK_NAME
from tests.train.test_trainer import read_jsonl, tiny

REPO = Path(__file__).resolve().parents[2]
TINY = ["--task", "flipflop", "--dim", "16", "--heads", "2", "--steps", "2", "--batch-size",
        "2", "--num-pairs", "4", "--eval-batches", "1", "--final-eval-batches", "1",
        "--log-every", "1", "--checkpoint-every", "1", "--no-progress"]
# holds an flock on argv[1] until killed, like a run writing to the folder
HOLDER = ("import fcntl, os, sys, time\n"
          "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
          "fcntl.flock(fd, fcntl.LOCK_EX)\n"
          "print('locked', flush=True)\n"
          "time.sleep(120)\n")


def _command(command: str, out: Path, *extra: str) -> list[str]:
    attn = ["--attn", "rope"] if command == "train" else ["--attns", "rope"]
    depths = ["--depths", "1"] if command == "layers" else []
    return [command, *TINY, *attn, *depths, "--out", str(out), *extra]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def _run_folder(command: str, out: Path) -> Path:
    """The folder of the (only) run a command writes."""
    return out if command == "train" else out / ("rope" if command == "compare" else "rope-L1")


# ------------------------------------------------------------------------- protection


@pytest.mark.parametrize("command", ["train", "compare", "layers"])
def test_fresh_run_refuses_a_folder_holding_a_run(tmp_path, capsys, command):
    out = tmp_path / "out"
    run = _run_folder(command, out)
    if command == "layers":  # finished runs are the sweep's to reuse: plant another config's
        Trainer(tiny(run.parent, attn="rope", out_dir=str(run), steps=1)).train()
    else:
        assert main(_command(command, out)) == 0
    before = _snapshot(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(_command(command, out))
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "already holds a run" in err and str(run) in err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert _snapshot(out) == before  # nothing destroyed


@pytest.mark.parametrize("command", ["train", "compare", "layers"])
def test_overwrite_replaces_the_run(tmp_path, command):
    out = tmp_path / "out"
    run = _run_folder(command, out)
    # a longer earlier run: its later checkpoints must not survive the overwrite
    Trainer(tiny(tmp_path, attn="rope", out_dir=str(run), steps=4, checkpoint_every=1,
                 layers=1)).train()
    (run / "notes.txt").write_text("mine")  # not a run file: stays
    assert main(_command(command, out, "--overwrite")) == 0
    assert [r["step"] for r in read_jsonl(run / "log.jsonl")] == [1, 2]
    names = sorted(os.listdir(run / "checkpoints"))
    assert names == ["latest.json", "model_00000001.safetensors", "model_00000002.safetensors",
                     "state_00000001.pt", "state_00000002.pt"]
    assert json.loads((run / "metrics.json").read_text())["step"] == 2
    assert (run / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["train", "compare", "layers"])
def test_resume_and_overwrite_exclude_each_other(tmp_path, command):
    with pytest.raises(SystemExit):
        main(_command(command, tmp_path / "x", "--resume", "--overwrite"))


def test_python_api_refuses_and_overwrites(tmp_path):
    Trainer(tiny(tmp_path, attn="rope", steps=1)).train()
    with pytest.raises(RunDirError, match="already holds a run"):
        Trainer(tiny(tmp_path, attn="rope", steps=1))
    with pytest.raises(ValueError, match="exclude each other"):
        Trainer(tiny(tmp_path, attn="rope", steps=1), resume=True, overwrite=True)
    with Trainer(tiny(tmp_path, attn="rope", steps=1), overwrite=True) as trainer:
        assert trainer.train()["step"] == 1


@pytest.mark.parametrize("command", ["compare", "layers"])
def test_multi_run_resume_continues_and_reuses(tmp_path, command):
    out = tmp_path / "out"
    run = _run_folder(command, out)
    cfg = SyntheticConfig(task="flipflop", attn="rope", dim=16, heads=2, steps=2, batch_size=2,
                      num_pairs=4, eval_batches=1, final_eval_batches=1, log_every=1,
                      checkpoint_every=1, out_dir=str(run), progress=False)  # = TINY
    Trainer(cfg).train(until=1)  # an interrupted sub-run, checkpoint at step 1
    assert main(_command(command, out, "--resume")) == 0
    assert [r["step"] for r in read_jsonl(run / "log.jsonl")] == [1, 2]
    mtime = (run / "metrics.json").stat().st_mtime_ns
    assert main(_command(command, out, "--resume")) == 0  # finished: reused, not retrained
    assert (run / "metrics.json").stat().st_mtime_ns == mtime


# ------------------------------------------------------------------------------ locks


@pytest.fixture
def holder():
    """Start a process that holds the flock of a given lock file; yields the starter."""
    procs = []

    def start(lock: Path) -> subprocess.Popen:
        lock.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("command", ["train", "compare", "layers"])
def test_locked_folder_is_refused_at_once_and_dead_holder_leaves_no_lock(
        tmp_path, capsys, holder, command):
    out = tmp_path / "out"
    proc = holder(out / LOCK_NAME)
    start = time.perf_counter()
    assert main(_command(command, out)) == 1
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err
    assert "in use by another run" in err and "Traceback" not in err
    assert not (_run_folder(command, out) / "log.jsonl").exists()
    proc.send_signal(signal.SIGKILL)  # the holder dies: the kernel drops its lock
    proc.wait()
    assert main(_command(command, out)) == 0


def test_sub_run_locked_by_a_train_is_refused(tmp_path, capsys, holder):
    out = tmp_path / "cmp"
    holder(out / "rope" / LOCK_NAME)  # `pathattn train --out cmp/rope` running
    assert main(_command("compare", out)) == 1
    assert "in use by another run" in capsys.readouterr().err


def test_two_real_runs_on_one_folder(tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "pathattn", *_command("train", out)]
    args[args.index("--steps") + 1] = "40"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATHATTN_CPU_KERNEL": "0",
           "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    codes = sorted(code for code, _ in results)
    assert codes[0] == 0 and codes[1] != 0, results
    loser = next(err for code, err in results if code != 0)
    assert "in use by another run" in loser or "already holds a run" in loser
    assert [r["step"] for r in read_jsonl(out / "log.jsonl")] == list(range(1, 41))


# ------------------------------------------------------------------------ permissions


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_every_file_gets_ordinary_permissions(tmp_path, umask):
    old = os.umask(umask)
    try:
        Trainer(tiny(tmp_path, attn="rope", steps=2, checkpoint_every=1)).train()
    finally:
        os.umask(old)
    run = tmp_path / "run"
    files = {p.relative_to(run).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in run.rglob("*") if p.is_file()}
    assert {"config.json", "log.jsonl", "eval.jsonl", "metrics.json", LOCK_NAME,
            "checkpoints/latest.json", "checkpoints/model_00000002.safetensors",
            "checkpoints/state_00000002.pt"} <= set(files)
    assert files == dict.fromkeys(files, 0o666 & ~umask)
    assert stat.S_IMODE((run / "checkpoints").stat().st_mode) == 0o777 & ~umask
