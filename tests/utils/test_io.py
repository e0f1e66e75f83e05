"""`pathattn.utils.io`, for every writer of the module:

* a process SIGKILLed in the middle of a write (a real kill, in a forked child paused after
  part of a large payload is on disk) leaves the target with its old content, and nothing
  but a temp entry beside it, which `remove_temp_files` deletes;
* an exception in the middle of a write deletes the temp entry and leaves the old target;
* the new file (or every file of a new folder) is fsynced before the rename, and its folder
  after it.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest

from pathattn.utils import io as fsio

PAYLOAD = bytes(range(256)) * (16 * 1024)  # 4 MiB
HALF = len(PAYLOAD) // 2
OLD = b"old content\n"


@contextmanager
def _pause_in_write(part: Callable[[], None]):
    """The next `_write` of the module puts half its bytes, then calls part() (the helpers
    that take their content whole write it in one pass of `_write`)."""
    real = fsio._write

    def write(fd, data):
        n = real(fd, data[:max(1, len(data) // 2)])
        fsio._write = real
        part()
        return n

    fsio._write = write
    try:
        yield
    finally:
        fsio._write = real


def _write_bytes(path: Path, part) -> None:
    with _pause_in_write(part):
        fsio.atomic_write_bytes(path, PAYLOAD)


def _write_text(path: Path, part) -> None:
    with _pause_in_write(part):
        fsio.atomic_write_text(path, PAYLOAD.hex())


def _write_json(path: Path, part) -> None:
    with _pause_in_write(part):
        fsio.atomic_write_json(path, {"payload": PAYLOAD.hex()}, indent=2)


def _write_jsonl(path: Path, part) -> None:
    def records():
        for i in range(4096):
            if i == 2048:
                part()
            yield {"i": i, "payload": PAYLOAD[:1024].hex()}

    fsio.atomic_write_jsonl(path, records())


def _atomic_file(path: Path, part) -> None:
    with fsio.AtomicFile(path) as f:
        f.write(PAYLOAD[:HALF])
        f.file.flush()
        part()
        f.write(PAYLOAD[HALF:])
        f.commit()


def _atomic_open(path: Path, part) -> None:
    with fsio.atomic_open(path, "w", encoding="utf-8") as f:
        f.write(PAYLOAD[:HALF].hex())
        f.flush()
        part()
        f.write(PAYLOAD[HALF:].hex())


def _atomic_path(path: Path, part) -> None:
    with fsio.atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(PAYLOAD[:HALF])
        f.flush()
        part()
        f.write(PAYLOAD[HALF:])


def _atomic_dir(path: Path, part) -> None:
    with fsio.atomic_dir(path) as tmp:
        (tmp / "first.bin").write_bytes(PAYLOAD[:HALF])
        part()
        (tmp / "second.bin").write_bytes(PAYLOAD[HALF:])


def _move_into_place(path: Path, part) -> None:
    """A finished file elsewhere moved over `path`; paused at its fsync, before the move."""
    src = path.parent / "staging" / "new.bin"
    src.parent.mkdir(exist_ok=True)
    src.write_bytes(PAYLOAD)
    real = fsio._fsync

    def fsync(fd):
        fsio._fsync = real
        part()
        return real(fd)

    fsio._fsync = fsync
    try:
        fsio.move_into_place(src, path)
    finally:
        fsio._fsync = real


WRITERS = {"atomic_write_bytes": _write_bytes, "atomic_write_text": _write_text,
           "atomic_write_json": _write_json, "atomic_write_jsonl": _write_jsonl,
           "AtomicFile": _atomic_file, "atomic_open": _atomic_open,
           "atomic_path": _atomic_path, "atomic_dir": _atomic_dir,
           "move_into_place": _move_into_place}


def _old_target(folder: Path, writer: str) -> Path:
    """The target with its old content: a file, or for atomic_dir a folder of one file."""
    target = folder / "target"
    if writer == "atomic_dir":
        target.mkdir()
        (target / "old.txt").write_bytes(OLD)
    else:
        target.write_bytes(OLD)
    return target


def _assert_old(target: Path, writer: str) -> None:
    if writer == "atomic_dir":
        assert sorted(os.listdir(target)) == ["old.txt"]
        assert (target / "old.txt").read_bytes() == OLD
    else:
        assert target.read_bytes() == OLD


def _others(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n not in ("target", "staging"))


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


# --------------------------------------------------------------------- real kills


def _write_in_child(writer: str, target: Path) -> int:
    """Fork a child that runs the writer and pauses in the middle; returns its pid once it
    has paused (its partial output on disk)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)

            def pause():
                os.write(w, b"p")
                time.sleep(600)

            WRITERS[writer](target, pause)
            os.write(w, b"d")  # finished without pausing: the test is broken
        except BaseException:  # noqa: BLE001
            os.write(w, b"e")
        finally:
            os._exit(1)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 60)
        said = os.read(r, 1) if ready else b""
    finally:
        os.close(r)
    if said != b"p":
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the child of {writer} did not pause mid-write (said {said!r})")
    return pid


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("writer", list(WRITERS))
def test_sigkill_mid_write_keeps_the_old_target(tmp_path, writer):
    target = _old_target(tmp_path, writer)
    pid = _write_in_child(writer, target)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    _assert_old(target, writer)
    if writer == "move_into_place":  # the finished file is still the caller's, unmoved
        assert (tmp_path / "staging" / "new.bin").read_bytes() == PAYLOAD
        assert _others(tmp_path) == []
        return
    leftovers = _others(tmp_path)  # the partial output, under a temp name only
    assert len(leftovers) == 1 and leftovers[0].startswith(".target.")
    assert 0 < _size(tmp_path / leftovers[0])
    assert fsio.remove_temp_files(tmp_path, ["target"]) == leftovers
    assert _others(tmp_path) == []
    _assert_old(target, writer)


# ---------------------------------------------------------------------- exceptions


class Boom(Exception):
    pass


def _raise():
    raise Boom


@pytest.mark.parametrize("writer", list(WRITERS))
def test_exception_mid_write_removes_the_temp_and_keeps_the_old_target(tmp_path, writer):
    target = _old_target(tmp_path, writer)
    with pytest.raises(Boom):
        WRITERS[writer](target, _raise)
    _assert_old(target, writer)
    assert _others(tmp_path) == []
    if writer == "move_into_place":
        assert (tmp_path / "staging" / "new.bin").read_bytes() == PAYLOAD


@pytest.mark.parametrize("fail", ["_write", "_fsync", "_replace"])
def test_failing_file_system_call_removes_the_temp(tmp_path, monkeypatch, fail):
    target = _old_target(tmp_path, "atomic_write_bytes")

    def broken(*args):
        raise OSError(f"{fail} failed")

    monkeypatch.setattr(fsio, fail, broken)
    with pytest.raises(OSError, match=fail):
        fsio.atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    _assert_old(target, "atomic_write_bytes")
    assert _others(tmp_path) == []


# --------------------------------------------------------------------------- fsync


def _record_fsyncs(monkeypatch) -> list[tuple[bool, int]]:
    """(is a folder, inode) of every fsync of the module, in order."""
    calls = []
    real = fsio._fsync

    def fsync(fd):
        st = os.fstat(fd)
        calls.append((stat.S_ISDIR(st.st_mode), st.st_ino))
        return real(fd)

    monkeypatch.setattr(fsio, "_fsync", fsync)
    return calls


@pytest.mark.parametrize("writer", list(WRITERS))
def test_new_files_then_their_folder_are_fsynced(tmp_path, monkeypatch, writer):
    target = _old_target(tmp_path, writer)
    if writer == "move_into_place":
        (tmp_path / "staging").mkdir()
    calls = _record_fsyncs(monkeypatch)
    WRITERS[writer](target, lambda: None)
    files = sorted(target.iterdir()) if writer == "atomic_dir" else [target]
    if writer == "atomic_dir":
        assert [p.read_bytes() for p in files] == [PAYLOAD[:HALF], PAYLOAD[HALF:]]
    last_file = max(calls.index((False, p.stat().st_ino)) for p in files)
    parent = calls.index((True, tmp_path.stat().st_ino), last_file)  # after every file
    if writer == "atomic_dir":  # the new folder itself, before the rename into place
        assert calls.index((True, target.stat().st_ino)) < parent
    assert parent == len(calls) - 1 or writer == "move_into_place"


# ------------------------------------------------------------------- the rest


def test_contents_and_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    assert fsio.atomic_write_json(tmp_path / "a.json", {"x": 1.5, "y": "é"},
                                  indent=2) == tmp_path / "a.json"
    assert (tmp_path / "a.json").read_bytes() == b'{\n  "x": 1.5,\n  "y": "\\u00e9"\n}\n'
    assert fsio.atomic_write_jsonl(tmp_path / "b.jsonl", [{"y": "é"}, [1]],
                                   ensure_ascii=False) == 2
    assert (tmp_path / "b.jsonl").read_text(encoding="utf-8") == '{"y": "é"}\n[1]\n'
    with fsio.atomic_open(tmp_path / "c.txt", "w") as f:
        f.write("a\nb\r\n")
    assert (tmp_path / "c.txt").read_bytes() == b"a\nb\r\n"  # no newline translation
    for value, options in ((float("inf"), {}), ([float("nan")], {}),
                           (1.0, {"allow_nan": True})):
        with pytest.raises(ValueError, match="d.json.*(strict|NaN)"):  # strict JSON only
            fsio.atomic_write_json(tmp_path / "d.json", value, **options)
    with pytest.raises(ValueError, match="d.json.*strict JSON has no NaN"):
        fsio.atomic_write_jsonl(tmp_path / "d.json", [{"a": 1}, {"b": float("-inf")}])
    assert fsio.finite_or_none({"a": [float("nan"), 2.0], "b": (float("inf"),)}) == {
        "a": [None, 2.0], "b": [None]}
    assert not (tmp_path / "d.json").exists()
    for name in ("a.json", "b.jsonl", "c.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.jsonl", "c.txt"]


def test_atomic_dir_replaces_a_folder_and_clears_stale_temps(tmp_path):
    target = _old_target(tmp_path, "atomic_dir")
    stale = fsio.temp_dir(tmp_path, "target")  # left by a killed write
    (stale / "half.bin").write_bytes(b"x")
    with fsio.atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(target)) == ["new.txt"]
    assert _others(tmp_path) == []


def test_remove_temp_files_touches_only_temp_names_of_its_targets(tmp_path):
    names = ["keep.txt", ".keep.txt.0123abcd.tmp", ".other.json.0123abcd.tmp", "a.tmp",
             ".a.json.short.tmp"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".a.json.k2_9xq7w.tmp").mkdir()  # a folder, of a mkstemp-style name
    assert fsio.remove_temp_files(tmp_path, ["a.json", "keep.txt"]) == [
        ".a.json.k2_9xq7w.tmp", ".keep.txt.0123abcd.tmp"]
    assert fsio.remove_temp_files(tmp_path, lambda name: name == "other.json") == [
        ".other.json.0123abcd.tmp"]
    assert sorted(os.listdir(tmp_path)) == sorted(["keep.txt", "a.tmp", ".a.json.short.tmp"])
    assert fsio.remove_temp_files(tmp_path / "missing", ["a.json"]) == []


def test_remove_file(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    assert fsio.remove_file(tmp_path / "f") and not (tmp_path / "f").exists()
    assert not fsio.remove_file(tmp_path / "f")
