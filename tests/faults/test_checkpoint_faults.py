"""Fault injection on checkpoints and logs (`pathattn.train.checkpoint`, `Trainer` resume):

* a crafted latest.json cannot make a run read or delete files outside its checkpoints
  folder, nor load another run's checkpoint;
* a damaged latest checkpoint falls back to the previous one with a warning naming the bad
  file, and the resumed run is still exact; nothing intact left is a clear error;
* resume removes the leftovers of interrupted writes and survives a cut-off log line;
* a kill at every file-system call of the checkpoint write path, and real SIGKILLs at random
  moments during saves, leave the new or the previous checkpoint, intact; every run killed
  at one of those points resumes (or, killed before its first checkpoint, restarts) to
  exactly the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
import warnings
from pathlib import Path

import pytest
import torch

from pathattn.cli import main
from pathattn.models import ModelConfig, PaTHLM
from pathattn.train import (
    CheckpointError,
    CheckpointWarning,
    Trainer,
    load_checkpoint,
    read_jsonl,
)
from pathattn.train import checkpoint as ck
from pathattn.train.trainer import TIMING_FIELDS
from pathattn.utils import io as fsio
from tests.train.test_trainer import tiny

# ------------------------------------------------------------------------ helpers


def _records(path: Path) -> list[dict]:
    """Log records without the wall-clock field, the one thing a resume cannot repeat."""
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_jsonl(path)]


def _outputs(run: Path) -> tuple:
    return (_records(run / "log.jsonl"), _records(run / "eval.jsonl"),
            json.loads((run / "metrics.json").read_text()))


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _filled(value: float) -> PaTHLM:
    """A tiny model whose every weight is `value` (tells checkpoints apart at a glance)."""
    model = PaTHLM(ModelConfig.preset("tiny", num_hidden_layers=1))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def _weight(model: PaTHLM) -> float:
    return float(model.embed_tokens.weight[0, 0].detach())


# ------------------------------------------------------------ crafted latest.json


def _crafted(tmp_path: Path) -> dict[str, tuple[dict, str]]:
    """case -> (latest.json content, what the error message must say was expected)."""
    model, state = "'model_00000003.safetensors'", "'state_00000003.pt'"
    return {
        "absolute": ({"step": 3, "model": str(tmp_path / "victim"),
                      "state": "state_00000003.pt"}, model),
        "traversal": ({"step": 3, "model": "model_00000003.safetensors",
                       "state": "../../victim"}, state),
        "other_run": ({"step": 3,
                       "model": "../../other/checkpoints/model_00000003.safetensors",
                       "state": "../../other/checkpoints/state_00000003.pt"}, model),
        "subfolder": ({"step": 3, "model": "x/model_00000003.safetensors",
                       "state": "state_00000003.pt"}, model),
        "wrong_step": ({"step": 3, "model": "model_00000002.safetensors",
                        "state": "state_00000002.pt"}, model),
        "step_not_int": ({"step": "3", "model": "model_00000003.safetensors",
                          "state": "state_00000003.pt"}, "non-negative int"),
    }


CRAFTED = ["absolute", "traversal", "other_run", "subfolder", "wrong_step", "step_not_int"]


def _plant(tmp_path: Path, case: str) -> Path:
    """Run folder `run` with checkpoints of steps 2 and 3 (weights 2.0, 3.0), another run's
    checkpoint of step 3 (weights 99.0), a victim file, and a crafted latest.json."""
    run = tmp_path / "run"
    for step in (2, 3):
        ck.save_checkpoint(run, step, _filled(float(step)), {"tag": "mine"})
    ck.save_checkpoint(tmp_path / "other", 3, _filled(99.0), {"tag": "other"})
    (tmp_path / "victim").write_bytes(b"precious")
    latest = ck.checkpoint_dir(run) / "latest.json"
    latest.write_text(json.dumps(_crafted(tmp_path)[case][0]))
    return run


@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_latest_is_not_followed_on_load(tmp_path, case):
    """A clear message (the file, what was expected) and the run's own newest checkpoint,
    never the file or run that latest.json names."""
    run = _plant(tmp_path, case)
    model = _filled(0.0)
    with pytest.warns(CheckpointWarning, match="latest.json") as record:
        state = load_checkpoint(run, model)
    assert _crafted(tmp_path)[case][1] in str(record[0].message)
    assert state["tag"] == "mine" and state["step"] == 3 and _weight(model) == 3.0
    assert (tmp_path / "victim").read_bytes() == b"precious"
    with pytest.raises(CheckpointError, match="latest.json"):
        ck.latest_step(run)

@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_latest_deletes_nothing_outside_on_save(tmp_path, case):
    run = _plant(tmp_path, case)
    ck.save_checkpoint(run, 4, _filled(4.0), {})
    assert (tmp_path / "victim").read_bytes() == b"precious"
    other = sorted(os.listdir(ck.checkpoint_dir(tmp_path / "other")))
    assert other == ["latest.json", "model_00000003.safetensors", "state_00000003.pt"]
    assert sorted(os.listdir(ck.checkpoint_dir(run))) == [
        "latest.json", "model_00000003.safetensors", "model_00000004.safetensors",
        "state_00000003.pt", "state_00000004.pt"]


def test_symlinked_checkpoint_file_is_not_followed(tmp_path):
    run = tmp_path / "run"
    for step in (2, 3):
        ck.save_checkpoint(run, step, _filled(float(step)), {})
    ck.save_checkpoint(tmp_path / "other", 3, _filled(99.0), {})
    weights = ck.checkpoint_dir(run) / "model_00000003.safetensors"
    weights.unlink()
    weights.symlink_to(ck.checkpoint_dir(tmp_path / "other") / "model_00000003.safetensors")
    model = _filled(0.0)
    with pytest.warns(CheckpointWarning, match="symlink"):
        assert load_checkpoint(run, model)["step"] == 2
    assert _weight(model) == 2.0


# --------------------------------------------------------------- damaged checkpoints


def _truncate(path: Path, keep: float) -> None:
    path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])


DAMAGE = {  # name -> (damage to checkpoints/ of a run at step 4, bad file, step resumed)
    "truncated_weights": (lambda d: _truncate(d / "model_00000004.safetensors", 0.5),
                          "model_00000004.safetensors", 2),
    "empty_weights": (lambda d: _truncate(d / "model_00000004.safetensors", 0.0),
                      "model_00000004.safetensors", 2),
    "missing_state": (lambda d: (d / "state_00000004.pt").unlink(), "state_00000004.pt", 2),
    "truncated_state": (lambda d: _truncate(d / "state_00000004.pt", 0.5),
                        "state_00000004.pt", 2),
    "garbage_latest": (lambda d: _truncate(d / "latest.json", 0.5), "latest.json", 4),
    "empty_latest": (lambda d: _truncate(d / "latest.json", 0.0), "latest.json", 4),
}


def _cfg(root: Path):
    return tiny(root, attn="rope", steps=6, checkpoint_every=2, eval_every=3)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple:
    """Outputs and final weights of the uninterrupted run of `_cfg`."""
    root = tmp_path_factory.mktemp("reference")
    with Trainer(_cfg(root)) as trainer:
        trainer.train()
        return _outputs(root / "run"), {k: v.clone() for k, v in
                                        trainer.model.state_dict().items()}


def _assert_exact(trainer: Trainer, reference: tuple) -> None:
    outputs, weights = reference
    assert _outputs(Path(trainer.cfg.out_dir)) == outputs
    state = trainer.model.state_dict()
    assert all(torch.equal(state[k], weights[k]) for k in weights)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_latest_falls_back_and_resumes_exactly(tmp_path, reference, damage):
    cfg = _cfg(tmp_path)
    Trainer(cfg).train(until=5)  # "killed" at step 5: checkpoints of steps 2 and 4
    hurt, bad, step = DAMAGE[damage]
    hurt(ck.checkpoint_dir(cfg.out_dir))
    with pytest.warns(CheckpointWarning, match=bad):
        resumed = Trainer(cfg, resume=True)
    with resumed:
        assert resumed.step == step
        resumed.train()
    _assert_exact(resumed, reference)


def test_nothing_intact_is_a_clear_error(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    Trainer(cfg).train(until=5)
    ckdir = ck.checkpoint_dir(cfg.out_dir)
    _truncate(ckdir / "model_00000004.safetensors", 0.5)
    (ckdir / "state_00000002.pt").unlink()
    with pytest.warns(CheckpointWarning):
        with pytest.raises(CheckpointError, match="no intact checkpoint") as info:
            Trainer(cfg, resume=True)
    assert "model_00000004.safetensors" in str(info.value)
    assert "state_00000002.pt" in str(info.value)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", cfg.out_dir, "--resume"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "no intact checkpoint" in err and "model_00000004.safetensors" in err
    assert "Traceback" not in err


# ------------------------------------------------------------ leftovers and the log


def test_resume_removes_leftovers_of_interrupted_writes(tmp_path, reference):
    cfg = _cfg(tmp_path)
    Trainer(cfg).train(until=5)
    run, ckdir = Path(cfg.out_dir), ck.checkpoint_dir(cfg.out_dir)
    leftovers = [ckdir / ".model_00000006.safetensors.0a1b2c3d.tmp",
                 ckdir / ".state_00000006.pt.k2_9xq7w.tmp",  # a mkstemp-style name
                 ckdir / ".latest.json.00ff00ff.tmp", run / ".log.jsonl.12345678.tmp",
                 run / ".metrics.json.abcdef01.tmp"]
    for path in leftovers:
        path.write_bytes(b"half")
    shutil.copy(ckdir / "model_00000004.safetensors", ckdir / "model_00000006.safetensors")
    (run / "notes.tmp").write_text("not ours")
    with Trainer(cfg, resume=True) as resumed:
        assert resumed.step == 4
        assert not any(p.exists() for p in leftovers)
        assert not (ckdir / "model_00000006.safetensors").exists()  # an unfinished save
        assert (run / "notes.tmp").exists()
        resumed.train()
    _assert_exact(resumed, reference)


@pytest.mark.parametrize("log", ["log.jsonl", "eval.jsonl"])
def test_cut_off_last_log_line_does_not_break_resume(tmp_path, reference, log):
    cfg = _cfg(tmp_path)
    Trainer(cfg).train(until=5)
    path = Path(cfg.out_dir) / log
    with open(path, "a") as f:
        f.write('{"step": 6, "loss": 0.12')  # killed mid-append
    assert [r["step"] for r in read_jsonl(path)][-1] <= 5  # readers survive it
    with Trainer(cfg, resume=True) as resumed:
        resumed.train()
    _assert_exact(resumed, reference)


def test_read_jsonl_names_a_bad_line_inside_the_log(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]


# ---------------------------------------------------------------- kill at every call


class Killed(BaseException):
    """The simulated death of the process (not an Exception: nothing should catch it)."""


class KillSwitch:
    """Counts the file-system calls of the checkpoint write path (`pathattn.utils.io._open`,
    `_write`, `_fsync`, `_close`, `_replace`, `_unlink`) and kills the "process" at call
    number `at`: that call does not happen (mode "half": a write puts half its bytes first)
    and every later one fails too, as nothing runs after a kill; the fds it left open are
    closed afterwards, as the kernel would. fsync is counted but skipped (durability
    against power loss is not under test; skipping keeps the loop fast)."""

    OPS = ("_open", "_write", "_fsync", "_close", "_replace", "_unlink")

    def __init__(self, monkeypatch, at: int | None = None, half: bool = False):
        self.at, self.half = at, half
        self.calls: list[str] = []
        self.dead = False
        self.fds: set[int] = set()
        for name in self.OPS:
            monkeypatch.setattr(fsio, name, self._wrap(name, getattr(fsio, name)))

    def _wrap(self, name, real):
        def op(*args):
            if self.dead:
                raise Killed
            n = len(self.calls)
            self.calls.append(name)
            if n == self.at:
                self.dead = True
                if self.half:
                    fd, data = args
                    real(fd, bytes(data[:len(data) // 2]))
                raise Killed
            if name == "_fsync":
                return None
            result = real(*args)
            if name == "_open":
                self.fds.add(result)
            elif name == "_close":
                self.fds.discard(args[0])
            return result
        return op

    def bury(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


def _kill_cfg(root: Path):
    # checkpoints at steps 1, 2 and 3 (the final one; step 1's files pruned then), then
    # metrics.json: 10 atomic writes and 2 deletions
    return tiny(root, attn="rope", steps=3, checkpoint_every=1, eval_every=2)


def test_kill_at_every_file_system_call_then_resume_exactly(tmp_path, monkeypatch, capsys):
    ref = Trainer(_kill_cfg(tmp_path / "reference"))
    counter = KillSwitch(monkeypatch)  # counts the calls of an uninterrupted run
    with ref:
        ref.train()
    monkeypatch.undo()
    reference = (_outputs(Path(ref.cfg.out_dir)), ref.model.state_dict())
    assert counter.calls.count("_replace") == 10 and counter.calls.count("_unlink") == 2
    points = [(n, False) for n in range(len(counter.calls))]
    points += [(n, True) for n, op in enumerate(counter.calls) if op == "_write"]

    resumed_exactly = restarted_exactly = 0
    for i, (at, half) in enumerate(points):
        where = (at, counter.calls[at], "half" if half else "before")
        cfg = _kill_cfg(tmp_path / f"kill{i}")
        trainer = Trainer(cfg)
        switch = KillSwitch(monkeypatch, at, half)
        with pytest.raises(Killed):
            trainer.train()
        switch.bury()
        monkeypatch.undo()
        killed_in = trainer.step  # killed in the save of that step (or metrics.json's)
        trainer.close()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                resumed = Trainer(cfg, resume=True)
            except (FileNotFoundError, CheckpointError):  # no checkpoint committed yet
                assert killed_in == 1, where
                resumed = Trainer(cfg, overwrite=True)
        start = resumed.step
        if start > 0:  # the new checkpoint or the previous one, intact
            assert start in (killed_in - 1, killed_in), where
            if killed_in > 1:  # a committed checkpoint existed: no fallback needed
                assert not caught, (where, [str(w.message) for w in caught])
        with resumed:
            resumed.train()
        _assert_exact(resumed, reference)
        if start > 0:
            resumed_exactly += 1
        else:
            restarted_exactly += 1
    with capsys.disabled():
        print(f"\nkill points: {len(points)} ({len(counter.calls)} calls, "
              f"{len(points) - len(counter.calls)} half writes); identical to the "
              f"uninterrupted run: {resumed_exactly} resumed, {restarted_exactly} restarted")
    assert resumed_exactly + restarted_exactly == len(points)
    assert resumed_exactly > restarted_exactly > 0


# -------------------------------------------------------------- real SIGKILLs at random


def _save_forever(out: Path, model: PaTHLM, first: int) -> None:
    """The child: checkpoints of steps first, first + 1, ... until killed; never returns."""
    try:
        for step in range(first, first + 10_000):
            ck.save_checkpoint(out, step, model, {"payload": torch.full((4096,), step)})
    finally:
        os._exit(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sigkill_at_random_moments_during_saves(tmp_path, capsys):
    out = tmp_path / "run"
    model = _filled(7.0)
    start = time.perf_counter()
    ck.save_checkpoint(out, 1, model, {"payload": torch.full((4096,), 1)})
    # kills fall within about three saves after the child's start (a fork costs a few ms
    # more on a busy machine: without that margin every kill can land before the first save)
    window = 3 * (time.perf_counter() - start) + 0.05
    rng = random.Random(0)
    step, kills, advanced = 1, 40, 0
    for _ in range(kills):
        pid = os.fork()
        if pid == 0:
            _save_forever(out, model, step + 1)
        time.sleep(rng.uniform(0.0, window))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = _filled(0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # latest.json's checkpoint is intact: no fallback
            state = load_checkpoint(out, loaded)
        assert state["step"] >= step and torch.equal(state["payload"],
                                                     torch.full((4096,), state["step"]))
        assert _same_weights(loaded, model)
        advanced += state["step"] > step
        step = state["step"]
        ck.discard_after(out, step)  # what a resume does
    with capsys.disabled():
        print(f"\nrandom SIGKILLs: {kills}, each left an intact checkpoint ({advanced} the "
              f"new one)")
    assert advanced > 0
