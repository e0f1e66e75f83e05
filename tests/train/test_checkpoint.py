"""`pathattn.train.checkpoint`: safetensors weights + weights_only state round trip, and
atomic writes (a failed write leaves the previous checkpoint loadable; the writes
themselves: tests/utils/test_io.py)."""

from __future__ import annotations

import os

import pytest
import torch

from pathattn.models import ModelConfig, PaTHLM
from pathattn.train import checkpoint as ck
from pathattn.utils import io as fsio


def _model(seed: int) -> PaTHLM:
    torch.manual_seed(seed)
    return PaTHLM(ModelConfig.preset("tiny", num_hidden_layers=1))


def _same(a: PaTHLM, b: PaTHLM) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_round_trip_keeps_tied_weights_and_state(tmp_path):
    model = _model(0)
    state = {"optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []},
             "torch_rng": torch.get_rng_state(), "config": {"task": "flipflop"}}
    ck.save_checkpoint(tmp_path, 7, model, state)
    other = _model(1)
    assert not _same(model, other)
    loaded = ck.load_checkpoint(tmp_path, other)
    assert _same(model, other)
    assert other.lm_head.weight is other.embed_tokens.weight
    assert loaded["step"] == 7 and loaded["config"] == {"task": "flipflop"}
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], torch.ones(3))
    assert ck.latest_step(tmp_path) == 7


@pytest.mark.parametrize("keep", [1, 2, 3], ids=lambda k: f"keep{k}")
def test_new_checkpoint_keeps_the_last_k(tmp_path, keep):
    model = _model(0)
    for step in (1, 2, 3, 4):
        ck.save_checkpoint(tmp_path, step, model, {}, keep=keep)
    names = sorted(os.listdir(ck.checkpoint_dir(tmp_path)))
    kept = range(5 - keep, 5)
    assert names == ["latest.json", *(f"model_{s:08d}.safetensors" for s in kept),
                     *(f"state_{s:08d}.pt" for s in kept)]
    assert ck.latest_step(tmp_path) == 4


def test_save_after_resuming_an_older_step_drops_later_files(tmp_path):
    model = _model(0)
    for step in (2, 4, 6):
        ck.save_checkpoint(tmp_path, step, model, {})
    ck.save_checkpoint(tmp_path, 5, model, {})  # a run resumed from step 4
    names = sorted(os.listdir(ck.checkpoint_dir(tmp_path)))
    assert names == ["latest.json", "model_00000004.safetensors", "model_00000005.safetensors",
                     "state_00000004.pt", "state_00000005.pt"]


@pytest.mark.parametrize("fail_at", [1, 2, 3], ids=["weights", "state", "latest"])
def test_failed_write_leaves_previous_checkpoint(tmp_path, monkeypatch, fail_at):
    old = _model(0)
    ck.save_checkpoint(tmp_path, 1, old, {"tag": "old"})
    calls = []
    real_replace = fsio._replace

    def flaky_replace(src, dst):
        calls.append(dst)
        assert os.path.getsize(src) > 0  # the temp file was written
        if len(calls) == fail_at:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(fsio, "_replace", flaky_replace)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(tmp_path, 2, _model(1), {"tag": "new"})
    monkeypatch.setattr(fsio, "_replace", real_replace)
    fresh = _model(2)
    state = ck.load_checkpoint(tmp_path, fresh)
    assert state["step"] == 1 and state["tag"] == "old"
    assert _same(fresh, old)
    assert not [n for n in os.listdir(ck.checkpoint_dir(tmp_path)) if n.endswith(".tmp")]

