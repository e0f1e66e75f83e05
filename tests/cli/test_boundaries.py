"""The command line is one package: no module of `pathattn` outside `pathattn.cli` imports
argparse or `pathattn.cli` (read from the source with ast, nothing imported), but the
`python -m pathattn` entry (`pathattn.__main__`); and the checker flags such an import."""

from __future__ import annotations

import ast
from pathlib import Path

import pathattn

ROOT = Path(pathattn.__file__).parent
CLI = "pathattn.cli"
FORBIDDEN = ("argparse", CLI)
ENTRY_POINTS = ("pathattn.__main__",)  # `python -m pathattn`: calls pathattn.cli.main


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The modules an import statement may run: `import a.b` -> a.b; `from S import n` ->
    S and S.n (n may be a submodule); relative sources resolved against `package`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    source = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1])
        source = f"{base}.{source}" if source else base
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def forbidden_imports(module: str, source: str, is_package: bool = False) -> list[str]:
    """'module: imported' for each import of argparse or pathattn.cli in `source`, the
    text of `module` (at any depth, function bodies included)."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            hits = [m for m in _imported(node, package) if any(_under(m, f) for f in FORBIDDEN)]
            if hits:
                found.append(f"{module}: {min(hits, key=len)}")
    return found


def library_cli_imports(root: Path) -> list[str]:
    """`forbidden_imports` of every module under the package folder `root` outside its
    cli/ subpackage and ENTRY_POINTS."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        if not _under(module, f"{root.name}.cli") and module not in ENTRY_POINTS:
            found += forbidden_imports(module, path.read_text(), is_package)
    return found


def test_library_modules_hold_no_command_line():
    assert library_cli_imports(ROOT) == []


def test_the_checker_flags_argparse_and_cli_imports():
    assert forbidden_imports("pathattn.data.x", "import argparse\n") == \
        ["pathattn.data.x: argparse"]
    assert forbidden_imports("pathattn.data.x", "def f():\n    from argparse import A\n") == \
        ["pathattn.data.x: argparse"]
    assert forbidden_imports("pathattn.train.x", "from ..cli import model_args\n") == \
        ["pathattn.train.x: pathattn.cli"]
    assert forbidden_imports("pathattn", "from . import cli\n", is_package=True) == \
        ["pathattn: pathattn.cli"]
    assert forbidden_imports("pathattn.data.x", "import json\nfrom .corpus import cli\n") == []


def test_the_walk_skips_the_cli_package_only(tmp_path):
    files = {"pathattn/__init__.py": "", "pathattn/cli/__init__.py": "import argparse\n",
             "pathattn/__main__.py": "from .cli import main\n",
             "pathattn/cli/args.py": "import argparse\n",
             "pathattn/data/__init__.py": "",
             "pathattn/data/prepare.py": "import argparse\n",
             "pathattn/train/run.py": "from pathattn.cli.args import model_args\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert library_cli_imports(tmp_path / "pathattn") == [
        "pathattn.data.prepare: argparse", "pathattn.train.run: pathattn.cli.args"]
