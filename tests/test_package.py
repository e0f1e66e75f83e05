"""A rule of the package's structure that a reader relies on: no module imports an
underscore (private) name from another subpackage."""

from __future__ import annotations

import ast
from pathlib import Path

import pathattn

ROOT = Path(pathattn.__file__).parent


def _module_parts(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _private_imports() -> list[str]:
    """'file: from SOURCE import _name' for every underscore name imported from another
    subpackage (pathattn.X vs pathattn.Y)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = _module_parts(path)
        package = parts if path.name == "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                source = package[:len(package) - node.level + 1]
                source = source + (node.module.split(".") if node.module else [])
            else:
                source = (node.module or "").split(".")
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and source[:2] != parts[:2]:
                    found.append(f"{path.relative_to(ROOT.parent)}: from "
                                 f"{'.'.join(source)} import {alias.name}")
    return found


def test_no_private_names_cross_subpackages():
    assert _private_imports() == []


def test_the_check_sees_a_private_import(tmp_path, monkeypatch):
    """The rule above can fail: a module that imports another subpackage's private name."""
    fake = tmp_path / "pathattn"
    (fake / "a").mkdir(parents=True)
    (fake / "b").mkdir()
    (fake / "a" / "__init__.py").write_text("from ..b.impl import _hidden\n")
    (fake / "b" / "impl.py").write_text("_hidden = 1\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", fake)
    assert _private_imports() == ["pathattn/a/__init__.py: from pathattn.b.impl import _hidden"]
