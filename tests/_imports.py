"""The import graph of a package tree, read from its source (nothing is imported): what the
structure tests of `tests/test_package.py` check."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One imported name: `module` (the importer) takes `name` from `source`; `target` is
    the module the import runs (`source`, or its submodule `name`)."""

    module: str
    source: str
    name: str | None
    target: str


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under the package folder `root`."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports(root: Path) -> list[Import]:
    """Every import of the tree's own modules, at any depth (function bodies included)."""
    modules = module_names(root)
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [Import(module, a.name, None, a.name) for a in node.names
                          if a.name in modules]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, package)
                if source not in modules:
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    found.append(Import(module, source, alias.name,
                                        sub if sub in modules else source))
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    parts = parts[:len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def cycles(edges: list[Import], within: str) -> list[list[str]]:
    """Import cycles among the modules under `within` (each as its list of modules)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if _under(e.module, within) and _under(e.target, within) and e.module != e.target:
            graph.setdefault(e.module, set()).add(e.target)
    found, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def folder(module: str, modules: dict[str, Path]) -> str:
    """The package (folder) that holds `module`."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def private_imports(root: Path) -> list[str]:
    """'importer: from SOURCE import _name' for every underscore name taken from a module
    of another folder."""
    modules = module_names(root)
    return [f"{e.module}: from {e.source} import {e.name}" for e in imports(root)
            if e.name and e.name.startswith("_") and not e.name.startswith("__")
            and folder(e.source, modules) != folder(e.module, modules)]


def forbidden(root: Path, importer: str, sources: tuple[str, ...],
              allowed: tuple[str, ...] = ()) -> list[str]:
    """'importer: source' for every import by a module under `importer` of a module under
    one of `sources`, except the modules listed in `allowed` (taken as a whole)."""
    return [f"{e.module}: {e.target}" for e in imports(root)
            if _under(e.module, importer) and any(_under(e.target, s) for s in sources)
            and e.target not in allowed]
