"""Fault injection by signals (`pathattn.train.signals`): SIGINT / SIGTERM during training
finish the step, write a checkpoint, exit 130 / 143 with the resume command, and the resumed
run's logs, metrics and weights equal an uninterrupted run's bit for bit; a second Ctrl-C
aborts at once; the previous handlers are back after training."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pathattn.train import (
    Trainer,
    TrainingInterrupted,
    latest_step,
    load_checkpoint,
    read_jsonl,
)
from pathattn.train.trainer import TIMING_FIELDS
from tests.train.test_trainer import tiny

REPO = Path(__file__).resolve().parents[2]
SIGNALS = [signal.SIGINT, signal.SIGTERM]


def _records(path: Path) -> list[dict]:
    """Log records without the wall-clock field, the one thing a resume cannot repeat."""
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_jsonl(path)]


def _outputs(run: Path) -> tuple:
    return (_records(run / "log.jsonl"), _records(run / "eval.jsonl"),
            json.loads((run / "metrics.json").read_text()))


def _weights(cfg) -> dict[str, torch.Tensor]:
    with Trainer(cfg, resume=True) as trainer:
        return trainer.model.state_dict()


class PreviousHandler(Exception):
    """A signal reached the handler that was in place before training."""


@pytest.fixture
def previous_handler():
    """Handlers of SIGINT and SIGTERM that raise PreviousHandler, in place of Python's
    (KeyboardInterrupt would stop pytest, SIGTERM's default would kill it) for the test."""
    def handler(signum, frame):
        raise PreviousHandler(signum)

    saved = {s: signal.signal(s, handler) for s in SIGNALS}
    yield handler
    for s, h in saved.items():
        signal.signal(s, h)


def _signal_after(monkeypatch, step: int, *signums: int) -> list[int]:
    """Make the Trainer send itself `signums` at the end of optimizer step `step`; returns
    the list of those sent (a signal acted on at once raises before the next is sent)."""
    real, sent = Trainer.train_step, []

    def train_step(self):
        stats = real(self)
        if self.step == step:
            for signum in signums:
                os.kill(os.getpid(), signum)
                sent.append(signum)
        return stats

    monkeypatch.setattr(Trainer, "train_step", train_step)
    return sent


def _cfg(root: Path, name: str):
    return tiny(root / name, attn="rope", steps=6, checkpoint_every=4, eval_every=2)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_signal_stops_after_the_step_and_resumes_exactly(tmp_path, monkeypatch,
                                                         previous_handler, signum):
    full = _cfg(tmp_path, "full")
    Trainer(full).train()

    part = _cfg(tmp_path, "part")
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _signal_after(monkeypatch, 3, signum)
    with pytest.raises(TrainingInterrupted) as info:
        Trainer(part).train()
    monkeypatch.undo()
    assert info.value.exit_code == 128 + signum and info.value.step == 3
    assert "--resume" in str(info.value)
    assert {s: signal.getsignal(s) for s in SIGNALS} == before  # handlers restored
    assert latest_step(part.out_dir) == 3  # step 3 finished and checkpointed (not periodic)
    assert [r["step"] for r in read_jsonl(Path(part.out_dir) / "log.jsonl")] == [1, 2, 3]

    with Trainer(part, resume=True) as resumed:
        assert resumed.step == 3
        resumed.train()
    assert _outputs(Path(part.out_dir)) == _outputs(Path(full.out_dir))
    want, got = _weights(full), _weights(part)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_second_sigint_aborts_at_once(tmp_path, monkeypatch, previous_handler):
    """The first Ctrl-C is only recorded, the second goes to the previous handler at once
    (Python's own raises KeyboardInterrupt)."""
    cfg = _cfg(tmp_path, "run")
    sent = _signal_after(monkeypatch, 3, signal.SIGINT, signal.SIGINT)
    with pytest.raises(PreviousHandler):
        Trainer(cfg).train()
    assert sent == [signal.SIGINT]  # the first one did not interrupt anything
    assert latest_step(cfg.out_dir) is None  # aborted: no checkpoint of step 3 written
    assert signal.getsignal(signal.SIGINT) is previous_handler


def test_python_sigint_handler_is_back_after_a_stop(tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGINT)
    assert before is signal.default_int_handler  # what a Ctrl-C in a script meets
    _signal_after(monkeypatch, 1, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as info:  # any: one escaping would stop pytest
        Trainer(tiny(tmp_path, attn="rope", steps=3)).train()
    assert isinstance(info.value, TrainingInterrupted) and info.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is before


def test_no_handlers_outside_training(tmp_path, monkeypatch, previous_handler):
    seen = []
    real = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step",
                        lambda self: seen.append(signal.getsignal(signal.SIGTERM)) or real(self))
    before = signal.getsignal(signal.SIGTERM)
    Trainer(tiny(tmp_path, attn="rope", steps=1)).train()
    assert seen and seen[0] is not before  # ours during the loop
    assert signal.getsignal(signal.SIGTERM) is before


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pathattn", *args]


def test_sigint_to_cli_process_then_resume_matches_uninterrupted(tmp_path):
    """`python -m pathattn train` gets a real SIGINT mid-run; the command it prints resumes
    it; log.jsonl, eval.jsonl and metrics.json equal an uninterrupted run's."""
    options = ["--task", "flipflop", "--attn", "rope", "--dim", "16", "--heads", "2",
               "--steps", "100", "--batch-size", "2", "--num-pairs", "8", "--warmup-steps",
               "5", "--eval-every", "25", "--eval-batches", "1", "--final-eval-batches", "1",
               "--log-every", "1", "--checkpoint-every", "1000", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATHATTN_CPU_KERNEL": "0",
           "PYTHONPATH": str(REPO)}
    run = dict(env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
               text=True)
    full, part = tmp_path / "full", tmp_path / "part"
    reference = subprocess.Popen(_cli("train", *options, "--out", str(full)), **run)
    proc = subprocess.Popen(_cli("train", *options, "--out", str(part)), **run)
    deadline = time.monotonic() + 120
    while len(read_jsonl(part / "log.jsonl")) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "no log records"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "SIGINT" in err and "Traceback" not in err
    step = latest_step(part)
    assert 2 <= step < 100 and load_checkpoint(part)["step"] == step
    assert [r["step"] for r in read_jsonl(part / "log.jsonl")] == list(range(1, step + 1))

    command = shlex.split(err.split("resume with: ")[1].splitlines()[0])
    assert command[0] == "pathattn" and "--resume" in command
    resumed = subprocess.run(_cli(*command[1:]), timeout=120, **run)
    assert resumed.returncode == 0, resumed.stderr
    assert reference.wait(timeout=120) == 0
    reference.communicate()
    assert _outputs(part) == _outputs(full)
