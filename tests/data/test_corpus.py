"""`pathattn.data.corpus`: the default corpus listing, input discovery (extensions, hidden
names, recursion, order, duplicates), reading of text and JSON Lines documents, the
sources' hashes, and the errors for bad inputs."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import pytest

from pathattn.data import CorpusReader, DataError, collect_sources, default_corpus_files
from pathattn.data.corpus import TEST_DIRS

from . import write_corpus, write_jsonl


def test_default_corpus_is_sorted_stdlib_code_without_tests_or_site_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = default_corpus_files()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert len(files) > 100 and rel == sorted(rel) and files == default_corpus_files()
    assert all(f.suffix == ".py" for f in files)
    dirs = {part for r in rel for part in r.split("/")[:-1]}
    assert not dirs & {"site-packages", "dist-packages", *TEST_DIRS}
    with_tests = default_corpus_files(include_tests=True)
    assert set(files) <= set(with_tests)


def test_folder_discovery_extensions_hidden_order_and_duplicates(tmp_path):
    folder = write_corpus(tmp_path / "corpus")
    explicit = folder / "b.md"
    sources = collect_sources([str(folder), str(explicit)])
    assert [s.kind for s in sources] == ["folder", "text"]
    names = [f.relative_to(folder).as_posix() for f in sources[0].files]
    assert names == ["a.txt", "b.md", "d.rst", "empty.txt", "records.jsonl", "sub/c.py"]
    assert sources[1].files == ()  # already read as part of the folder


def test_explicit_file_of_any_extension_is_one_text_document(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("line 1\nline 2\n")
    reader = CorpusReader(collect_sources([log]))
    assert list(reader.texts()) == ["line 1\nline 2\n"]
    [meta] = reader.sources_meta()
    assert meta["kind"] == "text" and meta["documents"] == 1
    assert meta["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()


def test_jsonl_records_are_documents_with_the_file_hash(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", ["one", "two", ""], field="content")
    with open(path, "a") as f:
        f.write("\n")  # blank lines are skipped
    reader = CorpusReader(collect_sources([path]), text_field="content")
    assert list(reader.texts()) == ["one", "two", ""]
    [meta] = reader.sources_meta()
    assert meta["kind"] == "jsonl" and meta["documents"] == 3
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_folder_hash_covers_names_and_contents(tmp_path):
    folder = write_corpus(tmp_path / "corpus")

    def folder_hash() -> str:
        reader = CorpusReader(collect_sources([folder]))
        list(reader.texts())
        return reader.sources_meta()[0]["sha256"]

    before = folder_hash()
    assert folder_hash() == before
    (folder / "a.txt").write_text("changed")
    changed = folder_hash()
    (folder / "a.txt").rename(folder / "z.txt")
    assert len({before, changed, folder_hash()}) == 3


@pytest.mark.parametrize("case,match", [
    ("missing", "no such file"),
    ("empty-folder", "empty corpus"),
    ("single-string", "list of paths"),
], ids=lambda v: str(v))
def test_collect_sources_errors(tmp_path, case, match):
    inputs = {"missing": [tmp_path / "nope.txt"], "empty-folder": [tmp_path],
              "single-string": str(tmp_path)}[case]
    with pytest.raises(DataError, match=match):
        collect_sources(inputs)


@pytest.mark.parametrize("line,match", [
    ('{"body": "x"}', "no 'text' field"),
    ('{"text": 3}', "must be a string"),
    ('["text"]', "no 'text' field"),
    ("{not json", "not a JSON line"),
], ids=["no-text-field", "text-not-a-string", "not-an-object", "bad-json"])
def test_bad_jsonl_line_names_file_and_line(tmp_path, line, match):
    path = tmp_path / "r.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(DataError, match=match) as e:
        list(CorpusReader(collect_sources([path])).texts())
    assert f"{path}:2" in str(e.value)


def test_non_utf8_text_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8") as e:
        list(CorpusReader(collect_sources([path])).texts())
    assert str(path) in str(e.value)


def test_parquet_without_pyarrow_names_the_package(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed")
    except ImportError:
        pass
    path = tmp_path / "part-0.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(DataError, match="pyarrow"):
        collect_sources([path])
