"""`pathattn pretrain`: language-model pretraining from the command line
(`pathattn.train.pretrain`).

    pathattn pretrain --data DIR --preset cpu-tiny [--attn path|path_fox|rope|fox|sba]
                      [--steps N | --tokens N] --out RUN

The model is the preset's `ModelConfig` with the data's vocabulary, the chosen attention
type and any `--model-arg KEY=VALUE`; the loop options default to the paper's recipe
(`PretrainConfig`), the warmup to 2 % of the steps. `--resume` continues RUN's checkpoint
with the config stored there. At the end RUN/hf holds the model and tokenizer for
`AutoModelForCausalLM` / `AutoTokenizer`.

`--init DIR` starts from the weights of a Hugging Face export folder (a `pathattn pretrain`
or `pathattn convert` output, DIR/hf) with its model config: continued pretraining, e.g.
after a conversion. --preset, --attn and --model-arg do not apply then.
"""

from __future__ import annotations

import argparse
import json
import math

# (flag, PretrainConfig field, type, help); default None = the config's default
LOOP_OPTIONS = [
    ("--seq-len", "seq_len", int, "tokens per row, the training length (default 256)"),
    ("--batch-size", "batch_size", int, "rows per micro-batch (default 8)"),
    ("--accum", "accum", int, "micro-batches per optimizer step (default 1)"),
    ("--packing", "packing", str, "packed (documents apart, default) or windows"),
    ("--dtype", "dtype", str, "float32 or bfloat16 autocast (default float32)"),
    ("--lr", "lr", float, "peak learning rate (default 1e-3)"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (default 0.01)"),
    ("--warmup-steps", "warmup_steps", int, "linear warmup steps (default 2 %% of steps)"),
    ("--warmup-start-ratio", "warmup_start_ratio", float,
     "warmup starts at lr times this (default 0.03: 3e-5 at lr 1e-3)"),
    ("--min-lr-ratio", "min_lr_ratio", float, "cosine floor as a fraction of lr (0.03)"),
    ("--grad-clip", "grad_clip", float, "max global grad norm, 0 = off (default 1.0)"),
    ("--seed", "seed", int, "seed of the model init and the data order (default 0)"),
    ("--eval-every", "eval_every", int, "steps between evaluations (default 200)"),
    ("--eval-batches", "eval_batches", int, "val batches per evaluation (default 8)"),
    ("--final-eval-batches", "final_eval_batches", int,
     "val batches of the final evaluation (default: all, up to 10000)"),
    ("--log-every", "log_every", int, "steps between log.jsonl records (default 10)"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints (200)"),
    ("--keep-checkpoints", "keep_checkpoints", int, "checkpoints kept on disk (default 2)"),
]


def add_pretrain_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli import add_model_arg_flag
    from ..models import ATTN_TYPES
    from ..models.config import PRESETS

    p.add_argument("--data", help="prepared folder (pathattn prepare)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model preset (default cpu-tiny)")
    p.add_argument("--attn", choices=ATTN_TYPES, default=None, help="default path")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="start from the weights and model config of an HF export folder "
                        "(pathattn pretrain / convert output)")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--steps", type=int, help="optimizer steps (default 200)")
    steps.add_argument("--tokens", type=int,
                       help="token budget: steps = ceil(tokens / (seq_len batch_size accum))")
    for flag, dest, typ, help_ in LOOP_OPTIONS:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    p.add_argument("--grad-checkpointing", action="store_true", default=None,
                   help="recompute each block in the backward (less memory)")
    add_model_arg_flag(p)
    p.add_argument("--out", required=True, help="run directory")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true",
                       help="continue from the checkpoint in --out with its stored config")
    group.add_argument("--overwrite", action="store_true",
                       help="replace the run in --out (its logs, metrics and checkpoints)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--no-export", action="store_true", help="skip the export to --out/hf")
    p.add_argument("--dp", choices=("ddp", "fsdp"), default="ddp",
                   help="under torchrun: replicate the model (ddp, default) or shard it "
                        "with FSDP2 (fsdp; checkpoints by torch.distributed.checkpoint)")
    p.add_argument("--context-parallel", type=int, default=1, metavar="N",
                   help="under torchrun: ranks sharing each row (ring attention; PaTH "
                        "attention types, --packing windows)")


def _new_config(args: argparse.Namespace, given: dict):
    from ..cli import model_args
    from ..data import TokenDataset
    from ..models.config import ModelConfig
    from .pretrain import PretrainConfig

    if not args.data:
        raise ValueError("--data: a prepared folder is required (pathattn prepare)")
    vocab = TokenDataset(args.data, "train").vocab_size
    overrides = model_args(args.model_arg)
    preset = ModelConfig.preset(args.preset or "cpu-tiny")
    seq_len = given.get("seq_len", PretrainConfig.seq_len)
    if args.init:
        model = _init_config(args, vocab)
    else:
        model = ModelConfig.preset(
            args.preset or "cpu-tiny", **{"vocab_size": vocab,
                                          "attn_type": args.attn or "path",
                                          "max_position_embeddings":
                                              max(preset.max_position_embeddings, seq_len),
                                          **overrides})
    cfg = dict(given, data=args.data, model=model, init=args.init or "")
    tokens_per_step = (seq_len * given.get("batch_size", PretrainConfig.batch_size)
                       * given.get("accum", PretrainConfig.accum))
    steps = args.steps
    if args.tokens is not None:
        if args.tokens < 1:
            raise ValueError(f"--tokens must be a positive int, got {args.tokens}")
        steps = math.ceil(args.tokens / tokens_per_step)
    cfg["steps"] = 200 if steps is None else steps
    cfg.setdefault("warmup_steps", max(1, cfg["steps"] // 50) if isinstance(
        cfg["steps"], int) and cfg["steps"] > 0 else 0)
    return PretrainConfig(**cfg)


def _init_config(args: argparse.Namespace, vocab: int):
    """The model config of --init's folder (checked against the data's vocabulary)."""
    from .pretrain import init_model_config

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


def pretrain_config(args: argparse.Namespace):
    """The PretrainConfig of parsed arguments (the checkpoint's with --resume; options that
    do not change results, e.g. --keep-checkpoints, may differ from it)."""
    from .pretrain import PretrainConfig
    from .run_dir import config_for_resume

    given = {dest: getattr(args, dest) for _, dest, _, _ in LOOP_OPTIONS
             if getattr(args, dest) is not None}
    if args.grad_checkpointing:
        given["grad_checkpointing"] = True
    common = dict(out_dir=args.out, progress=not args.no_progress)
    if not args.resume:
        return _new_config(args, {**given, **common})
    return config_for_resume(PretrainConfig, args.out, given, common)


def run_pretrain(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..data import DataError
    from .trainer import Trainer

    try:
        cfg = pretrain_config(args)
        if args.context_parallel > 1 and cfg.packing != "windows":
            raise ValueError("--context-parallel: the ring splits plain windows; add "
                             "--packing windows")
        trainer = Trainer(cfg, resume=args.resume, overwrite=args.overwrite, dp=args.dp,
                          context_parallel=args.context_parallel)
    except (ValueError, DataError) as e:
        parser.error(str(e))
    with trainer:
        metrics = trainer.train()
        finished = trainer.step == cfg.steps
        if not args.no_export and finished:
            path = _export(trainer, cfg)
            if trainer.is_main:
                print(f"wrote {path}")
        if trainer.is_main:
            print(json.dumps(metrics))
        if trainer.parallel is not None:
            trainer.parallel.close()
    return 0


def _export(trainer, cfg):
    """`export_hf` of the trained model on rank 0 (a sharded model is gathered first: a
    collective every rank calls)."""
    from ..distributed import full_state_dict
    from ..models import PaTHLM
    from .pretrain import export_hf

    if not trainer.sharded:
        return export_hf(trainer.model, cfg) if trainer.is_main else None
    state = full_state_dict(trainer.model)
    if not trainer.is_main:
        return None
    model = PaTHLM(cfg.model)
    model.load_state_dict(state)
    return export_hf(model, cfg)
