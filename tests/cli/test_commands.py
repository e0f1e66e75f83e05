"""Every command and subcommand of `pathattn` answers --help with exit status 0, the
console script and `python -m pathattn` reach `pathattn.cli.main`, and --help imports
none of the optional heavy packages (transformers, lm-eval, tokenizers)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pathattn.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list:
    """Every command path, e.g. ("eval", "ppl"), depth first, the parser's own first."""
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*prefix, name))
    return found


COMMANDS = _commands(build_parser())


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "pathattn" for c in COMMANDS])
def test_help_exits_0(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(('pathattn', *command))}")


def test_every_group_registers_commands():
    assert {"data", "train", "compare", "layers", "tokenizer", "prepare", "pretrain",
            "convert", "eval", "eval ppl", "eval lm-eval", "eval longctx"} <= \
        {" ".join(c) for c in COMMANDS}


def test_console_script_is_main():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "pathattn"]
    assert script.value == "pathattn.cli:main" and script.load() is main


def test_help_imports_no_optional_package():
    code = ("import sys, runpy\nsys.argv = ['pathattn', 'eval', 'lm-eval', '--help']\n"
            "try:\n    runpy.run_module('pathattn', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "print(sorted(m for m in ('transformers', 'lm_eval', 'tokenizers') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
