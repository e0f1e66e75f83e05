"""The conversion (`pathattn convert`) under torch.distributed on gloo: with the teacher and
the student sharded by FSDP2, the stage-1 (attention MSE) and stage-2 (KL) loss curves
equal the single-process conversion's for the same global batches (within 1e-4
relative), through a stop and a resume of each stage from a `torch.distributed.checkpoint`
checkpoint, and rank 0 exports the gathered student, loadable with
`AutoModelForCausalLM` and equal to the single-process one; a bf16 step under FSDP's
mixed-precision policy; the same curves with DDP."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch

from pathattn.convert.pipeline import convert, stage_configs
from pathattn.train import Trainer, read_jsonl
from tests.convert.conftest import make_teacher_dir
from tests.distributed._launch import launch
from tests.train.test_pretrain import make_prepared

# 4 steps per stage of 3 rows of 16 tokens: the rows split 2 + 1 over two ranks, so the
# ranks score different numbers of positions; a checkpoint at step 2 (where the sharded
# stages stop and resume), an evaluation at step 3 (collective under FSDP)
STEPS = 4
OPTIONS = dict(stage1_tokens=STEPS * 48, stage2_tokens=STEPS * 48, seq_len=16, batch_size=3,
               checkpoint_every=2, eval_every=3, eval_batches=1, final_eval_batches=1,
               log_every=1, progress=False)
RTOL = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared data, teacher folder with its tokenizer)."""
    data = make_prepared(tmp_path_factory.mktemp("text"))
    return data, make_teacher_dir(data, tmp_path_factory.mktemp("teacher") / "llama")


@pytest.fixture(scope="module")
def single(folders, tmp_path_factory) -> Path:
    """The single-process conversion's folder."""
    data, teacher = folders
    out = tmp_path_factory.mktemp("single") / "conv"
    convert(teacher, data, out, **OPTIONS)
    return out


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run / "log.jsonl")]


def _assert_curves_close(got: Path, want: Path) -> None:
    for stage in ("stage1", "stage2"):
        a, b = _losses(got / stage), _losses(want / stage)
        assert len(a) == len(b) == STEPS, (stage, a, b)
        for step, (x, y) in enumerate(zip(a, b, strict=True), 1):
            assert abs(x - y) <= RTOL * abs(y), f"{stage} step {step}: {x} vs {y} ({a} {b})"


def _convert(rank: int, world_size: int, data: str, teacher: str, out: str, dp: str,
             interrupt: bool) -> dict:
    """The conversion on this rank; with interrupt, each stage is first trained to step 2
    alone (a run stopped there) and the conversion resumes it."""
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank))
    if not interrupt:
        return {"summary": convert(teacher, data, out, dp=dp, **OPTIONS)}
    stage1, stage2 = stage_configs(teacher, data, out, **OPTIONS)
    with Trainer(stage1, dp=dp) as run:
        run.train(until=2)
    files = sorted(os.listdir(Path(stage1.out_dir) / "checkpoints"))
    convert(teacher, data, out, dp=dp, resume=True, **{**OPTIONS, "stage2_tokens": 0})
    with Trainer(stage2, dp=dp) as run:  # starts from stage 1's export
        run.train(until=2)
    summary = convert(teacher, data, out, dp=dp, resume=True, **OPTIONS)
    # bf16: the mixed-precision policy of the teacher and the student
    bf16 = dataclasses.replace(stage1, dtype="bfloat16", steps=1, out_dir=f"{out}/bf16",
                               student_options={"beta_max": 1.99})
    with Trainer(bf16, dp=dp) as run:
        run.train()
    return {"summary": summary, "files": files, "bf16": _losses(Path(bf16.out_dir))}


def test_fsdp_conversion_matches_single_process_through_resumes(folders, single, tmp_path):
    from transformers import AutoModelForCausalLM

    data, teacher = folders
    out = tmp_path / "fsdp"
    results = launch(_convert, 2, str(data), str(teacher), str(out), "fsdp", True)
    _assert_curves_close(out, single)
    # a stage's checkpoint: a DCP folder (one shard file per rank) + rank 0's loop state
    files = results[0]["files"]
    assert "sharded_00000002" in files and "state_00000002.pt" in files
    assert not any(f.startswith("model_") for f in files)
    shards = os.listdir(out / "stage1" / "checkpoints" / "sharded_00000004")
    assert ".metadata" in shards and sum(f.endswith(".distcp") for f in shards) == 2
    # rank 0 reports and exports the student gathered from the shards; the others wait
    want = json.loads((single / "metrics.json").read_text())
    got = results[0]["summary"]
    for key in ("teacher_ppl", "final_ppl", "final_kl"):
        assert abs(got[key] - want[key]) <= RTOL * abs(want[key]), (key, got[key], want[key])
    assert results[1]["summary"] == {"step": STEPS}
    assert len(results[0]["bf16"]) == 1 and math.isfinite(results[0]["bf16"][0])
    a = AutoModelForCausalLM.from_pretrained(single / "hf")
    b = AutoModelForCausalLM.from_pretrained(out / "hf")
    assert type(b).__name__ == "PaTHForCausalLM"
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), name


def test_ddp_conversion_matches_single_process(folders, single, tmp_path):
    data, teacher = folders
    launch(_convert, 2, str(data), str(teacher), str(tmp_path / "ddp"), "ddp", False)
    _assert_curves_close(tmp_path / "ddp", single)
    assert (tmp_path / "ddp" / "hf" / "config.json").is_file()
