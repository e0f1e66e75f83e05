"""The `pathattn` command line (also `python -m pathattn`): one subcommand per task, one
module per group of subcommands.

    pathattn data | train | compare | layers ...   synthetic tasks (`synthetic`)
    pathattn tokenizer ...                          a byte-level BPE tokenizer (`tokenizer`)
    pathattn prepare ...                            a corpus into token files (`prepare`)
    pathattn pretrain ...                           language-model pretraining (`pretrain`)
    pathattn convert ...                            a RoPE model into PaTH (`convert`)
    pathattn eval ppl | lm-eval | longctx ...       language-model evaluation (`eval`)

A group module has `register(sub)`, which adds its subparsers, each with the default
`run(args, parser) -> exit code`; flags several commands share live in `args`. Usage
errors exit with 2, a --out locked by another run with 1, a training stopped by SIGINT /
SIGTERM with 128 + the signal number after printing the command that resumes it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections.abc import Sequence

from . import convert, prepare, pretrain, synthetic, tokenizer
from . import eval as eval_commands

__all__ = ["main", "build_parser", "COMMAND_GROUPS"]

COMMAND_GROUPS = (synthetic, tokenizer, prepare, pretrain, convert, eval_commands)
NOTHING_TO_RESUME = ("data", "tokenizer", "prepare")  # a second Ctrl-C just stops them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pathattn", description="PaTH attention tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
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
    from ..train.checkpoint import CheckpointWarning
    from ..train.run_dir import RunDirBusy
    from ..train.signals import TrainingInterrupted

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
            if args.command in NOTHING_TO_RESUME:
                raise
            print(f"pathattn {args.command}: aborted; the checkpoints already written are "
                  f"intact, resume with: {_resume_command(argv)}", file=sys.stderr)
            return 130
