"""`student_from_teacher`: a `PaTHForCausalLM` that starts from a pretrained RoPE model of the
LLaMA family (paper section 4.3, converting pretrained models, after RADLADS).

Everything the two architectures share is copied (`pathattn.convert.mapping`): embeddings,
block and final norms, the SwiGLU MLPs, the q, k, v, o projections with their biases and
Qwen3's q / k norms, grouped key/value heads and a tied or untied head. With
attn_type="rope" nothing else exists, and the student computes the teacher's logits (up to
rounding): the test of the map. The PaTH types add, per layer, parameters the teacher lacks
(`PaTHInit`):

    w_t    = L2normalize(ShortConv(W_w2 W_w1 x_t))       w projection and short conv
    beta_t = beta_max * sigmoid(W_beta x_t + b_beta)     H_t = I - beta_t w_t w_t^T
    g_t    = logsigmoid(W_f x_t + b_f)                   forget gates (path_fox, fox)

Init choice (`PaTHInit`), to start the student as close to the teacher as PaTH allows:
W_beta = 0 and b_beta = logit(beta / beta_max) with a small beta (default 0.1), so every
H_t starts as a mild reflection, close to the identity. The student then begins as the
teacher's network without position encoding (NoPE attention with the teacher's q, k, v, o)
and stage 1 grows the transforms it needs from there; with beta near 1 or 2 each H_t would
start as a projection or reflection along a random direction, scrambling every query-key
product at once. beta is not 0 exactly, so the gradients of w (proportional to beta) flow
from the first step. The w projection keeps the usual N(0, initializer_range) init (w is
normalised, so its scale does not matter) and the short convolution nn.Conv1d's. Forget
gates start with biases U(3, 6): f = sigmoid(b) in (0.95, 0.998), little forgetting (a RoPE
teacher has no decay), with a spread of time scales for stage 1 to pick from.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..models import ATTN_TYPES, ModelConfig
from .mapping import UnsupportedTeacher, copy_teacher_weights, rope_type, student_config_fields

__all__ = ["PaTHInit", "DEFAULT_INIT", "student_from_teacher", "student_config",
           "init_new_parameters"]


@dataclass(frozen=True)
class PaTHInit:
    """Initial values of the parameters a PaTH student adds (module docstring).

    Args:
        beta: every beta_t at the start, in (0, beta_max): W_beta = 0, b_beta =
            logit(beta / beta_max).
        forget_bias: (low, high): forget-gate biases ~ U(low, high) (path_fox, fox).
        w_std: std of the w projection's normal init (None = the config's
            initializer_range).
    """

    beta: float = 0.1
    forget_bias: tuple[float, float] = (3.0, 6.0)
    w_std: float | None = None


DEFAULT_INIT = PaTHInit()


def student_config(teacher: nn.Module, attn_type: str = "path", **fields) -> ModelConfig:
    """The student's `ModelConfig`: the teacher family's fields (`mapping`), attn_type and
    the PaTH fields given (w_rank, conv_size, beta_max, ...)."""
    if attn_type not in ATTN_TYPES:
        raise ValueError(f"attn_type must be one of {ATTN_TYPES}, got {attn_type!r}")
    base = student_config_fields(teacher)
    if attn_type == "rope" and rope_type(teacher.config) != "default":
        raise UnsupportedTeacher(f"teacher: rope_type {rope_type(teacher.config)!r}; an "
                                 "attn_type='rope' student has plain RoPE only (the PaTH "
                                 "types have no RoPE and accept any teacher RoPE)")
    return ModelConfig(**{**base, "attn_type": attn_type, **fields})


@torch.no_grad()
def init_new_parameters(student: nn.Module, init: PaTHInit = DEFAULT_INIT) -> None:
    """Set the PaTH parameters of every layer of `student` (a PaTHForCausalLM) as `init`
    says; layers without them (RoPE) are left alone."""
    for block in student.model.layers:
        attn = block.attn
        beta_proj = getattr(attn, "beta_proj", None)
        if beta_proj is not None:
            ratio = init.beta / attn.beta_max
            if not 0 < ratio < 1:
                raise ValueError(f"init.beta must lie in (0, beta_max={attn.beta_max}), got "
                                 f"{init.beta!r}")
            beta_proj.weight.zero_()
            beta_proj.bias.fill_(math.log(ratio / (1 - ratio)))
        w_proj = getattr(attn, "w_proj", None)
        if w_proj is not None:
            std = student.config.initializer_range if init.w_std is None else init.w_std
            for m in w_proj.modules():
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0.0, std)
        g_proj = getattr(attn, "g_proj", None)
        if g_proj is not None:
            low, high = init.forget_bias
            g_proj.weight.normal_(0.0, student.config.initializer_range)
            g_proj.bias.uniform_(low, high)


def student_from_teacher(teacher: nn.Module, attn_type: str = "path", *,
                         init: PaTHInit = DEFAULT_INIT, seed: int | None = 0, **fields):
    """A `PaTHForCausalLM` holding the teacher's weights (module docstring).

    Args:
        teacher: a transformers LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or
            Qwen3ForCausalLM (SmolLM2 is a Llama), in any float dtype; it is not changed.
        attn_type: "path", "path_fox", "rope" (the exactness check) or "fox".
        init: initial values of the new PaTH parameters (`PaTHInit`).
        seed: seeds the random init of the new parameters (None: the global RNG as is).
        **fields: further `ModelConfig` fields of the student (w_rank, conv_size,
            beta_max, ...; e.g. beta_max=1.99 for bf16 training).

    Returns the student in the teacher's dtype and device, in eval mode, with the teacher's
    bos / eos / pad token ids.
    """
    from ..hf import PaTHConfig, PaTHForCausalLM

    config = student_config(teacher, attn_type, **fields)
    ids = {f"{k}_token_id": getattr(teacher.config, f"{k}_token_id", None)
           for k in ("bos", "eos", "pad")}
    hf_config = PaTHConfig.from_model_config(
        config, **{k: v for k, v in ids.items() if v is not None})
    ref = next(teacher.parameters())
    fork = torch.random.fork_rng(devices=[]) if seed is not None else \
        contextlib.nullcontext()
    with fork:
        if seed is not None:
            torch.manual_seed(seed)
        student = PaTHForCausalLM(hf_config).to(device=ref.device, dtype=ref.dtype)
        copy_teacher_weights(student, teacher)
        init_new_parameters(student, init)
    return student.eval()

