"""Output folders of `pathattn tokenizer` and `pathattn prepare`: the --out guard and
atomic streaming writes.

Guard (our choice, as for run folders in `pathattn.train.run_dir`): an --out that exists
and is not empty is refused unless overwrite=True. Overwriting replaces the command's own
files (`names`) only and never deletes anything else in the folder, so a mistyped --out
cannot empty an unrelated directory; the old files stay in place until the new ones are
complete (a failed or interrupted command leaves the previous output as it was).

Atomic files: each file is written to a temp name `.<name>.<8 hex>.tmp` next to it, then
fsynced and `os.replace`d (the naming of `pathattn.train.checkpoint`); --overwrite clears
such leftovers of a killed process. (`pathattn.train` imports this package, so the helpers
are not imported from there.)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from .corpus import DataError

__all__ = ["prepare_out_dir", "AtomicFile", "write_json", "temp_dir", "package_versions"]


def prepare_out_dir(out: str | os.PathLike, names: Sequence[str], overwrite: bool,
                    temp_names: Sequence[str] = ()) -> Path:
    """Create `out` if needed and return it. Raises DataError when it is a file, or a
    non-empty folder and not `overwrite`; with `overwrite`, temp leftovers of `names` and
    `temp_names` are removed (the files themselves are replaced later, by the caller)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"out: {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise DataError(f"out: {out} is not empty; pass overwrite=True (--overwrite) to "
                            f"replace its {', '.join(names)}")
        _remove_temp_files(out, (*names, *temp_names))
    out.mkdir(parents=True, exist_ok=True)
    return out


_TEMP_RE = re.compile(r"\.(.+)\.[0-9a-f]{8}\.tmp")


def _remove_temp_files(folder: Path, names: Sequence[str]) -> None:
    """Delete the temp files and folders of `names` (`AtomicFile` / `temp_dir` pattern)
    left in `folder`."""
    for path in folder.iterdir():
        m = _TEMP_RE.fullmatch(path.name)
        if m is None or m.group(1) not in names:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


class AtomicFile:
    """A binary file written under a temp name next to `path`; `commit()` fsyncs and moves
    it to `path`, `discard()` deletes it (both idempotent). Use as a context manager:
    leaving the block by an exception discards."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        while True:
            self.tmp = self.path.parent / f".{self.path.name}.{secrets.token_hex(4)}.tmp"
            try:  # mode 0666 through the umask, like any other file the command writes
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileExistsError:
                continue
        self.file = os.fdopen(fd, "wb")
        self.done = False

    def write(self, data) -> None:
        self.file.write(data)

    def commit(self) -> None:
        if self.done:
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        self.done = True

    def discard(self) -> None:
        if self.done:
            return
        self.file.close()
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        self.done = True

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()


def write_json(path: Path, obj) -> None:
    """Atomic write of `obj` as indented JSON."""
    with AtomicFile(path) as f:
        f.write((json.dumps(obj, indent=2) + "\n").encode())
        f.commit()


def temp_dir(out: Path, name: str) -> Path:
    """A new folder `.<name>.<8 hex>.tmp` in `out` (removed by --overwrite if left)."""
    while True:
        path = out / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def package_versions(*names: str) -> dict[str, str | None]:
    """{name: installed version or None} (recorded next to outputs whose content depends on
    them, e.g. tokenizers' BPE training)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
