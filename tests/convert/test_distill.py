"""The two distillation stages as workloads of the training loop: stage 1 lowers the
attention-output MSE and trains the attention parameters only, stage 2 lowers
KL(teacher || student), a stage resumes exactly, the teacher never changes, and a
data-parallel replica reads its rows of each global batch."""

from __future__ import annotations

import math

import pytest
import torch

from pathattn.convert import DistillConfig, kl_divergence, load_teacher
from pathattn.convert.distill import distill_workload
from pathattn.train import Trainer, read_jsonl


def stage_config(prepared, teacher_dir, out, stage: int, **over) -> DistillConfig:
    base = dict(stage=stage, teacher=str(teacher_dir), data=str(prepared), seq_len=32,
                batch_size=2, steps=12, lr=1e-3, warmup_steps=1, eval_every=100,
                eval_batches=2, final_eval_batches=2, log_every=1, checkpoint_every=2,
                out_dir=str(out), progress=False)
    return DistillConfig(**{**base, **over})


def _teacher_state(teacher_dir):
    return {k: v.clone() for k, v in load_teacher(teacher_dir).state_dict().items()}


def test_stage1_lowers_the_mse_and_trains_attention_only(prepared, teacher_dir, tmp_path):
    with Trainer(stage_config(prepared, teacher_dir, tmp_path, 1)) as trainer:
        before = trainer.evaluate()["val"]
        student0 = {k: v.clone() for k, v in trainer.model.student.state_dict().items()}
        metrics = trainer.train()
        student = trainer.model.student.state_dict()
        teacher = trainer.model.teacher.state_dict()
    assert metrics["val_mse"] < 0.9 * before["mse"]
    changed = {k for k, v in student.items() if not torch.equal(v, student0[k])}
    assert changed and all(".attn." in k for k in changed)
    assert any(".attn.q_proj." in k for k in changed)
    assert any(".attn.beta_proj." in k for k in changed)
    for k, v in _teacher_state(teacher_dir).items():  # the teacher is not trained
        assert torch.equal(teacher[k], v)
    assert math.isclose(metrics["val_teacher_ppl"], before["teacher_ppl"], rel_tol=1e-6)
    # the checkpoints hold the student, not the teacher
    from safetensors.torch import load_file

    names = load_file(next((tmp_path / "checkpoints").glob("model_*.safetensors"))).keys()
    assert names and all(n.startswith("student.") for n in names)


@pytest.mark.parametrize("params", ["all", "attention"])
def test_stage2_lowers_the_kl(prepared, teacher_dir, tmp_path, params):
    cfg = stage_config(prepared, teacher_dir, tmp_path, 2, params=params)
    with Trainer(cfg) as trainer:
        before = trainer.evaluate()["val"]
        embed0 = trainer.model.student.model.embed_tokens.weight.detach().clone()
        metrics = trainer.train()
        embed = trainer.model.student.model.embed_tokens.weight.detach()
    assert metrics["val_kl"] < (0.9 if params == "all" else 0.95) * before["kl"]
    assert torch.equal(embed, embed0) == (params == "attention")


def test_stage_resumes_exactly(prepared, teacher_dir, tmp_path):
    """Stopped after 2 steps and resumed: the same losses, bit for bit, as one run."""
    for name in ("one", "two"):
        cfg = stage_config(prepared, teacher_dir, tmp_path / name, 1, steps=4,
                           final_eval_batches=1)
        with Trainer(cfg) as trainer:
            trainer.train(until=2 if name == "two" else None)
    with Trainer(stage_config(prepared, teacher_dir, tmp_path / "two", 1, steps=4,
                              final_eval_batches=1), resume=True) as trainer:
        trainer.train()
    losses = [[r["loss"] for r in read_jsonl(tmp_path / name / "log.jsonl")]
              for name in ("one", "two")]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


def test_bfloat16_autocast_stage(prepared, teacher_dir, tmp_path):
    cfg = stage_config(prepared, teacher_dir, tmp_path, 2, steps=1, dtype="bfloat16",
                       final_eval_batches=1, student_options={"beta_max": 1.99})
    with Trainer(cfg) as trainer:
        metrics = trainer.train()
    assert all(math.isfinite(r["loss"]) for r in read_jsonl(tmp_path / "log.jsonl"))
    assert math.isfinite(metrics["val_kl"])


def test_kl_divergence_matches_its_definition():
    t, s = torch.randn(2, 3, 7, dtype=torch.float64), torch.randn(2, 3, 7, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, True]])
    p, q = t.softmax(-1), s.softmax(-1)
    want = (p * (p.log() - q.log())).sum(-1)[mask].mean()
    assert float(kl_divergence(t, s, mask)) == pytest.approx(float(want), rel=1e-12)
    assert float(kl_divergence(t, t, mask)) == pytest.approx(0.0, abs=1e-12)


def test_config_errors(prepared, teacher_dir, tmp_path):
    with pytest.raises(ValueError, match="stage 1 trains the attention"):
        stage_config(prepared, teacher_dir, tmp_path, 1, params="all")
    with pytest.raises(ValueError, match="stage must be 1 or 2"):
        stage_config(prepared, teacher_dir, tmp_path, 3)


def test_a_replica_reads_its_rows_of_the_global_batch(prepared, teacher_dir, tmp_path):
    """Under torchrun each data-parallel replica reads its own rows (the loop weights them
    by the scored positions of the global batch)."""
    cfg = stage_config(prepared, teacher_dir, tmp_path, 1, batch_size=3)
    whole = next(distill_workload(cfg, torch.device("cpu")).train_data)[0]
    parts = [next(distill_workload(cfg, torch.device("cpu"), (r, 2)).train_data)[0]
             for r in range(2)]
    assert [p["input_ids"].shape[0] for p in parts] == [2, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), whole["input_ids"])
    assert parts[1]["global_scored"] == whole["global_scored"] == 3 * 32
