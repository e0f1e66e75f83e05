"""`pathattn data | train | compare | layers`: the synthetic tasks (`pathattn.tasks`).

    pathattn data TASK --n N --out FILE.jsonl [--split S] [--seed S] [task options]
    pathattn train --task flipflop --attn path --layers 1 --heads 2 --dim 64 --out DIR
    pathattn compare --task flipflop --attns path rope [--seeds S...] --out DIR
    pathattn layers --task a5 --length K --attns path rope [--depths 1 2 3 4] --out DIR

data writes one `{"tokens": [...], "targets": [...]}` per line (targets[t]: the token the
model must output at position t, null where not scored). train trains one model
(`pathattn.train`; options left out take the `SyntheticConfig` defaults), compare one per
attention type (DIR/results.md, results.json, error_vs_step.png), layers finds per
attention type the fewest layers whose final score reaches --threshold
(`pathattn.train.sweep`). --seeds S...: one run per attention type and seed.

Every task option of the registered tasks is a flag (e.g. --length, --symbols).
--model-arg KEY=VALUE sets any `ModelConfig` field. --out is a run folder
(`pathattn.train.run_dir`): one that holds a run is refused unless --resume or
--overwrite; it is locked while written (a second command on it exits with 1). Under
`torchrun --nproc_per_node=P -m pathattn train ...` the run is data-parallel;
--context-parallel N shards each sequence over N ranks. Ctrl-C or SIGTERM checkpoints,
prints the resume command and exits with 130 / 143.
"""

from __future__ import annotations

import argparse
import json

from ..tasks import get_task, options_by_name, task_names, write_jsonl
from .args import (
    DTYPE_OPTION,
    add_context_parallel,
    add_model_arg_flag,
    add_options,
    add_run_folder_flags,
    flag,
    given_options,
    logging_options,
    model_args,
    optimizer_options,
)

# train options besides the task's (`_add_task_flag`, `_add_task_options`); dest ==
# SyntheticConfig field
TRAIN_OPTIONS = [
    ("--attn", "attn", str, "a registered attention type (pathattn.models.ATTN_TYPES): "
     "path, path_fox, rope, fox, sba, ... (default path)"),
    ("--layers", "layers", int, "number of blocks (default 1)"),
    ("--heads", "heads", int, "attention heads (default 2)"),
    ("--dim", "dim", int, "hidden size (default 64)"),
    ("--steps", "steps", int, "optimizer steps (default 2000)"),
    ("--batch-size", "batch_size", int, "sequences per step (default 16)"),
    *optimizer_options(weight_decay="0.1", warmup="100", min_lr_ratio="0.1"),
    ("--seed", "seed", int, "seed of the model init and the data (default 0)"),
    DTYPE_OPTION,
    *logging_options(
        every=500, eval_batches="batches per split per evaluation (default 4)",
        final_eval_batches="batches per split in the final evaluation, metrics.json "
        "(default 64)", keep_checkpoints="checkpoints kept on disk, the latest and older "
        "ones to fall back on (default 2)"),
]


def register(sub: argparse._SubParsersAction) -> None:
    _add_data(sub)
    _add_train(sub)
    _add_compare(sub)
    _add_layers(sub)


# --------------------------------------------------------------------------- task options

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
        p.add_argument(flag(name), dest=name, type=option.type, choices=option.choices,
                       default=None, help=_option_help(owners))


def _given_task_options(args: argparse.Namespace) -> dict:
    """The task options given on the command line, name -> value."""
    return {name: getattr(args, name) for name in options_by_name()
            if getattr(args, name) is not None}


def _add_task_flag(p: argparse.ArgumentParser) -> None:
    """--task of train, compare and layers."""
    names = task_names()
    p.add_argument("--task", dest="task", default=None,
                   help=f"{', '.join(names[:-1])} or {names[-1]} (default flipflop)")


def _given_task_fields(args: argparse.Namespace) -> dict:
    """The SyntheticConfig fields of the task flags given (task, task options)."""
    from ..train.synthetic import option_fields

    given = option_fields(_given_task_options(args))
    return given if args.task is None else {"task": args.task, **given}


def _add_training_flags(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """--task, the TRAIN_OPTIONS but `skip`, the task options and --model-arg."""
    _add_task_flag(p)
    add_options(p, TRAIN_OPTIONS, skip)
    _add_task_options(p)
    add_model_arg_flag(p)


def _given_fields(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    """The SyntheticConfig fields given: options but `skip`, task flags, --model-arg."""
    given = given_options(args, TRAIN_OPTIONS, skip)
    given.update(_given_task_fields(args))
    if args.model_arg:
        given["model"] = model_args(args.model_arg)
    return given


# --------------------------------------------------------------------------- data

def _split_tasks() -> list:
    """The specs of the tasks whose task object draws each of its splits (`--split`)."""
    return [spec for spec in map(get_task, task_names()) if spec.data_splits]


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="export synthetic-task sequences as JSONL",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=task_names())
    p.add_argument("--n", type=int, required=True, help="number of sequences")
    p.add_argument("--out", required=True, help="output .jsonl path")
    p.add_argument("--seed", type=int, default=0)
    specs = _split_tasks()
    p.add_argument("--split", choices=sorted({s for spec in specs for s in spec.splits}),
                   help=f"{', '.join(spec.name for spec in specs)} (default: train)")
    _add_task_options(p)
    p.set_defaults(run=_run_data)


def _check_options_apply(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """parser.error for a task option or --split given with a task that does not take it."""
    for name, owners in options_by_name().items():
        tasks = [spec.name for spec, _ in owners]
        if getattr(args, name) is not None and args.task not in tasks:
            parser.error(f"{flag(name)} applies to {', '.join(tasks)} only")
    if args.split is not None and not get_task(args.task).data_splits:
        parser.error(f"--split applies to {', '.join(s.name for s in _split_tasks())} only")


def _run_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_options_apply(args, parser)
    if args.n < 0:
        parser.error("--n must be >= 0")
    try:
        task = get_task(args.task).build(args.split or "train", _given_task_options(args),
                                         seed=args.seed)
    except ValueError as e:
        parser.error(str(e))
    written = write_jsonl(task, task.vocab, args.n, args.out)
    print(f"wrote {written} {args.task} sequences to {args.out}")
    return 0


# --------------------------------------------------------------------------- train

def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on a synthetic task",
                       description="Train a PaTHLM on a synthetic task (pathattn.train). "
                       "Writes DIR/log.jsonl, eval.jsonl, metrics.json, checkpoints/.")
    _add_training_flags(p)
    add_run_folder_flags(p, "run directory (out_dir)",
                         "continue from the checkpoint in --out with its stored config",
                         "replace the run in --out (its logs, metrics and checkpoints)")
    add_context_parallel(p, "under torchrun: ranks sharing each sequence (context "
                         "parallelism, PaTH layers only); data parallelism over the rest "
                         "(default 1)")
    p.set_defaults(run=_run_train)


def _train_config(args: argparse.Namespace):
    """The SyntheticConfig of parsed `train` arguments (the checkpoint's with --resume; options
    that do not change results, e.g. --keep-checkpoints, may differ from it)."""
    from ..train import SyntheticConfig
    from ..train.run_dir import config_for_resume

    given = _given_fields(args)
    common = dict(out_dir=args.out, progress=not args.no_progress)
    if not args.resume:
        return SyntheticConfig(**given, **common)
    return config_for_resume(SyntheticConfig, args.out, given, common)


def _run_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..train import Trainer

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


# --------------------------------------------------------------------------- compare, layers

def _add_multi_run_flags(p: argparse.ArgumentParser, attns: str, per_seed: str) -> None:
    """--attns and --seeds of compare and layers (`pathattn.train.seeds`)."""
    p.add_argument("--attns", nargs="+", default=["path", "rope"],
                   help=f"{attns} (default: path rope)")
    p.add_argument("--seeds", nargs="+", type=int, default=None, metavar="S",
                   help=f"seeds to run, distinct non-negative ints: {per_seed}; the runs of "
                   "--seed stay in the one-seed folders, the others get a -seed<S> suffix "
                   "(default: --seed alone)")


def _multi_run_base(args: argparse.Namespace, skip: tuple[str, ...]):
    """The base SyntheticConfig of compare / layers: the options given but `skip` (the fields
    the command varies itself), the task's, and --model-arg."""
    from ..train import SyntheticConfig

    return SyntheticConfig(**_given_fields(args, skip), attn=args.attns[0], out_dir=args.out,
                       progress=not args.no_progress)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="train several attention types on one task",
                       description="Train one model per attention type (and seed, "
                       "--seeds) with the same options; write DIR/results.md, results.json "
                       "and error_vs_step.png over these seeds and every other seed's "
                       "finished run of the same options already in DIR.")
    _add_training_flags(p, skip=("attn",))
    _add_multi_run_flags(p, "attention types to compare", "one run per attention type and seed")
    add_run_folder_flags(p, "output directory", "reuse the finished runs in --out, continue "
                         "the others from their checkpoints", "replace the runs in --out")
    p.set_defaults(run=_run_compare)


def _run_compare(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..train.compare import compare, results_markdown

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
    _add_training_flags(p, skip=("attn", "layers"))
    _add_multi_run_flags(p, "attention types", "one sweep per attention type and seed")
    p.add_argument("--depths", nargs="+", type=int, default=[1, 2, 3, 4],
                   help="depths to try, in increasing order (default 1 2 3 4)")
    p.add_argument("--threshold", type=float, default=0.9, help="solved score (0.9)")
    add_run_folder_flags(p, "output directory",
                         "continue unfinished runs in --out from their checkpoints",
                         "replace the runs in --out, finished ones included")
    p.set_defaults(run=_run_layers)


def _run_layers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..train.sweep import fewest_layers, layers_markdown

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
