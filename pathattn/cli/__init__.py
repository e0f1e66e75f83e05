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
errors (and a training stopped by a non-finite value) exit with 2, a --out locked by
another process and failures of the machine (a full disk, memory) with 1, each with one
line on stderr; a training stopped by SIGINT / SIGTERM with 128 + the signal number after
printing the command that resumes it.
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


def _environment_error(command: str, error: BaseException, argv: Sequence[str]
                       ) -> str | None:
    """The one-line message of a failure of the machine rather than of the arguments (a
    full disk, a file that cannot be read or written, memory), or None for another
    error. Training commands add how to continue."""
    from ..utils.io import is_disk_full

    resume = "" if command in NOTHING_TO_RESUME else \
        f"; once fixed, continue with: {_resume_command(argv)} (or start over: --overwrite)"
    if is_disk_full(error):
        return (f"no space left (disk full, or over the file size limit) writing "
                f"{error.filename or 'a file'}: {error.strerror}; the files written before "
                f"are intact{resume}")
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror or error}"
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
            isinstance(error, RuntimeError) and "can't allocate memory" in str(error)):
        return (f"out of memory ({str(error).splitlines()[0][:200]}); use a smaller "
                f"--batch-size / --seq-len or a smaller model{resume}")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A training stopped by a signal exits with 128 + its number after
    printing how to resume; a --out locked by another process, a full disk or another
    failure of the machine exits with 1, a non-finite training with 2, each with one
    line on stderr."""
    from ..train.checkpoint import CheckpointWarning
    from ..train.divergence import NonFiniteTraining
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
        except NonFiniteTraining as e:
            print(f"pathattn {args.command}: error: {e}", file=sys.stderr)
            return 2
        except (OSError, MemoryError, RuntimeError) as e:
            message = _environment_error(args.command, e, argv)
            if message is None:
                raise
            print(f"pathattn {args.command}: error: {message}", file=sys.stderr)
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
