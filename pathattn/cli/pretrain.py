"""`pathattn pretrain`: language-model pretraining on a prepared folder
(`pathattn.train.pretrain`).

    pathattn pretrain --data DIR --preset cpu-tiny [--attn path|path_fox|rope|fox|sba]
                      [--steps N | --tokens N] --out RUN

The model is the preset's `ModelConfig` with the data's vocabulary, the chosen attention
type and any `--model-arg KEY=VALUE`; the loop options default to the paper's recipe
(`PretrainConfig`), the warmup to 2 % of the steps. `--resume` continues RUN's checkpoint
with the config stored there (an option that would change the run is refused). At the end
RUN/hf holds the model and tokenizer for `AutoModelForCausalLM` / `AutoTokenizer` in a
process that imported pathattn (unless --no-export). Before any work the data's tokenizer,
--init's tokenizer, --out and the memory of a step are checked; a non-finite loss or
gradient norm stops the run (exit 2).

`--init DIR` starts from the weights of a Hugging Face export folder (a `pathattn pretrain`
or `pathattn convert` output, DIR/hf) with its model config: continued pretraining, e.g.
after a conversion. --preset, --attn and --model-arg do not apply then.

Under torchrun, --dp ddp|fsdp replicates or shards the model and --context-parallel N
shares each row over N ranks (ring attention, --packing windows).

`--device cuda` trains on a GPU (under torchrun each rank's own, cuda:LOCAL_RANK, with
NCCL between the ranks; fused AdamW, batches copied from pinned memory); `--dtype
bfloat16` adds autocast. The device is not part of the run's config: a run may resume on
another device.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .args import (
    DTYPE_OPTION,
    add_context_parallel,
    add_device_flag,
    add_dp,
    add_model_flags,
    add_options,
    add_run_folder_flags,
    given_options,
    logging_options,
    model_args,
    optimizer_options,
)

HELP = "pretrain a language model on prepared text"
DEFAULT_STEPS = 200
# transformers knows pathattn's model type once pathattn is imported (registration)
LOAD_HINT = ("import pathattn; from transformers import AutoModelForCausalLM; "
             "AutoModelForCausalLM.from_pretrained({path!r})")

# dest == PretrainConfig field
LOOP_OPTIONS = [
    ("--seq-len", "seq_len", int, "tokens per row, the training length (default 256)"),
    ("--batch-size", "batch_size", int, "rows per micro-batch (default 8)"),
    ("--accum", "accum", int, "micro-batches per optimizer step (default 1)"),
    ("--packing", "packing", str, "packed (documents apart, default) or windows"),
    DTYPE_OPTION,
    *optimizer_options(weight_decay="0.01", warmup="2 %% of steps", min_lr_ratio="0.03"),
    ("--warmup-start-ratio", "warmup_start_ratio", float,
     "warmup starts at lr times this (default 0.03: 3e-5 at lr 1e-3)"),
    ("--seed", "seed", int, "seed of the model init and the data order (default 0)"),
    *logging_options(
        every=DEFAULT_STEPS, eval_batches="val batches per evaluation (default 8)",
        final_eval_batches="val batches of the final evaluation (default: all, up to 10000)",
        keep_checkpoints="checkpoints kept on disk (default 2)"),
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help=HELP, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn pretrain`; sets `run=run`."""
    p.add_argument("--data", help="prepared folder (pathattn prepare)")
    add_model_flags(p)
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from the weights and model config of an HF export folder "
                        "(pathattn pretrain / convert output)")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--steps", type=int, help=f"optimizer steps (default {DEFAULT_STEPS})")
    steps.add_argument("--tokens", type=int,
                       help="token budget: steps = ceil(tokens / (seq_len batch_size accum))")
    add_options(p, LOOP_OPTIONS)
    p.add_argument("--grad-checkpointing", action="store_true", default=None,
                   help="recompute each block in the backward (less memory)")
    add_run_folder_flags(p, "run directory",
                         "continue from the checkpoint in --out with its stored config",
                         "replace the run in --out (its logs, metrics and checkpoints)")
    p.add_argument("--no-export", action="store_true", help="skip the export to --out/hf")
    add_device_flag(p)
    add_dp(p, "under torchrun: replicate the model (ddp, default) or shard it with FSDP2 "
           "(fsdp; checkpoints by torch.distributed.checkpoint)")
    add_context_parallel(p, "under torchrun: ranks sharing each row (ring attention; PaTH "
                         "attention types, --packing windows)")
    p.set_defaults(run=run)


def _model_config(args: argparse.Namespace, vocab: int, seq_len: int):
    """The ModelConfig of a new run: --init's, or the preset's with the data's vocabulary,
    --attn and --model-arg."""
    from ..models.config import ModelConfig

    overrides = model_args(args.model_arg)
    if args.init:
        return _init_config(args, vocab)
    preset = ModelConfig.preset(args.preset or "cpu-tiny")
    return ModelConfig.preset(
        args.preset or "cpu-tiny", **{"vocab_size": vocab, "attn_type": args.attn or "path",
                                      "max_position_embeddings":
                                          max(preset.max_position_embeddings, seq_len),
                                      **overrides})


def _init_config(args: argparse.Namespace, vocab: int):
    """The model config of --init's folder (checked against the data's vocabulary)."""
    from ..train.pretrain import init_model_config

    given = [flag for flag, value in (("--preset", args.preset), ("--attn", args.attn),
                                      ("--model-arg", args.model_arg)) if value]
    if given:
        raise ValueError(f"--init takes the model config of {args.init}; "
                         f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply")
    model = init_model_config(args.init)
    if vocab > model.vocab_size:
        raise ValueError(f"--init: the model's vocabulary ({model.vocab_size}) is smaller "
                         f"than the data's tokenizer ({vocab} ids)")
    return model


def _steps(args: argparse.Namespace, tokens_per_step: int):
    """--steps, or the steps of the --tokens budget (default DEFAULT_STEPS)."""
    if args.tokens is None:
        return DEFAULT_STEPS if args.steps is None else args.steps
    if args.tokens < 1:
        raise ValueError(f"--tokens must be a positive int, got {args.tokens}")
    return math.ceil(args.tokens / tokens_per_step)


def _new_config(args: argparse.Namespace, given: dict):
    """The PretrainConfig of a new run (`given`: the loop options given)."""
    from ..data import TokenDataset
    from ..train.pretrain import PretrainConfig

    if not args.data:
        raise ValueError("--data: a prepared folder is required (pathattn prepare)")
    vocab = TokenDataset(args.data, "train").vocab_size
    seq_len = given.get("seq_len", PretrainConfig.seq_len)
    # absolute paths: a resume from another working folder reads the same files
    cfg = dict(given, data=_absolute(args.data), model=_model_config(args, vocab, seq_len),
               init=_absolute(args.init) if args.init else "")
    tokens_per_step = (seq_len * given.get("batch_size", PretrainConfig.batch_size)
                       * given.get("accum", PretrainConfig.accum))
    cfg["steps"] = _steps(args, tokens_per_step)
    cfg.setdefault("warmup_steps", max(1, cfg["steps"] // 50) if isinstance(
        cfg["steps"], int) and cfg["steps"] > 0 else 0)
    return PretrainConfig(**cfg)


def pretrain_config(args: argparse.Namespace):
    """The PretrainConfig of parsed arguments (the checkpoint's with --resume; options that
    do not change results, e.g. --keep-checkpoints, may differ from it)."""
    from ..train.pretrain import PretrainConfig
    from ..train.run_dir import config_for_resume

    given = given_options(args, LOOP_OPTIONS)
    if args.grad_checkpointing:
        given["grad_checkpointing"] = True
    common = dict(out_dir=args.out, progress=not args.no_progress)
    if not args.resume:
        return _new_config(args, {**given, **common})
    return config_for_resume(PretrainConfig, args.out, given, common,
                             changes=lambda stored: _resume_changes(args, stored))


def _absolute(path: str) -> str:
    return str(Path(path).resolve())


def _resume_changes(args: argparse.Namespace, stored: dict) -> dict:
    """{flag: (the run's value, the given one)} of the options given with --resume that
    are not loop options and would change the run: --data, --init (another folder),
    --attn, --model-arg, --preset (another model), --steps / --tokens (another length)."""
    from ..models.config import PRESETS

    changes = {}
    for flag_, key in (("--data", "data"), ("--init", "init")):
        value = getattr(args, key)
        if value and (not stored.get(key) or _absolute(value) != _absolute(stored[key])):
            changes[flag_] = (stored.get(key), value)
    model = stored.get("model") or {}
    if args.attn and args.attn != model.get("attn_type"):
        changes["--attn"] = (model.get("attn_type"), args.attn)
    overrides = model_args(args.model_arg)
    for key, value in overrides.items():
        if model.get(key) != value:
            changes[f"--model-arg {key}"] = (model.get(key), value)
    if args.preset:
        fixed = {"vocab_size", "attn_type", "max_position_embeddings", *overrides}
        other = {k: model.get(k) for k, v in PRESETS[args.preset].items()
                 if k not in fixed and model.get(k) != v}
        if other:
            changes["--preset"] = (other, args.preset)
    if args.steps is not None or args.tokens is not None:
        per_step = stored["seq_len"] * stored["batch_size"] * stored["accum"]
        if _steps(args, per_step) != stored["steps"]:
            changes["--steps" if args.tokens is None else "--tokens"] = (
                stored["steps"] * (1 if args.tokens is None else per_step),
                args.steps if args.tokens is None else args.tokens)
    return changes


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `pathattn pretrain`; a bad option or data folder goes to `parser.error`."""
    from ..data import DataError
    from ..train import Trainer
    from ..train.pretrain_run import train_and_export
    from ..utils.device import resolve_device
    from ..utils.io import writable_dir

    try:
        device = resolve_device(args.device)
        cfg = pretrain_config(args)
        if args.context_parallel > 1 and cfg.packing != "windows":
            raise ValueError("--context-parallel: the ring splits plain windows; add "
                             "--packing windows")
        writable_dir(args.out, "--out")
        trainer = Trainer(cfg, resume=args.resume, overwrite=args.overwrite, dp=args.dp,
                          context_parallel=args.context_parallel, device=device)
    except (ValueError, DataError) as e:
        parser.error(str(e))
    try:
        metrics, path = train_and_export(trainer, export=not args.no_export)
    except DataError as e:  # a data folder changed or damaged while training
        parser.error(str(e))
    if trainer.is_main:
        if path is not None:
            print(f"wrote {path} (load it in a process that imported pathattn: "
                  f"{LOAD_HINT.format(path=str(path))})")
        print(json.dumps(metrics))
    return 0
