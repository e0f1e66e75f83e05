"""Folder locks: one writer per output folder (run folders, prepared data, tokenizers).

While a command writes to a folder it holds an exclusive `fcntl.flock` on `<folder>/.lock`
(the file holds the owner's pid, for the message). The kernel drops a flock when its
process dies, kill -9 included, so there is never a stale lock to clean up; the lock file
itself stays (deleting it would let two processes lock two different files of one name).
A second process is refused at once (`FolderBusy`) rather than made to wait. The lock is
per process and re-entrant: several holders in one process share it (a run and a reload of
its checkpoint, a command and the Trainer it starts), and it goes when the last one is
released or garbage-collected. A forked child does not inherit it. A symlink in place of
`.lock` is replaced by a file, never followed.
"""

from __future__ import annotations

import errno
import os
import weakref
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no locking
    fcntl = None

__all__ = ["lock_folder", "FolderLock", "FolderBusy", "LOCK_NAME"]

LOCK_NAME = ".lock"


class FolderBusy(RuntimeError):
    """Another process holds the folder's lock (it is writing to the folder)."""


_held: dict[str, list[int]] = {}  # lock file path (real folder) -> [fd, holders here]


def _forget_locks() -> None:
    """In a forked child: the parent's locks are the parent's (closing the inherited fds
    leaves the parent's flock in place)."""
    for fd, _ in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks)


def _release(key: str) -> None:
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[key]
        os.close(entry[0])  # drops the flock


class FolderLock:
    """One holder's share of a folder's lock (`lock_folder`). `release()`, leaving a `with`
    block or garbage collection gives it back; releasing twice is a no-op."""

    def __init__(self, key: str):
        self.path = Path(key)
        self._finalizer = weakref.finalize(self, _release, key)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        self._finalizer()

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _owner(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


def _open_lock_file(key: str) -> int:
    """The lock file opened for writing (0666 & ~umask when new); a symlink in its place is
    unlinked first, never followed."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(key, flags, 0o666)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
    os.unlink(key)
    return os.open(key, flags, 0o666)


def lock_folder(folder: str | os.PathLike, user: str = "run") -> FolderLock:
    """Take `folder`'s lock (module docstring), creating the folder; FolderBusy at once when
    another process holds it (the message says it is in use by another `user`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.join(os.path.realpath(folder), LOCK_NAME)
    if key in _held:
        _held[key][1] += 1
        return FolderLock(key)
    fd = _open_lock_file(key)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise FolderBusy(f"{folder} is in use by another {user} ({owner} holds {key}); "
                             "wait for it to finish or stop it first") from None
        except BaseException:
            os.close(fd)
            raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = [fd, 1]
    return FolderLock(key)
