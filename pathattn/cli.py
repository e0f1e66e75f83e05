"""Command line. Subcommands are argparse subparsers, one `_add_*` / `_run_*` pair each.

`pathattn data TASK --n N --out FILE.jsonl` exports synthetic-task sequences
(`pathattn.tasks`) as JSONL, one `{"tokens": [...], "targets": [...]}` per line, tokens as
strings and targets[t] the token the model must output at position t (null where not
scored).

`pathattn train --task flipflop --attn path --layers 1 --heads 2 --dim 64 --steps N
--batch-size B --out DIR` trains a model (`pathattn.train`); options left out take the
`TrainConfig` defaults (flip-flop on a CPU: 2000 steps of batch 16, enough for PaTH to
reach 0 errors on every split). `--resume` continues DIR's checkpoint with the
config stored there (options given must agree with it). Under `torchrun --nproc_per_node=P
-m pathattn train ...` the run is data-parallel over the P processes (same global batch,
same losses as one process), `--context-parallel N` shards each sequence over N of them.

`pathattn compare --task flipflop --attns path rope ... --out DIR` trains one model per
attention type with the same options and writes DIR/results.md (markdown table),
DIR/results.json and DIR/error_vs_step.png.

`pathattn layers --task a5 --length K --attns path rope --out DIR` finds, per attention
type, the fewest layers whose final score reaches 0.9 (`pathattn.train.sweep`).

compare and layers take `--seeds S...`: one run (or sweep) per attention type and seed, and
reports of each seed's value with the median, min and max over the seeds
(`pathattn.train.seeds`; without --seeds, the one seed of --seed).

Run folders (`pathattn.train.run_dir`): train, compare and layers refuse a --out that
already holds a run unless --resume (continue it) or --overwrite (replace it) is given, and
lock it while they write: a second command on the same --out exits at once (status 1).
Ctrl-C or SIGTERM during training finishes the step, writes a checkpoint, prints the
command that resumes it and exits with 130 / 143; a second Ctrl-C aborts at once."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import warnings
from collections.abc import Sequence

from .tasks import get_task, options_by_name, task_names, write_jsonl


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _option_help(owners) -> str:
    """e.g. "a5, s5 (default 32), mqrar (default 768): tokens per sequence": the tasks that
    take the option with their defaults (tasks of one default grouped), then what it is
    (as the first of them declares it)."""
    groups: list[tuple[list[str], object]] = []
    for spec, option in owners:
        if groups and groups[-1][1] == option.default:
            groups[-1][0].append(spec.name)
        else:
            groups.append(([spec.name], option.default))
    where = ", ".join(f"{', '.join(tasks)} (default {default})" for tasks, default in groups)
    return f"{where}: {owners[0][1].help}"


def _add_task_options(p: argparse.ArgumentParser) -> None:
    """One flag per option of the registered tasks (`pathattn.tasks.TaskSpec.options`),
    dest = the option's name, default None = "not given"."""
    for name, owners in options_by_name().items():
        option = owners[0][1]
        p.add_argument(_flag(name), dest=name, type=option.type, choices=option.choices,
                       default=None, help=_option_help(owners))


def _given_options(args: argparse.Namespace) -> dict:
    """The task options given on the command line, name -> value."""
    return {name: getattr(args, name) for name in options_by_name()
            if getattr(args, name) is not None}


def _check_options_apply(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """parser.error for a task option given with a task that does not take it."""
    for name, owners in options_by_name().items():
        tasks = [spec.name for spec, _ in owners]
        if getattr(args, name) is not None and args.task not in tasks:
            parser.error(f"{_flag(name)} applies to {', '.join(tasks)} only")


def _split_tasks() -> list:
    """The specs of the tasks whose task object draws each of its splits (`--split`)."""
    return [spec for spec in map(get_task, task_names()) if spec.data_splits]


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="export synthetic-task sequences as JSONL",
                       description=__doc__)
    p.add_argument("task", choices=task_names())
    p.add_argument("--n", type=int, required=True, help="number of sequences")
    p.add_argument("--out", required=True, help="output .jsonl path")
    p.add_argument("--seed", type=int, default=0)
    specs = _split_tasks()
    p.add_argument("--split", choices=sorted({s for spec in specs for s in spec.splits}),
                   help=f"{', '.join(spec.name for spec in specs)} (default: train)")
    _add_task_options(p)
    p.set_defaults(run=_run_data)


def _build_task(args: argparse.Namespace):
    """The task object for parsed `data` arguments; options left None take the defaults."""
    return get_task(args.task).build(args.split or "train", _given_options(args),
                                     seed=args.seed)


def _run_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_options_apply(args, parser)
    if args.split is not None and not get_task(args.task).data_splits:
        parser.error(f"--split applies to {', '.join(s.name for s in _split_tasks())} only")
    if args.n < 0:
        parser.error("--n must be >= 0")
    try:
        task = _build_task(args)
    except ValueError as e:
        parser.error(str(e))
    written = write_jsonl(task, task.vocab, args.n, args.out)
    print(f"wrote {written} {args.task} sequences to {args.out}")
    return 0


# train options besides the task's (`_add_task_flag`, `_add_task_options`): (flag, dest ==
# TrainConfig field, type, help); default None = "not given"
TRAIN_OPTIONS = [
    ("--attn", "attn", str, "a registered attention type (pathattn.models.ATTN_TYPES): "
     "path, path_fox, rope, fox, sba, ... (default path)"),
    ("--layers", "layers", int, "number of blocks (default 1)"),
    ("--heads", "heads", int, "attention heads (default 2)"),
    ("--dim", "dim", int, "hidden size (default 64)"),
    ("--steps", "steps", int, "optimizer steps (default 2000)"),
    ("--batch-size", "batch_size", int, "sequences per step (default 16)"),
    ("--lr", "lr", float, "peak learning rate (default 1e-3)"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (default 0.1)"),
    ("--warmup-steps", "warmup_steps", int, "linear warmup steps (default 100)"),
    ("--min-lr-ratio", "min_lr_ratio", float, "cosine floor as a fraction of lr (0.1)"),
    ("--grad-clip", "grad_clip", float, "max global grad norm, 0 = off (default 1.0)"),
    ("--seed", "seed", int, "seed of the model init and the data (default 0)"),
    ("--dtype", "dtype", str, "float32 or bfloat16 autocast (default float32)"),
    ("--eval-every", "eval_every", int, "steps between evaluations (default 500)"),
    ("--eval-batches", "eval_batches", int, "batches per split per evaluation (default 4)"),
    ("--final-eval-batches", "final_eval_batches", int,
     "batches per split in the final evaluation, metrics.json (default 64)"),
    ("--log-every", "log_every", int, "steps between log.jsonl records (default 10)"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints (500)"),
    ("--keep-checkpoints", "keep_checkpoints", int,
     "checkpoints kept on disk, the latest and older ones to fall back on (default 2)"),
]


def _add_task_flag(p: argparse.ArgumentParser) -> None:
    """--task of train, compare and layers (their task options: `_add_task_options`)."""
    names = task_names()
    p.add_argument("--task", dest="task", default=None,
                   help=f"{', '.join(names[:-1])} or {names[-1]} (default flipflop)")


def _given_task_fields(args: argparse.Namespace) -> dict:
    """The TrainConfig fields of the task flags given (task, task options)."""
    from .train.config import option_fields

    given = option_fields(_given_options(args))
    return given if args.task is None else {"task": args.task, **given}


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on a synthetic task",
                       description="Train a PaTHLM on a synthetic task (pathattn.train). "
                       "Writes DIR/log.jsonl, eval.jsonl, metrics.json, checkpoints/.")
    _add_task_flag(p)
    for flag, dest, typ, help_ in TRAIN_OPTIONS:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    _add_task_options(p)
    add_model_arg_flag(p)
    p.add_argument("--out", required=True, help="run directory (out_dir)")
    _add_run_dir_flags(p, "continue from the checkpoint in --out with its stored config",
                       "replace the run in --out (its logs, metrics and checkpoints)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--context-parallel", type=int, default=1, metavar="N",
                   help="under torchrun: ranks sharing each sequence (context parallelism, "
                   "PaTH layers only); data parallelism over the rest (default 1)")
    p.set_defaults(run=_run_train)


def add_model_arg_flag(p: argparse.ArgumentParser) -> None:
    """--model-arg KEY=VALUE (repeatable): any `ModelConfig` field."""
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any ModelConfig field, e.g. beta_max=1.99, w_rank=16, qk_norm=true, "
                   "num_key_value_heads=1 (repeatable)")


def model_args(items: Sequence[str]) -> dict:
    """["beta_max=1.99", "qk_norm=true"] -> {"beta_max": 1.99, "qk_norm": True}: values are
    read as JSON (numbers, true / false, null), anything else as a string."""
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


def _add_run_dir_flags(p: argparse.ArgumentParser, resume_help: str,
                       overwrite_help: str) -> None:
    """--resume / --overwrite (one or the other): what to do with a --out that already
    holds a run (`pathattn.train.run_dir`; without either such a --out is refused)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=resume_help)
    group.add_argument("--overwrite", action="store_true", help=overwrite_help)


def _train_config(args: argparse.Namespace):
    """The TrainConfig of parsed `train` arguments (the checkpoint's with --resume; options
    that do not change results, e.g. --keep-checkpoints, may differ from it)."""
    from .train import TrainConfig
    from .train.run_dir import config_for_resume

    given = {dest: getattr(args, dest) for _, dest, _, _ in TRAIN_OPTIONS
             if getattr(args, dest) is not None}
    given.update(_given_task_fields(args))
    if args.model_arg:
        given["model"] = model_args(args.model_arg)
    common = dict(out_dir=args.out, progress=not args.no_progress)
    if not args.resume:
        return TrainConfig(**given, **common)
    return config_for_resume(TrainConfig, args.out, given, common)


def _run_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .train import Trainer

    try:
        cfg = _train_config(args)
        trainer = Trainer(cfg, resume=args.resume, context_parallel=args.context_parallel,
                          overwrite=args.overwrite)
    except ValueError as e:
        parser.error(str(e))
    metrics = trainer.train()
    if trainer.parallel is not None:  # torchrun: rank 0 has written everything
        trainer.parallel.close()
    trainer.close()
    if trainer.is_main:
        print(json.dumps(metrics))
        print(f"wrote {cfg.out_dir}/log.jsonl, metrics.json and checkpoints/")
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="train several attention types on one task",
                       description="Train one model per attention type (and seed, "
                       "--seeds) with the same options; write DIR/results.md, results.json "
                       "and error_vs_step.png over these seeds and every other seed's "
                       "finished run of the same options already in DIR.")
    _add_task_flag(p)
    for flag, dest, typ, help_ in TRAIN_OPTIONS:
        if dest != "attn":
            p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    _add_task_options(p)
    add_model_arg_flag(p)
    p.add_argument("--attns", nargs="+", default=["path", "rope"],
                   help="attention types to compare (default: path rope)")
    _add_seeds_flag(p, "one run per attention type and seed")
    p.add_argument("--out", required=True, help="output directory")
    _add_run_dir_flags(p, "reuse the finished runs in --out, continue the others from their "
                       "checkpoints", "replace the runs in --out")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.set_defaults(run=_run_compare)


def _add_seeds_flag(p: argparse.ArgumentParser, what: str) -> None:
    """--seeds S... of compare and layers (`pathattn.train.seeds`)."""
    p.add_argument("--seeds", nargs="+", type=int, default=None, metavar="S",
                   help=f"seeds to run, distinct non-negative ints: {what}; the runs of "
                   "--seed stay in the one-seed folders, the others get a -seed<S> suffix "
                   "(default: --seed alone)")


def _multi_run_base(args: argparse.Namespace, skip: tuple[str, ...]):
    """The base TrainConfig of compare / layers: the options given but `skip` (the fields
    the command varies itself), the task's, and --model-arg."""
    from .train import TrainConfig

    given = {dest: getattr(args, dest) for _, dest, _, _ in TRAIN_OPTIONS
             if dest not in skip and getattr(args, dest) is not None}
    given.update(_given_task_fields(args))
    if args.model_arg:
        given["model"] = model_args(args.model_arg)
    return TrainConfig(**given, attn=args.attns[0], out_dir=args.out,
                       progress=not args.no_progress)


def _run_compare(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .train.compare import compare, results_markdown

    try:
        base = _multi_run_base(args, ("attn",))
        report = compare(base, args.attns, args.out, seeds=args.seeds, resume=args.resume,
                         overwrite=args.overwrite)
    except ValueError as e:
        parser.error(str(e))
    print(results_markdown(report, base.task), end="")
    print(f"wrote {args.out}/results.md, results.json and error_vs_step.png")
    return 0


def _add_layers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layers", help="fewest layers that solve a task, per attention type",
                       description="For each attention type train depths 1, 2, ... (--depths) "
                       "with the same options and stop at the first whose score reaches "
                       "--threshold (word problems: val sequence accuracy), per seed with "
                       "--seeds. Writes DIR/layers.md and layers.json; finished runs in DIR "
                       "are reused.")
    _add_task_flag(p)
    for flag, dest, typ, help_ in TRAIN_OPTIONS:
        if dest not in ("attn", "layers"):
            p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    _add_task_options(p)
    add_model_arg_flag(p)
    p.add_argument("--attns", nargs="+", default=["path", "rope"],
                   help="attention types (default: path rope)")
    _add_seeds_flag(p, "one sweep per attention type and seed")
    p.add_argument("--depths", nargs="+", type=int, default=[1, 2, 3, 4],
                   help="depths to try, in increasing order (default 1 2 3 4)")
    p.add_argument("--threshold", type=float, default=0.9, help="solved score (0.9)")
    p.add_argument("--out", required=True, help="output directory")
    _add_run_dir_flags(p, "continue unfinished runs in --out from their checkpoints",
                       "replace the runs in --out, finished ones included")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.set_defaults(run=_run_layers)


def _run_layers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .train.sweep import fewest_layers, layers_markdown

    try:
        base = _multi_run_base(args, ("attn", "layers"))
        results = fewest_layers(base, args.attns, args.depths, args.out, args.threshold,
                                seeds=args.seeds, resume=args.resume,
                                overwrite=args.overwrite)
    except ValueError as e:
        parser.error(str(e))
    print(layers_markdown(results, base, args.threshold), end="")
    print(f"wrote {args.out}/layers.md and layers.json")
    return 0


def _add_text_commands(sub: argparse._SubParsersAction) -> None:
    """tokenizer, prepare and pretrain: language-model pretraining on text
    (`pathattn.data`, `pathattn.train.pretrain`)."""
    from .data import (
        add_prepare_arguments,
        add_tokenizer_arguments,
        run_prepare,
        run_tokenizer,
    )
    from .train.pretrain_cli import __doc__ as pretrain_doc
    from .train.pretrain_cli import add_pretrain_arguments, run_pretrain

    for name, help_, add, run in (
            ("tokenizer", "train a byte-level BPE tokenizer", add_tokenizer_arguments,
             run_tokenizer),
            ("prepare", "tokenize a corpus into memory-mapped token files",
             add_prepare_arguments, run_prepare),
            ("pretrain", "pretrain a language model on prepared text", add_pretrain_arguments,
             run_pretrain)):
        p = sub.add_parser(name, help=help_, description=pretrain_doc if name == "pretrain"
                           else help_, formatter_class=argparse.RawDescriptionHelpFormatter)
        add(p)
        p.set_defaults(run=run)


def _add_convert(sub: argparse._SubParsersAction) -> None:
    """convert: a pretrained RoPE model into PaTH by distillation (`pathattn.convert`)."""
    from .convert.cli import HELP, add_convert_arguments, run_convert
    from .convert.cli import __doc__ as convert_doc

    p = sub.add_parser("convert", help=HELP, description=convert_doc,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_convert_arguments(p)
    p.set_defaults(run=run_convert)


# `pathattn eval <name>`: name -> module with HELP, add_arguments(p) and run(args, parser)
EVAL_COMMANDS = {
    "ppl": "pathattn.evaluation.ppl_cli",
    "lm-eval": "pathattn.evaluation.lmeval_cli",
    "longctx": "pathattn.evaluation.longctx.cli",
}


def _add_eval_commands(sub: argparse._SubParsersAction) -> None:
    """eval ppl / lm-eval / longctx: language-model evaluation (`pathattn.evaluation`)."""
    import functools
    import importlib

    p = sub.add_parser("eval", help="evaluate language models (perplexity by position, "
                       "lm-evaluation-harness, long-context retrieval)")
    inner = p.add_subparsers(dest="eval_command", required=True)
    for name, module_name in EVAL_COMMANDS.items():
        module = importlib.import_module(module_name)
        q = inner.add_parser(name, help=module.HELP, description=module.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(q)
        # errors name the subcommand ("pathattn eval ppl: error: ...")
        q.set_defaults(run=functools.partial(_run_with_parser, module.run, q))


def _run_with_parser(run, parser: argparse.ArgumentParser, args: argparse.Namespace,
                     _top: argparse.ArgumentParser) -> int:
    return run(args, parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pathattn", description="PaTH attention tools")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data(sub)
    _add_train(sub)
    _add_compare(sub)
    _add_layers(sub)
    _add_text_commands(sub)
    _add_convert(sub)
    _add_eval_commands(sub)
    return parser


def _resume_command(argv: Sequence[str]) -> str:
    """The command line that continues an interrupted one: the same with --resume (and
    without --overwrite)."""
    args = [a for a in argv if a != "--overwrite"]
    return shlex.join(["pathattn", *args, *(["--resume"] * ("--resume" not in args))])


def _one_line_warnings(default_show, categories: tuple[type[Warning], ...]):
    """A `warnings.showwarning` that prints warnings of `categories` (a damaged checkpoint
    skipped, ...) as one line for the user, without the source line, and the rest as
    `default_show` does."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, categories):
            print(f"pathattn: warning: {message}", file=sys.stderr if file is None else file)
        else:
            default_show(message, category, filename, lineno, file, line)
    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A training stopped by a signal exits with 128 + its number after
    printing how to resume; a --out locked by another run exits with 1."""
    from .train.checkpoint import CheckpointWarning
    from .train.run_dir import RunDirBusy
    from .train.signals import TrainingInterrupted

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warnings(warnings.showwarning, (CheckpointWarning,))
        try:
            return args.run(args, parser)
        except RunDirBusy as e:
            print(f"pathattn {args.command}: error: {e}", file=sys.stderr)
            return 1
        except TrainingInterrupted as e:
            print(f"pathattn {args.command}: {e}\nresume with: {_resume_command(argv)}",
                  file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:  # a second Ctrl-C: no new checkpoint, the last one stands
            if args.command in ("data", "tokenizer", "prepare"):  # nothing to resume
                raise
            print(f"pathattn {args.command}: aborted; the checkpoints already written are "
                  f"intact, resume with: {_resume_command(argv)}", file=sys.stderr)
            return 130
