"""Durable file output: every file and folder pathattn writes goes through this module.

A file is written to a temp file next to it, `.<name>.<8 hex>.tmp` (created with mode
0666 & ~umask, the permissions of any new file), fsynced and closed, moved over the target
with `os.replace` (atomic within one folder), and then the folder is fsynced so that the
rename itself is on disk. A reader sees the old file or the new one, never a part of one;
an exception deletes the temp file and leaves the target as it was; a process killed in
between leaves at most the temp file, which `remove_temp_files` deletes.

A folder written as a whole (`atomic_dir`) is filled under a temp name next to it, every
file and folder in it fsynced, then renamed over the target. `os.replace` cannot replace a
non-empty folder, so an existing target is first renamed aside (under a temp name) and
deleted once the new one is in place: a kill between the two renames leaves no target, and
the complete old and new folders under temp names.

Forms, for the ways writers produce their bytes:

    atomic_write_bytes / _text / _json / _jsonl   content given at once (or as records)
    AtomicFile, atomic_open                       a stream, for large or incremental files
    atomic_path                                   a temp path, for writers that take a path
                                                  (torch.save, savefig, safetensors)
    atomic_dir                                    a temp folder (save_pretrained)
    move_into_place                               a finished file or folder moved durably

JSON: `json.dumps` with the caller's arguments plus a final newline, strict (RFC 8259):
a NaN or an infinity is refused with a ValueError naming the file, never written as the
non-standard NaN / Infinity; a caller that may meet one says what to write instead
(`finite_or_none`). Text: encoded as given, no newline translation. Logs are appended
line by line (`append_text`). Symlinks are replaced, never followed: a file written over a
symlink replaces the link, an appended file or a working folder (`real_dir`) found as a
symlink is replaced by a new one, and the target is left as it was.

The file-system calls of the write path (`_open`, `_write`, `_fsync`, `_close`, `_replace`,
`_unlink`) are module attributes looked up at call time, so that tests can make any one of
them fail or stop there.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json",
           "atomic_write_jsonl", "AtomicFile", "atomic_open", "atomic_path", "atomic_dir",
           "move_into_place", "temp_dir", "remove_temp_files", "remove_file", "fsync_dir",
           "fsync_tree", "temp_name_target", "append_text", "real_dir", "writable_dir",
           "finite_or_none", "is_disk_full", "DISK_FULL_ERRNOS"]

_open, _write, _fsync, _close, _replace, _unlink = (os.open, os.write, os.fsync, os.close,
                                                    os.replace, os.unlink)

# `.<name>.<8 chars>.tmp`: ours (8 hex digits) and tempfile.mkstemp's (8 of [a-z0-9_])
_TEMP_RE = re.compile(r"\.(.+)\.[A-Za-z0-9_]{8}\.tmp")
# a full disk, a full quota, or a file over the size limit (`ulimit -f`)
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is an OSError of a full disk (`DISK_FULL_ERRNOS`)."""
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


# ------------------------------------------------------------------------ syncing

def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder, so that the names created, renamed or deleted in it are on disk. A
    platform without folder descriptors (or a file system refusing it) is skipped."""
    try:
        fd = _open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        _fsync(fd)
    except OSError:
        pass
    finally:
        _close(fd)


def _fsync_file(path: Path) -> None:
    fd = _open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        _close(fd)


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file under folder `path` (symlinks not followed), then every folder,
    deepest first, `path` last."""
    path = Path(path)
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                _fsync_file(Path(root, name))
        fsync_dir(root)


# ------------------------------------------------------------------ temp names

def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temp file next to `path`, opened for writing; O_EXCL makes the random
    name ours alone."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def _discard(tmp: Path) -> None:
    """Delete a temp file or folder of ours, if it is still there."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        _unlink(tmp)
    except FileNotFoundError:
        pass


def temp_dir(parent: str | os.PathLike, name: str) -> Path:
    """A new, empty folder `.<name>.<8 hex>.tmp` in `parent` (a working folder; the caller
    deletes it, `remove_temp_files` deletes a leftover)."""
    parent = Path(parent)
    while True:
        path = parent / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def temp_name_target(name: str) -> str | None:
    """The target name of a temp name `.<target>.<8 chars>.tmp`, else None."""
    m = _TEMP_RE.fullmatch(name)
    return None if m is None else m.group(1)


def remove_temp_files(folder: str | os.PathLike,
                      names: Iterable[str] | Callable[[str], bool]) -> list[str]:
    """Delete the temp files and folders that interrupted writes left in `folder`: those
    whose target name is in `names` (or for which names(target) is true). Returns the
    names deleted, sorted; a missing folder has none. Only names of the temp form are
    touched."""
    folder = Path(folder)
    wanted = names if callable(names) else set(names).__contains__
    try:
        entries = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    removed = []
    for name in entries:
        m = _TEMP_RE.fullmatch(name)
        if m is not None and wanted(m.group(1)):
            _discard(folder / name)
            removed.append(name)
    return removed


def remove_file(path: str | os.PathLike) -> bool:
    """Delete the file (or symlink) `path`; False when it was already missing."""
    try:
        _unlink(path)
    except FileNotFoundError:
        return False
    return True


# ------------------------------------------------------------ whole contents

def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically and durably (module docstring); returns `path`.
    The folder must exist. On an exception the temp file is deleted and `path` keeps its
    previous content."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[_write(fd, view):]
            _fsync(fd)
        finally:
            _close(fd)
        _replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """`atomic_write_bytes` of text.encode(encoding) (no newline translation)."""
    return atomic_write_bytes(path, text.encode(encoding))


def _strict_dumps(path, obj: Any, options: dict) -> str:
    """json.dumps(obj, **options) refusing NaN and infinities (ValueError naming `path`)."""
    if options.get("allow_nan", False):
        raise ValueError(f"{path}: JSON is written strict (allow_nan=False); replace "
                         "non-finite numbers first (finite_or_none)")
    try:
        return json.dumps(obj, **{**options, "allow_nan": False})
    except ValueError as e:
        raise ValueError(f"{path}: not written: strict JSON has no NaN or infinity ({e})"
                         ) from None


def finite_or_none(obj: Any) -> Any:
    """`obj` with every float NaN / infinity (in dicts, lists and tuples) replaced by None,
    which JSON writes as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_none(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any, **dumps_options) -> Path:
    """`atomic_write_text` of json.dumps(obj, **dumps_options) + "\\n" (the caller's
    formatting: indent, ensure_ascii, default, ...), strict: ValueError naming `path` for a
    NaN or infinity (module docstring), before anything is written."""
    return atomic_write_text(path, _strict_dumps(path, obj, dumps_options) + "\n")


def atomic_write_jsonl(path: str | os.PathLike, records: Iterable[Any],
                       **dumps_options) -> int:
    """Write one json.dumps(record, **dumps_options) per line, streamed (`atomic_open`,
    UTF-8), strict as `atomic_write_json`; returns the number of records."""
    count = 0
    with atomic_open(path, "w") as f:
        for record in records:
            f.write(_strict_dumps(path, record, dumps_options) + "\n")
            count += 1
    return count


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append `text` (UTF-8) to the file `path`, created when missing (0666 & ~umask); a
    symlink in its place is replaced by a new file, never followed. Flushed, not fsynced:
    a log line lost in a crash is one that a resume cuts anyway."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = _open(path, flags, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        _unlink(path)
        fd = _open(path, flags, 0o666)
    try:
        view = memoryview(text.encode("utf-8"))
        while view:
            view = view[_write(fd, view):]
    finally:
        _close(fd)


# ------------------------------------------------------------------- streams

class AtomicFile:
    """A file written under a temp name next to `path`: `write` as to any file, then
    `commit()` flushes, fsyncs and moves it over `path` (and fsyncs the folder), or
    `discard()` deletes it. Both are idempotent and the first one decides. As a context
    manager, leaving the block by an exception discards (commit stays explicit, so that
    several files can be committed together).

    Args:
        path: the target; its folder must exist.
        mode: "wb" (bytes) or "w" (text, no newline translation).
        encoding: the text encoding of mode "w" (default UTF-8).
    """

    def __init__(self, path: str | os.PathLike, mode: str = "wb", encoding: str | None = None):
        if mode not in ("wb", "w"):
            raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
        if mode == "wb" and encoding is not None:
            raise ValueError("encoding is for text mode 'w' only")
        self.path = Path(path)
        self.fd, self.tmp = _create_temp(self.path)
        try:
            self.file: IO = open(self.fd, mode, closefd=False,
                                 **({"encoding": encoding or "utf-8", "newline": ""}
                                    if mode == "w" else {}))
        except BaseException:
            _close(self.fd)
            _discard(self.tmp)
            raise
        self.done = False

    def write(self, data) -> int:
        return self.file.write(data)

    def commit(self) -> Path:
        if self.done:
            return self.path
        self.done = True
        try:
            try:
                self.file.flush()
                _fsync(self.fd)
            finally:
                try:
                    self.file.close()
                finally:
                    _close(self.fd)
            _replace(self.tmp, self.path)
        except BaseException:
            _discard(self.tmp)
            raise
        fsync_dir(self.path.parent)
        return self.path

    def discard(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.file.close()
        except OSError:
            pass
        finally:
            _close(self.fd)
            _discard(self.tmp)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb",
                encoding: str | None = None) -> Iterator[IO]:
    """A file object to write `path` through (`AtomicFile`): committed when the block ends,
    discarded when it raises."""
    f = AtomicFile(path, mode, encoding)
    try:
        yield f.file
    except BaseException:
        f.discard()
        raise
    f.commit()


# -------------------------------------------------------- paths and folders

@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temp path next to `path` (an empty file) for a writer that takes a path; when the
    block ends the file there is fsynced and moved over `path`, when it raises it is
    deleted. The temp name ends in `.tmp`: pass the format to writers that guess it from
    the suffix (savefig(tmp, format="png"))."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    _close(fd)
    try:
        yield tmp
        _fsync_file(tmp)
        _replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
    fsync_dir(path.parent)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """A new temp folder next to `path` to fill; when the block ends it replaces `path`
    (module docstring: an existing `path` is renamed aside and deleted after), when it
    raises it is deleted and `path` stays. The parent folder is created when missing;
    temp folders of `path` left by an interrupted write are deleted first (one writer per
    target at a time)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_temp_files(path.parent, (path.name,))
    tmp = temp_dir(path.parent, path.name)
    try:
        yield tmp
        fsync_tree(tmp)
        old = _move_aside(path)
        try:
            _replace(tmp, path)
        except BaseException:
            if old is not None:
                _replace(old, path)
            raise
    except BaseException:
        _discard(tmp)
        raise
    fsync_dir(path.parent)
    if old is not None:
        _discard(old)


def real_dir(path: str | os.PathLike) -> Path:
    """Make `path` a real folder (with its parents) and return it: a symlink in its place
    is unlinked first (its target is left alone), never followed."""
    path = Path(path)
    if path.is_symlink():
        _unlink(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def writable_dir(path: str | os.PathLike, argument: str | None = None) -> Path:
    """Create folder `path` (and its parents) when missing and check that files can be
    created in it (a temp file, created exclusively and deleted at once). ValueError
    naming `argument` (when given) and `path` when it is a file or cannot be written
    (read-only, no permission); other OSErrors (a full disk) as raised."""
    path = Path(path)
    where = f"{argument}: {path}" if argument else str(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"{where} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temp(path / "write-check")
        _close(fd)
        _unlink(tmp)
    except (PermissionError, FileExistsError, NotADirectoryError) as e:
        raise ValueError(f"{where} cannot be written ({e.strerror})") from None
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        raise ValueError(f"{where} cannot be written ({e.strerror})") from None
    return path


def _move_aside(path: Path) -> Path | None:
    """Rename an existing `path` to a new temp name next to it; None when missing."""
    if not os.path.lexists(path):
        return None
    while True:
        aside = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        if not os.path.lexists(aside):
            _replace(path, aside)
            return aside


def move_into_place(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Move the finished file or folder `src` to `dst` (same file system) durably: `src`
    fsynced (a folder: every file and folder in it), `os.replace`, then dst's folder
    fsynced. A file replaces a file; a folder `dst` must be missing or empty (OSError
    otherwise). Returns `dst`."""
    src, dst = Path(src), Path(dst)
    if src.is_dir() and not src.is_symlink():
        fsync_tree(src)
    else:
        _fsync_file(src)
    _replace(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)
    return dst
