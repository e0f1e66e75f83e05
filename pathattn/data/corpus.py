"""Corpora: which paths are documents, how they are read, and the default offline corpus.

Documents (our choices):
- one text file = one document, its bytes decoded as UTF-8 (strict: a file that is not
  UTF-8 is an error naming it, rather than silently altered text);
- one JSON Lines record = one document: the string in its `text_field` ("text"); blank lines
  are skipped, a line that is not a JSON object with a string `text_field` is an error
  naming the file and line;
- one parquet row = one document (column `text_field`); reading parquet needs `pyarrow`,
  and without it any parquet input is refused up front with an error naming the package.

Inputs (`collect_sources`): a file given explicitly is read whatever its extension
(`.jsonl` / `.parquet` as records, anything else as text); a folder is searched
recursively for `TEXT_EXTENSIONS` and `RECORD_EXTENSIONS`, skipping hidden names (".git",
".cache", ...), symlinked folders and anything but regular files, in sorted relative-path
order. An input that is neither a regular file nor a folder (/dev/zero, a FIFO) is refused:
reading it would never end or would block. A file reached twice
(given twice, or also inside a given folder) is read once, at its first occurrence. A
missing path, or inputs that hold no file at all, raise `DataError`.

Default corpus (`default_corpus_files`): the `*.py` files of the running Python's standard
library (`sysconfig.get_paths()["stdlib"]`), real code under the PSF licence that every
machine has offline. Excluded: `site-packages` / `dist-packages` (third-party code, varies
per machine) and, by default, the test folders (`test`, `tests`, `idle_test`): Debian and
Ubuntu ship them in a separate package (so including them would make the corpus depend on
the distribution's packaging, not only on the Python version), they hold deliberately
malformed files (non-UTF-8 sources, bad syntax) and mostly repetitive boilerplate. CPython
3.11: 734 files, 12 MB (with the tests 1790 files, 32 MB). The corpus differs between
Python versions, so its source record holds the version and a sha256 over the file list and
contents (`sources_meta`).

Hashes: every source's record holds a sha256: a file's is that of its bytes; a folder's
(and the default corpus's) is the sha256 of the lines "<relative path>\\0<file sha256>\\n"
of its files in order, so it changes with any renamed, added, removed or edited file.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DataError", "Source", "CorpusReader", "collect_sources", "default_corpus_files",
           "default_corpus_source", "read_text_file", "TEXT_EXTENSIONS", "RECORD_EXTENSIONS",
           "TEST_DIRS"]

TEXT_EXTENSIONS = (".txt", ".md", ".py", ".rst")
RECORD_EXTENSIONS = (".jsonl", ".parquet")
TEST_DIRS = ("test", "tests", "idle_test")
THIRD_PARTY_DIRS = ("site-packages", "dist-packages")


class DataError(ValueError):
    """Bad corpus, tokenizer or dataset input; the message names the path or argument."""


@dataclass(frozen=True)
class Source:
    """One input of a corpus.

    name: the input as given (or "<python-stdlib>"); root: its absolute path; kind: "text"
    (one file, one document), "jsonl" / "parquet" (one file of records), "folder" or
    "python-stdlib" (several files, each read by its own kind); files: the absolute paths
    read, in order.
    """

    name: str
    root: Path
    kind: str
    files: tuple[Path, ...]


def file_kind(path: Path) -> str:
    """"jsonl", "parquet" or "text", from the file name."""
    suffix = path.suffix.lower()
    return suffix[1:] if suffix in RECORD_EXTENSIONS else "text"


# ----------------------------------------------------------------------- discovery

def _walk(folder: Path, extensions: Sequence[str], skip_dirs: Sequence[str] = ()) -> list[Path]:
    """Files under `folder` whose suffix is in `extensions`, sorted by relative path; hidden
    names, symlinked folders and `skip_dirs` names are skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in skip_dirs]
        for name in filenames:
            path = Path(dirpath, name)  # regular files only: a FIFO or device blocks
            if not name.startswith(".") and path.suffix.lower() in extensions and \
                    path.is_file():
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def default_corpus_files(include_tests: bool = False) -> list[Path]:
    """The `*.py` files of this Python's standard library, sorted by path relative to it
    (module docstring): without site-packages / dist-packages and, unless `include_tests`,
    without test folders."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise DataError(f"default corpus: the standard library folder {root} does not exist")
    skip = THIRD_PARTY_DIRS + (() if include_tests else TEST_DIRS)
    return _walk(root, (".py",), skip)


def default_corpus_source(include_tests: bool = False) -> Source:
    """The default corpus as a `Source` of kind "python-stdlib"."""
    files = default_corpus_files(include_tests)
    if not files:
        raise DataError("default corpus: no *.py file in the standard library folder")
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return Source("<python-stdlib>", root, "python-stdlib", tuple(f.resolve() for f in files))


def _special_kind(path: Path) -> str:
    """What a path that is neither a regular file nor a folder is, for messages."""
    import stat

    mode = path.stat().st_mode
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _has_pyarrow() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def collect_sources(inputs: Sequence[str | os.PathLike] | None) -> list[Source]:
    """The sources of `inputs` (files and folders, module docstring); None or an empty list
    means the default corpus. Raises DataError for a missing path, a corpus without files,
    or parquet input without pyarrow."""
    if not inputs:
        return [default_corpus_source()]
    if isinstance(inputs, (str, os.PathLike)):
        raise DataError(f"inputs must be a list of paths, got the single path {inputs!r}")
    seen: set[Path] = set()
    sources = []
    for given in inputs:
        path = Path(given)
        if not path.exists():
            raise DataError(f"input {str(given)!r}: no such file or folder")
        root = path.resolve()
        if root.is_dir():
            kind, files = "folder", _walk(root, TEXT_EXTENSIONS + RECORD_EXTENSIONS)
        elif root.is_file():
            kind, files = file_kind(root), [root]
        else:  # reading a device or a FIFO would never end, or block
            raise DataError(f"input {str(given)!r}: not a regular file or a folder (a "
                            f"{_special_kind(root)}); give text files or folders")
        files = [f for f in files if f not in seen]
        seen.update(files)
        sources.append(Source(str(given), root, kind, tuple(files)))
    if not any(s.files for s in sources):
        raise DataError(f"empty corpus: inputs {[s.name for s in sources]} hold no file "
                        f"(folders are searched for {TEXT_EXTENSIONS + RECORD_EXTENSIONS})")
    parquet = [f for s in sources for f in s.files if file_kind(f) == "parquet"]
    if parquet and not _has_pyarrow():
        raise DataError(f"input {str(parquet[0])!r}: reading parquet needs the 'pyarrow' "
                        "package (pip install pyarrow), which is not installed")
    return sources


# ------------------------------------------------------------------------- reading

def read_text_file(path: str | os.PathLike) -> tuple[str, str]:
    """(text, sha256 hex of the bytes) of a UTF-8 text file; DataError when not UTF-8."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return text, hashlib.sha256(data).hexdigest()


def _jsonl_texts(path: Path, field: str, hasher) -> Iterator[str]:
    """The `field` strings of a JSON Lines file; `hasher` gets every byte read."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            hasher.update(raw)
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{path}:{lineno}: not a JSON line ({e})") from None
            if not isinstance(record, dict) or field not in record:
                raise DataError(f"{path}:{lineno}: the record has no {field!r} field")
            if not isinstance(record[field], str):
                raise DataError(f"{path}:{lineno}: {field!r} must be a string, got "
                                f"{type(record[field]).__name__}")
            yield record[field]


def _parquet_texts(path: Path, field: str, hasher) -> Iterator[str]:
    """The `field` strings of a parquet file, row by row (needs pyarrow)."""
    import pyarrow.parquet as pq

    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            hasher.update(block)
    table = pq.ParquetFile(path)
    if field not in table.schema_arrow.names:
        raise DataError(f"{path}: no {field!r} column (columns: {table.schema_arrow.names})")
    row = 0
    for batch in table.iter_batches(columns=[field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            row += 1
            if not isinstance(text, str):
                raise DataError(f"{path}: row {row}: {field!r} must be a string, got "
                                f"{type(text).__name__}")
            yield text


class CorpusReader:
    """The documents of `sources`, in order, and their sources' hashes.

    `tasks()` yields (source index, payload) per document: payload is the Path of a text
    file (read by whoever tokenizes it, with `read_text_file`, which also returns its
    sha256: hand it back with `add_file_hash`) or the text of a record. `texts()` yields
    the texts themselves, reading the files here. After a complete pass `sources_meta()`
    gives each source's record for meta.json.
    """

    def __init__(self, sources: Sequence[Source], text_field: str = "text"):
        if not isinstance(text_field, str) or not text_field:
            raise DataError(f"text_field must be a non-empty string, got {text_field!r}")
        self.sources = list(sources)
        self.text_field = text_field
        self._file_hashes: list[list[tuple[str, str]]] = [[] for _ in self.sources]
        self._documents = [0] * len(self.sources)

    @property
    def num_files(self) -> int:
        return sum(len(s.files) for s in self.sources)

    @property
    def only_text_files(self) -> bool:
        """Every document is a text file (so the number of documents is known up front)."""
        return all(file_kind(f) == "text" for s in self.sources for f in s.files)

    def tasks(self) -> Iterator[tuple[int, Path | str]]:
        for i, source in enumerate(self.sources):
            for path in source.files:
                kind = file_kind(path)
                if kind == "text":
                    yield i, path
                    continue
                hasher = hashlib.sha256()
                read = _jsonl_texts if kind == "jsonl" else _parquet_texts
                yield from ((i, text) for text in read(path, self.text_field, hasher))
                self._add(i, path, hasher.hexdigest())

    def add_file_hash(self, source_index: int, path: Path, sha256: str) -> None:
        """Record the hash of a text file read for a task of `tasks()`."""
        self._add(source_index, path, sha256)

    def count_document(self, source_index: int) -> None:
        self._documents[source_index] += 1

    def texts(self) -> Iterator[str]:
        for i, payload in self.tasks():
            if isinstance(payload, Path):
                text, sha = read_text_file(payload)
                self.add_file_hash(i, payload, sha)
                payload = text
            self.count_document(i)
            yield payload

    def _add(self, i: int, path: Path, sha256: str) -> None:
        root = self.sources[i].root
        rel = path.relative_to(root).as_posix() if path != root else path.name
        self._file_hashes[i].append((rel, sha256))

    def sources_meta(self) -> list[dict]:
        """Per source: name, path, kind, files, documents, sha256 (module docstring); the
        default corpus also has python (version) and implementation."""
        out = []
        for source, hashes, docs in zip(self.sources, self._file_hashes, self._documents,
                                        strict=True):
            hashes = sorted(hashes)  # record files and text files are hashed by different
            # threads when tokenizing in parallel; files are in sorted order anyway
            if source.kind in ("folder", "python-stdlib"):
                lines = "".join(f"{rel}\0{sha}\n" for rel, sha in hashes)
                sha = hashlib.sha256(lines.encode()).hexdigest()
            else:
                sha = hashes[0][1] if hashes else None
            record = dict(name=source.name, path=str(source.root), kind=source.kind,
                          files=len(hashes), documents=docs, sha256=sha)
            if source.kind == "python-stdlib":
                record.update(python=platform.python_version(),
                              implementation=platform.python_implementation())
            out.append(record)
        return out
