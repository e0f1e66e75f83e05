"""`pathattn.train.seeds`: the seeds a multi-run command trains, their folders, and the
median / min / max over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathattn.train.seeds import check_seeds, seed_dir, seed_label, seeds_on_disk, spread


def test_check_seeds_default_and_order():
    assert check_seeds(None, 7) == [7]
    assert check_seeds((3, 0, 5), 7) == [3, 0, 5]  # given order kept


@pytest.mark.parametrize("seeds, message", [
    ([], "at least one seed"),
    ([0, -2], r"non-negative ints, got \[-2\]"),
    ([4, 1, 4], r"distinct, got \[4\] more than once"),
    ([False], "non-negative ints"),
    ([0.5], "non-negative ints"),
    ("12", "list of non-negative ints"),
    (3, "list of non-negative ints"),
], ids=["empty", "negative", "duplicate", "bool", "float", "str", "int"])
def test_check_seeds_rejects(seeds, message):
    with pytest.raises(ValueError, match=message):
        check_seeds(seeds, 0)


def test_seed_dir_keeps_the_one_seed_folder():
    assert seed_dir("out", "path", 0, 0) == Path("out/path")
    assert seed_dir("out", "path", 2, 0) == Path("out/path-seed2")
    assert seed_dir("out", "path-L3", 0, 4) == Path("out/path-L3-seed0")
    assert seed_label("path", 1, [1]) == "path"
    assert seed_label("path", 1, [0, 1]) == "path, seed 1"


@pytest.mark.parametrize("values, median, lo, hi", [
    ([0.3], 0.3, 0.3, 0.3),
    ([0.3, 0.1, 0.2], 0.2, 0.1, 0.3),
    ([0.4, 0.0, 0.1, 0.2], 0.15, 0.0, 0.4),
    ([2, None, 3], 3, 2, None),        # not solved ranks above every depth
    ([2, None], None, 2, None),        # the median falls between 2 and "not solved"
    ([None, None, 1], None, 1, None),
], ids=["one", "odd", "even", "none-odd", "none-even", "mostly-none"])
def test_spread(values, median, lo, hi):
    s = spread(dict(enumerate(values)))
    assert s["per_seed"] == dict(enumerate(values))
    assert s["median"] == (pytest.approx(median) if median is not None else None)
    assert (s["min"], s["max"]) == (lo, hi)


def test_seeds_on_disk_reads_seed_dir_folders(tmp_path):
    for name in ("path", "path-seed3", "path-seed03", "path-seedx", "path-L1-seed2",
                 "rope-seed5"):
        (tmp_path / name).mkdir()
    (tmp_path / "path-seed7").write_text("a file, not a run folder")
    assert seeds_on_disk(tmp_path, "path", 0) == [0, 3]
    assert seeds_on_disk(tmp_path, "path", 4) == [3, 4]  # out/path is the base seed's
    assert seeds_on_disk(tmp_path, "path-L1", 0) == [2]
    assert seeds_on_disk(tmp_path / "missing", "path", 0) == []
