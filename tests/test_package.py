"""Rules of the package's structure that a reader relies on, each with a test that shows
the check can fail:

- no module imports an underscore (private) name from a module of another folder;
- `pathattn.ops` has no import cycle;
- `ops/common` imports no op, `ops/sba` never imports `ops/path`, and `distributed`
  reaches the PaTH op only through its public context-parallel entry `ops.path.cp`;
- docstrings are contracts: at most 25 lines, module overviews at most 40 (the rationale
  lives in docs/).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pathattn
from tests._imports import cycles, forbidden, imports, private_imports

ROOT = Path(pathattn.__file__).parent

LAYER_RULES = {  # importer -> (sources it must not import, modules allowed among them)
    "pathattn.ops.common": (("pathattn.ops.path", "pathattn.ops.sba"), ()),
    "pathattn.ops.sba": (("pathattn.ops.path",), ()),
    "pathattn.distributed": (("pathattn.ops",), ("pathattn.ops.path.cp",)),
}


def _layer_violations(root: Path) -> list[str]:
    return [v for importer, (sources, allowed) in LAYER_RULES.items()
            for v in forbidden(root, importer, sources, allowed)]


def test_no_private_names_cross_folders():
    assert private_imports(ROOT) == []


def test_ops_has_no_import_cycle():
    assert cycles(imports(ROOT), "pathattn.ops") == []


def test_ops_layers():
    assert _layer_violations(ROOT) == []


DOC_LINES, MODULE_DOC_LINES = 25, 40


def _long_docstrings(root: Path) -> list[str]:
    """'file:name (lines)' for every docstring over its limit."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node, clean=False)
            limit = MODULE_DOC_LINES if node is tree else DOC_LINES
            if doc is not None and len(doc.splitlines()) > limit:
                name = "module" if node is tree else node.name
                found.append(f"{path.relative_to(root.parent)}:{name} "
                             f"({len(doc.splitlines())})")
    return found


def test_docstrings_are_short():
    assert _long_docstrings(ROOT) == []


def test_the_check_sees_a_long_docstring(tmp_path):
    doc = "\n".join(["line"] * 26)
    root = _tree(tmp_path, {"pathattn/a.py": f'"""{doc}"""\n\ndef f():\n    """{doc}"""\n'})
    assert _long_docstrings(root) == ["pathattn/a.py:f (26)"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p.parent for p in tmp_path.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return tmp_path / "pathattn"


def test_the_checks_see_a_private_import(tmp_path):
    root = _tree(tmp_path, {"pathattn/a/x.py": "from ..b.impl import _hidden\n",
                            "pathattn/a/y.py": "from .x import _near\n",
                            "pathattn/b/impl.py": "_hidden = 1\n"})
    assert private_imports(root) == ["pathattn.a.x: from pathattn.b.impl import _hidden"]


def test_the_checks_see_a_cycle(tmp_path):
    """A loop held together by an import inside a function is still a loop."""
    root = _tree(tmp_path, {
        "pathattn/ops/a.py": "from .b import f\n",
        "pathattn/ops/b.py": "def f():\n    from .c import g\n",
        "pathattn/ops/c.py": "from . import a\n"})
    assert cycles(imports(root), "pathattn.ops") == [
        ["pathattn.ops.a", "pathattn.ops.b", "pathattn.ops.c", "pathattn.ops.a"]]


@pytest.mark.parametrize("importer, text, found", [
    ("common/x.py", "from ..path.api import f\n", "pathattn.ops.common.x: pathattn.ops.path.api"),
    ("sba/x.py", "from ..path import f\n", "pathattn.ops.sba.x: pathattn.ops.path"),
    ("../distributed/x.py", "from ..ops.path.cp.shard import f\n",
     "pathattn.distributed.x: pathattn.ops.path.cp.shard"),
    ("../distributed/x.py", "from ..ops.path.function import f\n",
     "pathattn.distributed.x: pathattn.ops.path.function"),
], ids=["common-imports-path", "sba-imports-path", "distributed-cp-internals",
        "distributed-op-internals"])
def test_the_checks_see_a_layer_break(tmp_path, importer, text, found):
    root = _tree(tmp_path, {
        f"pathattn/ops/{importer}": text,
        "pathattn/ops/path/api.py": "", "pathattn/ops/path/function.py": "",
        "pathattn/ops/path/cp/shard.py": "",
        "pathattn/distributed/ok.py": "from ..ops.path.cp import Ring\n"})
    assert _layer_violations(root) == [found]
