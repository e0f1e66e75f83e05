"""Argument groups shared by the commands: option tables, the model flags (--preset,
--attn, --model-arg), the optimiser and logging flags of the training loops, the
run-folder flags (--out, --resume / --overwrite, --no-progress), the corpus flags of
tokenizer / prepare and the model-folder flags of the evaluations."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence

# (flag, dest, type, help) of an option whose default None means "not given": the
# library's default applies
Option = tuple[str, str, type, str]

DTYPE_OPTION: Option = ("--dtype", "dtype", str, "float32 or bfloat16 autocast (default float32)")


def flag(name: str) -> str:
    """The flag of an option name: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def add_options(p: argparse.ArgumentParser, options: Iterable[Option],
                skip: Sequence[str] = ()) -> None:
    """One flag per option (default None), but those whose dest is in `skip`."""
    for flag_, dest, typ, help_ in options:
        if dest not in skip:
            p.add_argument(flag_, dest=dest, type=typ, default=None, help=help_)


def given_options(args: argparse.Namespace, options: Iterable[Option],
                  skip: Sequence[str] = ()) -> dict:
    """dest -> value of the options given on the command line, but those in `skip`."""
    return {dest: getattr(args, dest) for _, dest, _, _ in options
            if dest not in skip and getattr(args, dest) is not None}


def optimizer_options(weight_decay: str, warmup: str, min_lr_ratio: str) -> list[Option]:
    """--lr, --weight-decay, --warmup-steps, --min-lr-ratio, --grad-clip of a training loop
    (`pathattn.train.LoopConfig`); the arguments: the defaults the help shows."""
    return [
        ("--lr", "lr", float, "peak learning rate (default 1e-3)"),
        ("--weight-decay", "weight_decay", float, f"AdamW weight decay (default {weight_decay})"),
        ("--warmup-steps", "warmup_steps", int, f"linear warmup steps (default {warmup})"),
        ("--min-lr-ratio", "min_lr_ratio", float,
         f"cosine floor as a fraction of lr ({min_lr_ratio})"),
        ("--grad-clip", "grad_clip", float, "max global grad norm, 0 = off (default 1.0)"),
    ]


def logging_options(every: int, eval_batches: str, final_eval_batches: str,
                    keep_checkpoints: str) -> list[Option]:
    """--eval-every, --eval-batches, --final-eval-batches, --log-every, --checkpoint-every,
    --keep-checkpoints of a training loop; `every`: the default steps between evaluations
    and between checkpoints, the others: the help of the options whose meaning depends on
    the loop."""
    return [
        ("--eval-every", "eval_every", int, f"steps between evaluations (default {every})"),
        ("--eval-batches", "eval_batches", int, eval_batches),
        ("--final-eval-batches", "final_eval_batches", int, final_eval_batches),
        ("--log-every", "log_every", int, "steps between log.jsonl records (default 10)"),
        ("--checkpoint-every", "checkpoint_every", int, f"steps between checkpoints ({every})"),
        ("--keep-checkpoints", "keep_checkpoints", int, keep_checkpoints),
    ]


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """--preset and --attn (a `ModelConfig` preset and attention type), --model-arg."""
    from ..models import ATTN_TYPES
    from ..models.config import PRESETS

    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model preset (default cpu-tiny)")
    p.add_argument("--attn", choices=ATTN_TYPES, default=None, help="default path")
    add_model_arg_flag(p)


def add_model_arg_flag(p: argparse.ArgumentParser) -> None:
    """--model-arg KEY=VALUE (repeatable): any `ModelConfig` field."""
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any ModelConfig field, e.g. beta_max=1.99, w_rank=16, qk_norm=true, "
                   "num_key_value_heads=1 (repeatable)")


def model_args(items: Sequence[str]) -> dict:
    """["beta_max=1.99", "qk_norm=true"] -> {"beta_max": 1.99, "qk_norm": True}: values are
    read as JSON (numbers, true / false, null), anything else as a string; ValueError for
    an item without "="."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--model-arg: expected KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def add_run_folder_flags(p: argparse.ArgumentParser, out_help: str, resume_help: str,
                         overwrite_help: str, progress_help: str = "no tqdm progress bar"
                         ) -> None:
    """--out (required), --resume / --overwrite (one or the other: what to do with an --out
    that already holds a run, `pathattn.train.run_dir`; without either such an --out is
    refused) and --no-progress."""
    p.add_argument("--out", required=True, help=out_help)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=resume_help)
    group.add_argument("--overwrite", action="store_true", help=overwrite_help)
    add_no_progress(p, progress_help)


def add_no_progress(p: argparse.ArgumentParser, help_: str = "no progress bar") -> None:
    """--no-progress: no progress bar."""
    p.add_argument("--no-progress", action="store_true", help=help_)


def add_context_parallel(p: argparse.ArgumentParser, help_: str) -> None:
    """--context-parallel N: under torchrun, ranks sharing each sequence (default 1)."""
    p.add_argument("--context-parallel", type=int, default=1, metavar="N", help=help_)


def add_dp(p: argparse.ArgumentParser, help_: str) -> None:
    """--dp ddp|fsdp: under torchrun, replicate or shard the model (default ddp)."""
    p.add_argument("--dp", choices=("ddp", "fsdp"), default="ddp", help=help_)


def add_corpus_flags(p: argparse.ArgumentParser, records: str, overwrite_help: str) -> None:
    """--input PATH... and --text-field of a command that reads a corpus
    (`pathattn.data.corpus`), its --overwrite and --no-progress; `records`: what the help
    says of .jsonl / .parquet files."""
    p.add_argument("--input", dest="inputs", nargs="+", action="extend", metavar="PATH",
                   help="text files, folders (searched recursively for .txt .md .py .rst "
                   f".jsonl .parquet), .jsonl / .parquet files{records} (default: the "
                   "Python standard library's *.py files)")
    p.add_argument("--text-field", default="text", metavar="NAME",
                   help="text field of .jsonl / .parquet records (default text)")
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)
    add_no_progress(p)


def add_hf_model_flag(p: argparse.ArgumentParser) -> None:
    """--model DIR: the Hugging Face model folder (with its tokenizer) an evaluation
    loads."""
    p.add_argument("--model", required=True, metavar="DIR",
                   help="Hugging Face model folder with its tokenizer (e.g. RUN/hf)")


def add_device_and_results_flags(p: argparse.ArgumentParser) -> None:
    """--device (default: cuda when available) and --out (default MODEL/eval) of an
    evaluation of one --model."""
    add_device_flag(p, None)
    p.add_argument("--out", metavar="DIR", help="results folder (default MODEL/eval)")


def add_device_flag(p: argparse.ArgumentParser, default: str | None = "cpu") -> None:
    """--device: where the command computes ("cpu", "cuda", "cuda:N"; under torchrun
    "cuda" is each rank's GPU, cuda:LOCAL_RANK, with NCCL between the ranks); default
    `default` (None: cuda when available, else cpu). Resolved by
    `pathattn.utils.device.resolve_device`, whose ValueError names --device."""
    what = "cuda when available, else cpu" if default is None else default
    p.add_argument("--device", default=default,
                   help=f"torch device: cpu, cuda or cuda:N (under torchrun, cuda is each "
                        f"rank's GPU, NCCL between them; default {what})")
