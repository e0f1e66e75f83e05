"""Pretraining sharded with FSDP2 on gloo: the loss curve equals the single-process run's
with the same global batches (within 1e-4 relative), through a stop and a resume from a
`torch.distributed.checkpoint` checkpoint; context parallelism inside the replicas; the
`pathattn pretrain --dp fsdp` command under a real torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pathattn.train import Trainer, read_jsonl
from tests.distributed._launch import free_port, launch
from tests.train.test_pretrain import make_prepared, small_config

# 3 rows per global batch: split 2 + 1 over two ranks, so the ranks score different numbers
# of targets; two micro-batches per step; eval every 3 steps (collective under FSDP)
OPTIONS = dict(steps=4, batch_size=3, accum=2, checkpoint_every=2, eval_every=3)
RTOL = 1e-4


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("text"))


def _losses(out_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(os.path.join(out_dir, "log.jsonl"))]


def _assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want, strict=True), 1):
        assert abs(a - b) <= RTOL * abs(b), f"step {step}: {a} vs {b} ({got} {want})"


def _single(data: Path, out: Path, **over) -> list[float]:
    with Trainer(small_config(data, out, **{**OPTIONS, **over})) as t:
        t.train()
    return _losses(out)


def _fsdp_worker(rank: int, world_size: int, data: str, out_dir: str) -> dict:
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank))
    cfg = small_config(data, out_dir, **OPTIONS)
    first = Trainer(cfg, dp="fsdp")
    first.train(until=2)
    first.close()
    files = sorted(os.listdir(os.path.join(out_dir, "checkpoints")))
    second = Trainer(cfg, dp="fsdp", resume=True)
    assert second.step == 2
    metrics = second.train()
    second.close()
    return {"files": files, "metrics": metrics}


def test_fsdp_pretraining_matches_single_process_through_a_resume(prepared, tmp_path):
    want = _single(prepared, tmp_path / "single")
    results = launch(_fsdp_worker, 2, str(prepared), str(tmp_path / "fsdp"))
    got = _losses(tmp_path / "fsdp")
    _assert_close(got, want)  # rank 0 alone wrote one record per step
    # the checkpoint of step 2 was a DCP folder (one shard file per rank) + rank 0's state
    files = results[0]["files"]
    assert "sharded_00000002" in files and "state_00000002.pt" in files
    assert not any(f.startswith("model_") for f in files)
    shards = os.listdir(tmp_path / "fsdp" / "checkpoints" / "sharded_00000004")
    assert ".metadata" in shards and sum(f.endswith(".distcp") for f in shards) == 2
    single = json.loads((tmp_path / "single" / "metrics.json").read_text())
    sharded = json.loads((tmp_path / "fsdp" / "metrics.json").read_text())
    assert abs(sharded["val_loss"] - single["val_loss"]) <= RTOL * single["val_loss"]
    assert results[1]["metrics"] == {"step": 4}  # only rank 0 reports


def _cp_worker(rank: int, world_size: int, data: str, out_dir: str, dp: str) -> None:
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank))
    cfg = small_config(data, out_dir, packing="windows", **OPTIONS)
    with Trainer(cfg, dp=dp, context_parallel=2) as t:
        t.train()


@pytest.mark.parametrize("dp", ["ddp", "fsdp"])
def test_context_parallel_pretraining_matches_single_process(prepared, tmp_path, dp):
    want = _single(prepared, tmp_path / "single", packing="windows")
    launch(_cp_worker, 2, str(prepared), str(tmp_path / dp), dp)
    _assert_close(_losses(tmp_path / dp), want)


def test_a_sharded_checkpoint_asks_for_fsdp(prepared, tmp_path):
    out = tmp_path / "fsdp"
    launch(_fsdp_worker, 2, str(prepared), str(out))
    with pytest.raises(ValueError, match="sharded .* --dp fsdp"):
        Trainer(small_config(prepared, out, **OPTIONS), resume=True)


@pytest.mark.slow
def test_torchrun_pretrain_command_with_fsdp(prepared, tmp_path):
    """The command line under a real torchrun: same loss curve as one process, and the
    export (gathered from the shards) loads with the Auto classes."""
    flags = ["--data", str(prepared), "--preset", "cpu-tiny", "--steps", "3",
             "--seq-len", "64", "--batch-size", "2", "--eval-every", "2",
             "--eval-batches", "1", "--final-eval-batches", "2", "--log-every", "1",
             "--checkpoint-every", "2", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    one = subprocess.run([sys.executable, "-m", "pathattn", "pretrain", *flags,
                          "--out", str(tmp_path / "one")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={free_port()}", "-m", "pathattn", "pretrain", *flags,
                          "--dp", "fsdp", "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    _assert_close(_losses(tmp_path / "two"), _losses(tmp_path / "one"))
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "hf")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "hf")
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(p, q, rtol=1e-3, atol=1e-5), name
