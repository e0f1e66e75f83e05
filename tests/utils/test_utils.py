"""`pathattn.utils`: the shared checks and precision helpers, and the rule that makes it the
floor of the package (it imports nothing else from pathattn)."""

from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import pathattn.utils
from pathattn.utils import DTYPES, autocast_context, is_int, is_real

FOLDER = Path(pathattn.utils.__file__).parent


@pytest.mark.parametrize("value, integer, real", [
    (3, True, True), (np.int64(3), True, True), (0, True, True),
    (True, False, False), (False, False, False), (2.0, False, True),
    (np.float32(0.5), False, True), (Fraction(1, 3), False, True), (float("nan"), False, True),
    ("3", False, False), (None, False, False), (torch.tensor(3), False, False),
], ids=["int", "numpy-int", "zero", "true", "false", "float", "numpy-float", "fraction",
        "nan", "str", "none", "tensor"])
def test_is_int_and_is_real_exclude_bools(value, integer, real):
    assert is_int(value) is integer and is_real(value) is real


def test_autocast_context_by_dtype_name():
    assert DTYPES == ("float32", "bfloat16")
    x = torch.ones(2, 2)
    with autocast_context("bfloat16", torch.device("cpu")):
        assert (x @ x).dtype == torch.bfloat16
    with autocast_context("float32", torch.device("cpu")):
        assert (x @ x).dtype == torch.float32


def _pathattn_imports(folder: Path) -> list[str]:
    """'file: module' for every import of a pathattn module outside pathattn.utils."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                inside = node.level == 1 or (node.level == 0 and (node.module or "").startswith(
                    "pathattn.utils"))
                outside = node.level > 1 or (node.level == 0 and (node.module or "").startswith(
                    "pathattn"))
                if outside and not inside:
                    found.append(f"{path.name}: {'.' * node.level}{node.module or ''}")
            elif isinstance(node, ast.Import):
                found += [f"{path.name}: {a.name}" for a in node.names
                          if a.name.startswith("pathattn") and
                          not a.name.startswith("pathattn.utils")]
    return found


def test_utils_imports_nothing_else_from_pathattn():
    assert _pathattn_imports(FOLDER) == []


def test_the_floor_check_sees_an_upward_import(tmp_path):
    (tmp_path / "a.py").write_text("from ..train import x\nimport pathattn.models\n"
                                   "from .io import y\nfrom pathattn.utils.io import z\n")
    assert _pathattn_imports(tmp_path) == ["a.py: ..train", "a.py: pathattn.models"]
