"""Distilling a RoPE teacher into its PaTH student (paper section 4.3, after RADLADS), each
stage a workload of the one training loop (`pathattn.train.Trainer`: AdamW, warmup +
cosine, clipping, bf16 autocast, log.jsonl, atomic checkpoints, exact resume, graceful
stop on SIGINT / SIGTERM).

Stage 1, attention alignment. For every layer l at once, the student's attention receives
the teacher's own attention input (the teacher's normalised hidden state, so no error
of an earlier student layer reaches layer l) and is trained to reproduce the teacher's
attention output:

    loss_1 = mean_l  mean_{b, t, c} (Attn^S_l(x^T_l) - Attn^T_l(x^T_l))^2

over the scored positions; only the attention parameters (q, k, v, o, q / k norms and the
new PaTH ones) are trained, the teacher runs without gradients.

Stage 2, knowledge distillation. The whole student runs on its own hidden states and is
trained on the next-token distributions:

    loss_2 = mean_t KL(p^T_t || p^S_t) = mean_t sum_v p^T_t(v) (log p^T_t(v) - log p^S_t(v))

with all parameters trained, or the attention ones only (`params`).

Each stage is a `DistillConfig` (a `LoopConfig`): its Trainer trains a `DistillModel`,
a module whose only registered child is the student (checkpoints hold the student's
weights, not the teacher's) and whose forward returns (None, loss) as the loop expects.
The data are plain windows of a prepared folder (`TokenLoader(mode="windows")`): the
teacher takes ordinary [B, T] batches. Evaluation (`distill_metrics`) reports, on the
validation split, the teacher's and the student's loss and perplexity, the KL and the
stage-1 MSE, as val_teacher_ppl, val_student_ppl, val_kl, val_mse, ...

Under torchrun (`pathattn convert --dp ddp|fsdp`) a stage runs on the loop's
data-parallel path like pretraining: each rank reads its own rows of every global batch
(`TokenLoader` over the replicas), the stage's loss is a mean over scored positions, which
the loop weights by each rank's count, so the loss curve is the one-process one for the
same global batches. With "ddp" every rank holds the teacher and the student; with "fsdp"
both are sharded (`shard_distill_model`): the teacher by `shard_frozen` (each decoder
layer a unit, gathered for its forward only), the student per block and per attention
layer (stage 1 calls the attention layers on their own), checkpoints by
`torch.distributed.checkpoint`.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import EvalLoader, TokenDataset, TokenLoader
from ..distributed import register_shard_plan, shard_frozen, shard_units
from ..models import IGNORE_INDEX
from ..train.loop_config import LoopConfig
from ..train.pretrain import TextSteps
from ..train.workload import Workload, register_workload
from ..utils import autocast_context
from ..utils.io import atomic_dir
from .mapping import family_of
from .student import PaTHInit, student_from_teacher

__all__ = ["DistillConfig", "DistillModel", "distill_metrics", "distill_workload",
           "kl_divergence", "stage_workload", "trainable_parameters", "export_student",
           "load_teacher", "shard_distill_model", "unsharded_student", "STAGE_PARAMS"]

STAGE_PARAMS = ("attention", "all")


@dataclass
class DistillConfig(LoopConfig):
    """One distillation stage (module docstring).

    Args (besides the loop's, `LoopConfig`):
        stage: 1 (attention-output MSE) or 2 (KL on next-token distributions).
        teacher: folder of the teacher (`AutoModelForCausalLM.from_pretrained`).
        data: prepared folder (`pathattn prepare`) tokenized with the teacher's tokenizer.
        student: folder of a `PaTHForCausalLM` to start from (stage 2: stage 1's export);
            "" = built from the teacher (`student_from_teacher`).
        attn_type: the student's attention when built from the teacher.
        student_options: further `ModelConfig` fields of a student built from the teacher
            (w_rank, conv_size, beta_max, ...).
        init_beta, init_forget_bias: `PaTHInit` of a student built from the teacher.
        params: "attention" (stage 1 always) or "all": which student parameters train.
        seq_len, batch_size: rows of seq_len tokens, batch_size rows per step.
    """

    POSITIVE_INTS: ClassVar[tuple[str, ...]] = LoopConfig.POSITIVE_INTS + ("seq_len",
                                                                           "batch_size")

    stage: int = 1
    teacher: str = ""
    data: str = ""
    student: str = ""
    attn_type: str = "path"
    student_options: dict = field(default_factory=dict)
    init_beta: float = PaTHInit.beta
    init_forget_bias: list = field(default_factory=lambda: list(PaTHInit.forget_bias))
    params: str = "attention"
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    eval_every: int = 100
    eval_batches: int = 4
    final_eval_batches: int = 10_000
    checkpoint_every: int = 100
    out_dir: str = "runs/convert/stage1"

    def validate(self) -> DistillConfig:
        super().validate()
        if self.stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {self.stage!r}")
        for name in ("teacher", "data"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be the path of a folder, got "
                                 f"{getattr(self, name)!r}")
        if self.params not in STAGE_PARAMS:
            raise ValueError(f"params must be one of {STAGE_PARAMS}, got {self.params!r}")
        if self.stage == 1 and self.params != "attention":
            raise ValueError("params: stage 1 trains the attention parameters only")
        if not isinstance(self.student_options, dict):
            raise ValueError(f"student_options must be a dict of ModelConfig fields, got "
                             f"{self.student_options!r}")
        if len(self.init_forget_bias) != 2:
            raise ValueError(f"init_forget_bias must be [low, high], got "
                             f"{self.init_forget_bias!r}")
        return self

    @property
    def init(self) -> PaTHInit:
        return PaTHInit(beta=self.init_beta, forget_bias=tuple(self.init_forget_bias))


def trainable_parameters(student: nn.Module, params: str) -> list[str]:
    """Set requires_grad on the student's parameters: "attention" trains the attention
    layers' parameters only (q, k, v, o, q / k norms, the PaTH parameters), "all" every
    one. Returns the names of the trained parameters."""
    if params not in STAGE_PARAMS:
        raise ValueError(f"params must be one of {STAGE_PARAMS}, got {params!r}")
    names = []
    for name, p in student.named_parameters():
        p.requires_grad_(params == "all" or ".attn." in name)
        if p.requires_grad:
            names.append(name)
    return names


@contextlib.contextmanager
def _attention_taps(teacher: nn.Module, family):
    """Within the block, each layer of `teacher` (of mapping `family`) records its
    attention input [B, T, hidden] (after its norm) and output [B, T, hidden] in the
    yielded lists (forward hooks, PyTorch's documented seam of a module)."""
    inputs, outputs = [], []
    handles = []

    def hook(module, args, kwargs, output):
        inputs.append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])
        outputs.append(output[0] if isinstance(output, tuple) else output)

    for i in range(teacher.config.num_hidden_layers):
        module = teacher.get_submodule(family.attention_module.format(i=i))
        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        yield inputs, outputs
    finally:
        for h in handles:
            h.remove()


class DistillModel(nn.Module):
    """Teacher and student of one stage; forward(input_ids, labels) -> (None, loss).

    Args:
        teacher: the HF teacher (kept outside the module tree: not trained, not in the
            state dict; put into eval mode, gradients off).
        student: a `PaTHForCausalLM` (registered as `student`).
        stage: 1 or 2 (module docstring).
    """

    def __init__(self, teacher: nn.Module, student: nn.Module, stage: int):
        super().__init__()
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage!r}")
        self.family = family_of(teacher)  # the teacher's weight map; UnsupportedTeacher early
        self.__dict__["teacher"] = teacher.eval().requires_grad_(False)
        self.student = student
        self.stage = stage

    def train(self, mode: bool = True) -> DistillModel:
        super().train(mode)
        self.teacher.eval()  # the teacher never drops out
        return self

    @torch.no_grad()
    def teacher_attention(self, input_ids: torch.Tensor):
        """The teacher's per-layer attention inputs and outputs, lists of [B, T, hidden].
        The teacher runs whole (its root forward, which a sharded teacher needs to gather
        its embedding), with the logits of the last position only."""
        with _attention_taps(self.teacher, self.family) as (inputs, outputs):
            self.teacher(input_ids=input_ids, use_cache=False, logits_to_keep=1)
        return inputs, outputs

    def attention_mse(self, input_ids: torch.Tensor, mask: torch.Tensor,
                      taps: tuple[list, list] | None = None) -> torch.Tensor:
        """Stage 1: mean over layers of the student attention's mean squared error on the
        teacher's attention inputs, over the positions of mask [B, T] (bool). taps: the
        teacher's (inputs, outputs) when already recorded (`teacher_attention`)."""
        inputs, outputs = self.teacher_attention(input_ids) if taps is None else taps
        n = mask.sum().clamp(min=1)
        losses = []
        for block, x, y in zip(self.student.model.layers, inputs, outputs, strict=True):
            out = block.attn(x)  # [B, T, hidden]
            err = (out.float() - y.float()).pow(2).mean(-1)  # [B, T]
            losses.append((err * mask).sum() / n)
        return torch.stack(losses).mean()

    def kl(self, input_ids: torch.Tensor, mask: torch.Tensor,
           teacher_logits: torch.Tensor | None = None) -> torch.Tensor:
        """Stage 2: mean over the positions of mask [B, T] of KL(teacher || student) of the
        next-token distributions (float32)."""
        if teacher_logits is None:
            with torch.no_grad():
                teacher_logits = self.teacher(input_ids=input_ids, use_cache=False).logits
        logits = self.student(input_ids=input_ids, use_cache=False).logits  # [B, T, V]
        return kl_divergence(teacher_logits, logits, mask)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                **unused) -> tuple[None, torch.Tensor]:
        """input_ids [B, T]; labels [B, T] (only which positions are scored is read:
        labels != -100). Returns (None, the stage's loss)."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if labels is None else \
            labels != IGNORE_INDEX
        if self.stage == 1:
            return None, self.attention_mse(input_ids, mask)
        return None, self.kl(input_ids, mask)

    @torch.no_grad()
    def evaluation_sums(self, input_ids: torch.Tensor, labels: torch.Tensor
                        ) -> dict[str, float]:
        """One validation batch, input_ids and labels [B, T]: the sums over its n scored
        positions of the teacher's and the student's cross-entropy, the KL and the stage-1
        MSE, and n: {"teacher_loss", "student_loss", "kl", "mse", "tokens"}. A sharded
        model runs it as a forward (`shard_distill_model`)."""
        mask = labels != IGNORE_INDEX
        n = int(mask.sum())
        with _attention_taps(self.teacher, self.family) as taps:
            t_logits = self.teacher(input_ids=input_ids, use_cache=False).logits
        s_logits = self.student(input_ids=input_ids, use_cache=False).logits
        mse = self.attention_mse(input_ids, mask, taps)
        V = t_logits.shape[-1]
        sums = {key: float(F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1),
                                           reduction="sum", ignore_index=IGNORE_INDEX))
                for key, logits in (("teacher_loss", t_logits), ("student_loss", s_logits))}
        sums["kl"] = float(kl_divergence(t_logits, s_logits, mask)) * n
        sums["mse"] = float(mse) * n
        sums["tokens"] = n
        return sums


@register_shard_plan(DistillModel)
def shard_distill_model(model: DistillModel, dtype: str = "float32") -> None:
    """FSDP2 plan of a `DistillModel` (`pathattn.distributed.shard_model`): the teacher by
    `shard_frozen` (each decoder layer a unit, the root freed after every forward); the
    student's attention layers and blocks as units (stage 1 calls the attention layers on
    their own, so they gather their own parameters), the model as the root holding the
    student's embedding, final norm and head; `evaluation_sums` runs as a forward."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    shard_frozen(model.teacher, dtype)
    units = []
    for block in model.student.model.layers:
        units += [block.attn, block]
    shard_units(model, units, dtype)
    register_fsdp_forward_method(model, "evaluation_sums")


def kl_divergence(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
    """Mean over mask [B, T] of KL(softmax(teacher) || softmax(student)), logits
    [B, T, V], computed in float32 (float64 for float64 logits)."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_t = F.log_softmax(teacher_logits.to(dtype), dim=-1)
    log_s = F.log_softmax(student_logits.to(dtype), dim=-1)
    per_token = (log_t.exp() * (log_t - log_s)).sum(-1)  # [B, T]
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


@torch.no_grad()
def distill_metrics(model: DistillModel, loader: EvalLoader, batches: int | None,
                    dtype: str = "float32", device: torch.device | str = "cpu"
                    ) -> dict[str, float]:
    """On the first `batches` batches of `loader` (all when None): the teacher's and the
    student's mean cross-entropy and perplexity, the mean KL(teacher || student) and the
    stage-1 attention MSE, over every scored token: {"teacher_loss", "teacher_ppl",
    "student_loss", "student_ppl", "kl", "mse", "tokens"}."""
    was_training = model.training
    model.eval()
    sums = dict(teacher_loss=0.0, student_loss=0.0, kl=0.0, mse=0.0)
    count = 0
    try:
        for index, batch in enumerate(loader):
            if batches is not None and index >= batches:
                break
            if batch.num_scored == 0:
                continue
            with autocast_context(dtype, torch.device(device)):
                batch_sums = model.evaluation_sums(batch.input_ids.to(device),
                                                   batch.labels.to(device))
            for key in sums:
                sums[key] += batch_sums[key]
            count += batch_sums["tokens"]
    finally:
        model.train(was_training)
    out = {k: v / max(count, 1) for k, v in sums.items()}
    for who in ("teacher", "student"):
        out[f"{who}_ppl"] = math.exp(min(out[f"{who}_loss"], 700.0))
    out["tokens"] = count
    return out


def load_teacher(path: str | os.PathLike, device: torch.device | str = "cpu") -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained(path)` in float32 on device, eval mode;
    UnsupportedTeacher for a class without a mapping."""
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    family_of(teacher)
    return teacher.to(device).eval()


def build_student(cfg: DistillConfig, teacher: nn.Module) -> nn.Module:
    """The stage's starting student: cfg.student's folder, or one built from the teacher."""
    if cfg.student:
        from ..hf import PaTHForCausalLM

        ref = next(teacher.parameters())
        student = PaTHForCausalLM.from_pretrained(cfg.student, dtype=torch.float32)
        return student.to(ref.device)
    return student_from_teacher(teacher, cfg.attn_type, init=cfg.init, seed=cfg.seed,
                                **cfg.student_options)


def stage_workload(cfg: DistillConfig, teacher: nn.Module, student: nn.Module,
                   device: torch.device | str = "cpu", replica: tuple[int, int] = (0, 1)
                   ) -> Workload:
    """The Workload of one stage for an in-memory teacher and student (Python API; the
    command builds them from folders, `distill_workload`); replica = (index, count) of
    this data-parallel replica under torchrun, which reads its own rows."""
    cfg.validate()
    device = torch.device(device)
    train = TokenDataset(cfg.data, "train")
    if train.vocab_size > teacher.config.vocab_size:
        raise ValueError(f"data: its tokenizer has {train.vocab_size} ids, the teacher's "
                         f"vocabulary {teacher.config.vocab_size}; prepare the data with "
                         "the teacher's tokenizer")
    trainable_parameters(student, cfg.params)
    model = DistillModel(teacher.to(device), student.to(device).train(), cfg.stage)
    index, count = replica
    loader = TokenLoader(train, cfg.seq_len, cfg.batch_size, mode="windows", seed=cfg.seed,
                         rank=index, world_size=count)
    val = EvalLoader(cfg.data, cfg.seq_len, cfg.batch_size, mode="windows")

    def evaluate(m, batches):
        n = cfg.eval_batches if batches is None else batches
        return {"val": distill_metrics(m, val, n, cfg.dtype, device)}

    return Workload(model=model, train_data=TextSteps(loader, 1), evaluate=evaluate,
                    name=f"convert/stage{cfg.stage}")


@register_workload(DistillConfig)
def distill_workload(cfg: DistillConfig, device: torch.device,
                     replica: tuple[int, int] = (0, 1)) -> Workload:
    """`Trainer(cfg)`: the teacher from cfg.teacher, the student from cfg.student or built
    from the teacher; under torchrun this replica's rows of every global batch (replica =
    (index, count))."""
    teacher = load_teacher(cfg.teacher, device)
    return stage_workload(cfg, teacher, build_student(cfg, teacher), device, replica)


def unsharded_student(config, state: dict[str, torch.Tensor]) -> nn.Module:
    """A `PaTHForCausalLM` of HF config `config` holding the student weights of `state`, a
    full state dict of a `DistillModel` ("student.<name>" keys, e.g. gathered from FSDP
    shards by `pathattn.distributed.full_state_dict`), in float32 on the CPU."""
    from ..hf import PaTHForCausalLM

    student = PaTHForCausalLM(config)
    weights = {k.removeprefix("student."): v for k, v in state.items()
               if k.startswith("student.")}
    missing, unexpected = student.load_state_dict(weights, strict=False)
    tied = set(getattr(student, "_tied_weights_keys", None) or {}) \
        if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"state: not a DistillModel's student (missing "
                         f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})")
    return student.float().eval()


def export_student(student: nn.Module, out: str | os.PathLike,
                   tokenizer: Any | None = None, step: int = 0) -> Path:
    """`save_pretrained` of the student (and the tokenizer, with its identity:
    `pathattn.data.identity`) into `out`, replacing a previous export only once the new
    one is complete. NonFiniteTraining (at `step`; nothing written) when a weight is not
    finite. Returns the folder."""
    from ..data.identity import tokenizer_identity, write_export_identity
    from ..hf.export import save_tokenizer
    from ..train.divergence import check_finite_weights

    out = Path(out)
    check_finite_weights(student, step)
    with atomic_dir(out) as tmp:
        student.save_pretrained(tmp)
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp)  # without its BOS template (pathattn.hf.export)
            write_export_identity(tmp, tokenizer_identity(tokenizer))
    return out
