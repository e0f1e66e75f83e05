"""`pathattn eval ppl | lm-eval | longctx`: language-model evaluation
(`pathattn.evaluation`).

    pathattn eval ppl --model DIR [DIR ...] --data DIR [--lengths L ...]    perplexity by length
    pathattn eval lm-eval --model DIR --tasks T ...                         lm-evaluation-harness
    pathattn eval longctx --model DIR --task niah --lengths L ...           long-context accuracy

Each subcommand is one module here with NAME, HELP, `add_arguments(p)` and
`run(args, parser)`; its usage errors name it ("pathattn eval ppl: error: ...").
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from . import lmeval, longctx, ppl

COMMANDS = (ppl, lmeval, longctx)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate language models (perplexity by position, "
                       "lm-evaluation-harness, long-context retrieval)")
    inner = p.add_subparsers(dest="eval_command", required=True)
    for command in COMMANDS:
        q = inner.add_parser(command.NAME, help=command.HELP, description=command.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(q)
        q.set_defaults(run=functools.partial(_run_with_parser, command.run, q))


def _run_with_parser(run, parser: argparse.ArgumentParser, args: argparse.Namespace,
                     _top: argparse.ArgumentParser) -> int:
    """`run(args, parser)` with the subcommand's own parser instead of the top one."""
    return run(args, parser)


def load_model(folder: str, device: str | None):
    """(model in eval mode on `device`, tokenizer) of a Hugging Face model folder; device
    None: cuda when available, else cpu (`resolve_device`: ValueError naming --device for
    a CUDA device without CUDA). ValueError naming --model when the folder holds
    no config.json or no usable tokenizer (`pathattn.data.identity.model_tokenizer`:
    also one that is not the tokenizer its export recorded), cannot be loaded, or holds
    weights that are not finite (a diverged training)."""
    from transformers import AutoModelForCausalLM

    from ...data.identity import model_tokenizer
    from ...train.divergence import non_finite_parameters
    from ...utils.device import resolve_device

    device = resolve_device(device)  # ValueError naming --device (no CUDA, a bad name)
    tokenizer, _ = model_tokenizer(folder, "--model")  # a DataError is a ValueError
    if not (Path(folder) / "config.json").is_file():
        raise ValueError(f"--model: {folder} has no config.json (a folder written by "
                         "save_pretrained, e.g. the hf folder of a `pathattn pretrain` run)")
    # pathattn's models resolve: importing pathattn registers them with the Auto classes
    try:
        model = AutoModelForCausalLM.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model: cannot load {folder} with AutoModelForCausalLM "
                         f"({str(e).splitlines()[0]})") from None
    bad = non_finite_parameters(model.state_dict().items())
    if bad:
        raise ValueError(f"--model: {folder} holds weights that are not finite ({bad[0]}"
                         f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}): a "
                         "diverged training; evaluate a finite checkpoint")
    return model.to(device).eval(), tokenizer
