"""Pretraining under torch.distributed (DDP on gloo): each rank reads its own rows of every
global batch, and the loss curve equals the single-process run's with the same global
batches, through a stop and an exact resume; only rank 0 writes."""

from __future__ import annotations

import os

from pathattn.train import Trainer, read_jsonl
from tests.distributed._launch import launch
from tests.train.test_pretrain import make_prepared, small_config

# 3 rows per global batch: split 2 + 1 over two ranks, so the ranks score different numbers
# of targets; two micro-batches per step
OPTIONS = dict(steps=4, batch_size=3, accum=2, checkpoint_every=2)


def _losses(out_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(os.path.join(out_dir, "log.jsonl"))]


def _ddp_worker(rank: int, world_size: int, data: str, out_dir: str) -> list[float]:
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank))
    cfg = small_config(data, out_dir, **OPTIONS)
    first = Trainer(cfg)
    first.train(until=2)
    first.parallel.barrier()  # rank 0's checkpoint is on disk
    first.close()
    second = Trainer(cfg, resume=True)
    second.train()
    second.parallel.barrier()
    second.close()
    return _losses(out_dir)


def test_ddp_pretraining_matches_single_process(tmp_path):
    (tmp_path / "text").mkdir()
    data = make_prepared(tmp_path / "text")
    with Trainer(small_config(data, tmp_path / "single", **OPTIONS)) as t:
        t.train()
    want = _losses(tmp_path / "single")
    results = launch(_ddp_worker, 2, str(data), str(tmp_path / "ddp"))
    got = results[0]
    assert len(got) == len(want) == 4  # rank 0 alone wrote one record per step
    for step, (a, b) in enumerate(zip(got, want, strict=True), 1):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: {a} vs {b} ({got} {want})"
