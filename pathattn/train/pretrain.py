"""Language-model pretraining (paper section 4.2) on a prepared text folder
(`pathattn prepare`), by the one training loop (`Trainer`).

Under `torchrun --nproc_per_node=P` the run is data-parallel (DDP): each rank reads its
own rows of every global batch, the update is the single-process one (the same global
batches, each token weighted alike), only rank 0 evaluates and writes.

`PretrainConfig` is the loop's config (`LoopConfig`) with the data, the batch shape and
the whole `ModelConfig` embedded, so a run's config.json says everything that decides its
results. Its defaults are the paper's recipe (appendix, "Experimental details"): AdamW,
peak learning rate 1e-3 with a linear warmup from 3e-5 and a cosine decay to 3e-5, weight
decay 0.01, gradient clipping 1.0, initialisation std 0.02 (`ModelConfig`).

A step is `accum` micro-batches of `batch_size` rows of `seq_len` tokens (`TokenLoader`
global batches, in order): its loss is the mean over all its scored tokens. Evaluation:
validation loss (mean cross-entropy over every scored token of the first `eval_batches`
batches of the val split, in stored order) and perplexity exp(loss), as "val_loss" and
"val_ppl" in eval.jsonl and metrics.json (the final evaluation covers at most
`final_eval_batches` batches: by default the whole split of a CPU-sized corpus).

`init` (`pathattn pretrain --init DIR`) starts from the weights of a Hugging Face export
folder (a `PaTHForCausalLM`: a `pathattn pretrain` or `pathattn convert` output) instead of
a random init, with that folder's model config: continued pretraining, e.g. the third
stage of a conversion (`pathattn.convert`).

Before any work the data's tokenizer folder must be the one recorded in its meta.json, an
`init` folder must hold that same tokenizer (`pathattn.data.identity`), and a training
step must fit the device's memory (`check_sizes`). At the end `export_hf` writes
`out_dir/hf/`: `save_pretrained` of the model as a `PaTHForCausalLM` plus the tokenizer
and its identity, loadable with `AutoModelForCausalLM` and `AutoTokenizer` in a process
that imported pathattn.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data import EvalLoader, TokenDataset, TokenLoader
from ..data.identity import (
    check_same,
    data_tokenizer,
    model_tokenizer,
    tokenizer_identity,
    write_export_identity,
)
from ..data.loader import MODES
from ..models import PaTHLM
from ..models.config import ModelConfig
from ..utils import autocast_context
from ..utils.io import atomic_dir
from ..utils.system import check_fits_memory
from .divergence import check_finite_weights
from .loop_config import LoopConfig
from .workload import Workload, register_workload

__all__ = ["PretrainConfig", "TextSteps", "text_loss", "export_hf", "init_model_config",
           "load_init_weights", "check_init_tokenizer", "check_sizes", "step_memory_floor"]


@dataclass
class PretrainConfig(LoopConfig):
    """A pretraining run: the loop's fields (`LoopConfig`, with the paper's recipe as
    defaults), data (a prepared folder), model (a ModelConfig or its dict), seq_len
    (tokens per row, the training length), batch_size (rows per micro-batch), accum
    (micro-batches per optimizer step), packing ("packed": documents never attend to each
    other, cu_seqlens; "windows": plain windows over the token stream), grad_checkpointing
    (recompute each block in the backward instead of storing its activations), init (a
    `PaTHForCausalLM` folder whose weights the model starts from; "" = random init; its
    config must equal `model`, see `init_model_config`)."""

    POSITIVE_INTS = LoopConfig.POSITIVE_INTS + ("seq_len", "batch_size", "accum")

    data: str = ""
    model: Any = field(default_factory=lambda: ModelConfig.preset("cpu-tiny"))
    seq_len: int = 256
    batch_size: int = 8
    accum: int = 1
    packing: str = "packed"
    grad_checkpointing: bool = False
    init: str = ""
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_start_ratio: float = 0.03
    min_lr_ratio: float = 0.03
    eval_every: int = 200
    eval_batches: int = 8
    final_eval_batches: int = 10_000
    checkpoint_every: int = 200
    out_dir: str = "runs/pretrain"

    def validate(self) -> PretrainConfig:
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        if not isinstance(self.model, ModelConfig):
            raise ValueError(f"model must be a ModelConfig or its dict, got {self.model!r}")
        self.model.validate()
        super().validate()
        if not isinstance(self.data, str) or not self.data:
            raise ValueError("data must be the path of a prepared folder (pathattn prepare), "
                             f"got {self.data!r}")
        if self.packing not in MODES:
            raise ValueError(f"packing must be one of {MODES}, got {self.packing!r}")
        if not isinstance(self.init, str):
            raise ValueError(f"init must be the path of an HF export folder or '', got "
                             f"{self.init!r}")
        if not isinstance(self.grad_checkpointing, bool):
            raise ValueError(f"grad_checkpointing must be a bool, got "
                             f"{self.grad_checkpointing!r}")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.accum


class TextSteps:
    """Training steps of `accum` consecutive `TokenLoader` batches each: micro-batches as
    `PaTHLM.forward` keyword arguments plus "global_scored" and "global_tokens" (scored
    targets and input tokens of the whole global micro-batch, for the loop's weighting
    under torchrun); `batches` counts steps."""

    def __init__(self, loader: TokenLoader, accum: int):
        self.loader, self.accum = loader, accum

    @property
    def batches(self) -> int:
        return self.loader.next_index // self.accum

    def __iter__(self):
        return self

    def __next__(self) -> list[dict[str, Any]]:
        steps = []
        for _ in range(self.accum):
            batch = next(self.loader)
            mb = {k: v for k, v in batch.model_inputs().items() if v is not None}
            mb.update(global_scored=batch.global_num_scored,
                      global_tokens=self.loader.tokens_per_batch)
            steps.append(mb)
        return steps

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


@torch.no_grad()
def text_loss(model: torch.nn.Module, loader: EvalLoader, batches: int | None,
              dtype: str = "float32", device: torch.device | str = "cpu") -> dict[str, float]:
    """Mean cross-entropy over every scored token of the first `batches` batches of
    `loader` (all when None), its perplexity and the token count: {"loss", "ppl",
    "tokens"}. The model is put in eval mode and back."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for index, batch in enumerate(loader):
            if batches is not None and index >= batches:
                break
            if batch.num_scored == 0:
                continue
            inputs = {k: v.to(device) for k, v in batch.model_inputs().items()
                      if v is not None}
            with autocast_context(dtype, torch.device(device)):
                _, loss = model(**inputs)
            total += float(loss) * batch.num_scored
            count += batch.num_scored
    finally:
        model.train(was_training)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": count}


def init_model_config(folder: str | os.PathLike) -> ModelConfig:
    """The `ModelConfig` of a `PaTHForCausalLM` export folder (its config.json); ValueError
    when the folder holds no pathattn model."""
    import json

    from ..hf import PaTHConfig

    try:
        model_type = json.loads((Path(folder) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"init: {folder} is not a model folder (config.json: {e})") from None
    if model_type != PaTHConfig.model_type:
        raise ValueError(f"init: {folder} holds a {model_type!r} model, not a pathattn one "
                         "(convert it first: pathattn convert)")
    config = PaTHConfig.from_pretrained(str(folder))
    return config.to_model_config()


def check_init_tokenizer(folder: str | os.PathLike, data_identity: dict) -> None:
    """DataError unless the export `folder` (`init`) holds the tokenizer of the data
    (`data_identity`, `pathattn.data.identity`): its weights read ids as that tokenizer
    means them."""
    _, found = model_tokenizer(folder, "init")
    check_same(found, data_identity, f"the tokenizer of {folder}",
               "the tokenizer the data was prepared with", "init")


def step_memory_floor(cfg: PretrainConfig) -> tuple[int, int]:
    """(parameters of cfg.model, bytes a training step needs at the least): weights,
    gradients and AdamW's two moments in float32 (16 bytes a parameter), and per token of
    a micro-batch its ids and labels, float32 logits and their gradient, and one float32
    activation per layer and width (the model is built on the meta device: nothing is
    allocated)."""
    with torch.device("meta"):
        params = sum(p.numel() for p in PaTHLM(cfg.model).parameters())
    m = cfg.model
    tokens = cfg.seq_len * cfg.batch_size
    per_token = 32 + 8 * m.vocab_size + 4 * m.hidden_size * m.num_hidden_layers
    return params, 16 * params + tokens * per_token


def check_sizes(cfg: PretrainConfig, device: torch.device | str = "cpu") -> None:
    """ValueError naming seq_len, batch_size and the model when a training step cannot fit
    the device's memory (`step_memory_floor`, `pathattn.utils.system`)."""
    params, floor = step_memory_floor(cfg)
    check_fits_memory(floor, f"seq_len {cfg.seq_len} x batch_size {cfg.batch_size} with a "
                      f"model of {params:,} parameters (vocab_size {cfg.model.vocab_size}): "
                      "a training step", torch.device(device))


def load_init_weights(model: PaTHLM, folder: str | os.PathLike) -> PaTHLM:
    """Load the weights of the `PaTHForCausalLM` export `folder` into `model` (same
    config; ValueError otherwise) and return it."""
    from ..hf import PaTHForCausalLM

    if init_model_config(folder) != model.config:
        raise ValueError(f"init: the model config of {folder} differs from the run's "
                         "(`init_model_config` gives the one to use)")
    hf = PaTHForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model


@register_workload(PretrainConfig)
def text_workload(cfg: PretrainConfig, device: torch.device,
                  replica: tuple[int, int] = (0, 1)) -> Workload:
    """A `PaTHLM` of cfg.model on cfg.data's training split, this replica's rows of each
    global batch (replica = (index, count)); validation loss on its val split."""
    train = TokenDataset(cfg.data, "train")
    if train.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"model: vocab_size {cfg.model.vocab_size} is smaller than the "
                         f"data's tokenizer ({train.vocab_size} ids)")
    # the data's tokenizer is exported with the model: checked before any work
    identity = tokenizer_identity(data_tokenizer(cfg.data, train.meta))
    if cfg.init:
        check_init_tokenizer(cfg.init, identity)
    check_sizes(cfg, device)
    model = PaTHLM(cfg.model)
    if cfg.init:
        load_init_weights(model, cfg.init)
    model = model.to(device)
    model.gradient_checkpointing = cfg.grad_checkpointing
    # under torchrun each replica reads its own rows of every global batch
    index, count = replica
    loader = TokenLoader(train, cfg.seq_len, cfg.batch_size, mode=cfg.packing, seed=cfg.seed,
                         rank=index, world_size=count)
    val = EvalLoader(cfg.data, cfg.seq_len, cfg.batch_size, mode=cfg.packing)

    def evaluate(m, batches):
        n = cfg.eval_batches if batches is None else batches
        return {"val": text_loss(m, val, n, cfg.dtype, device)}

    return Workload(model=model, train_data=TextSteps(loader, cfg.accum), evaluate=evaluate,
                    name=f"pretrain/{cfg.model.attn_type}")


def export_hf(model: PaTHLM, cfg: PretrainConfig, out: str | os.PathLike | None = None,
              step: int | None = None) -> Path:
    """Write `save_pretrained` of `model` as a PaTHForCausalLM, the data's tokenizer
    (checked against meta.json's identity) and that identity (`IDENTITY_FILE`) to `out`
    (default cfg.out_dir/hf), replacing a previous export only once the new one is
    complete. NonFiniteTraining (nothing written) when a weight is not finite; `step`
    (default cfg.steps) names the step in that error. Returns the folder."""
    from ..hf import PaTHForCausalLM
    from ..hf.export import save_tokenizer

    out = Path(cfg.out_dir) / "hf" if out is None else Path(out)
    check_finite_weights(model, cfg.steps if step is None else step)
    tok = data_tokenizer(cfg.data, TokenDataset(cfg.data, "train").meta)
    ids = {name: getattr(tok, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    hf = PaTHForCausalLM.from_pathlm(model, **{f"{k}_token_id": v for k, v in ids.items()
                                                 if v is not None})
    with atomic_dir(out) as tmp:
        hf.save_pretrained(tmp)
        save_tokenizer(tok, tmp)  # without its BOS template (pathattn.hf.export)
        write_export_identity(tmp, tokenizer_identity(tok))
    return out
