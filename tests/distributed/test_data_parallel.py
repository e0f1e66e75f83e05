"""Training under torch.distributed: `torchrun ... -m pathattn train` (DDP) and the
context-parallel trainer give the single-process loss curve for the same global batches;
only rank 0 writes; a context-parallel run resumes exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pathattn.train import SyntheticConfig, Trainer
from tests.distributed._launch import launch

# a tiny flip-flop run: T = 32, batch 5 (split 3 + 2 over two replicas, so the ranks score
# different numbers of targets)
TINY = dict(task="flipflop", num_pairs=16, steps=6, batch_size=5, dim=32, heads=2,
            log_every=1, eval_every=100, eval_batches=1, final_eval_batches=1,
            checkpoint_every=3, warmup_steps=2, progress=False)
REPO = Path(__file__).resolve().parents[2]


def _losses(out_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in Path(out_dir, "log.jsonl").read_text()
            .splitlines()]


def _single(tmp_path, **over) -> list[float]:
    cfg = SyntheticConfig(**{**TINY, **over}, out_dir=str(tmp_path / "single"))
    Trainer(cfg).train()
    return _losses(cfg.out_dir)


def _assert_close(got, want, rtol=1e-5):
    assert len(got) == len(want), (got, want)
    for step, (a, b) in enumerate(zip(got, want, strict=True), 1):
        assert abs(a - b) <= rtol * abs(b), f"step {step}: {a} vs {b} (all: {got} {want})"


def test_torchrun_ddp_matches_single_process(tmp_path):
    want = _single(tmp_path)
    out = tmp_path / "ddp"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items() if k != "progress"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node=2", "-m", "pathattn", "train", *flags, "--no-progress",
           "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count('"step": 6') == 1  # metrics printed by rank 0 only
    _assert_close(_losses(out), want)  # one record per step: rank 0 alone appended
    assert json.loads((out / "metrics.json").read_text())["step"] == 6


def _cp_resume_worker(rank: int, world_size: int, out_dir: str) -> list[float]:
    """Context parallelism over both ranks, interrupted at step 3 and resumed."""
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank))
    cfg = SyntheticConfig(**{**TINY, "attn": "path_fox"}, out_dir=out_dir)
    first = Trainer(cfg, context_parallel=world_size)
    first.train(until=3)
    first.parallel.barrier()  # rank 0's checkpoint is on disk
    second = Trainer(cfg, resume=True, context_parallel=world_size)
    second.train()
    second.parallel.barrier()
    return _losses(out_dir)


def test_context_parallel_trainer_resumes_to_single_process_curve(tmp_path):
    want = _single(tmp_path, attn="path_fox")
    results = launch(_cp_resume_worker, 2, str(tmp_path / "cp"))
    _assert_close(results[0], want)


def test_context_parallel_needs_torchrun(tmp_path):
    cfg = SyntheticConfig(**TINY, out_dir=str(tmp_path / "x"))
    with pytest.raises(ValueError, match="context_parallel=2 needs as many processes"):
        Trainer(cfg, context_parallel=2)

