"""Hostile inputs and folders for `pathattn tokenizer` and `pathattn prepare`: each ends in
one message naming the argument or file and the expectation (exit 2, or 1 for a full disk
and a folder in use), with no traceback and nothing lost; workers die with a SIGKILLed
parent."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pathattn.utils.io as io_module
from pathattn.cli import main
from pathattn.utils.folder_lock import LOCK_NAME
from tests.faults.lm_assets import write_text_corpus

REPO = Path(__file__).resolve().parents[2]
# holds an flock on argv[1] until killed, like a command writing to the folder
HOLDER = ("import fcntl, os, sys, time\n"
          "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
          "fcntl.flock(fd, fcntl.LOCK_EX)\n"
          "print('locked', flush=True)\n"
          "time.sleep(120)\n")


def _refused(argv: list[str], capsys) -> str:
    """The one-line message of a usage error (exit 2) of `pathattn ARGV`."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != LOCK_NAME}


def _prepare_args(lm, out: Path, *extra: str, inputs: tuple = ()) -> list[str]:
    inputs = inputs or (str(lm.corpus),)
    return ["prepare", "--input", *inputs, "--tokenizer", str(lm.tok_a), "--out", str(out),
            "--val-fraction", "0.3", *extra, "--workers", "1", "--no-progress"]


# ------------------------------------------------------------------- tokenizer


def test_vocab_size_beyond_uint32_is_refused_not_aborted(lm, tmp_path, capsys):  # 11
    line = _refused(["tokenizer", "--input", str(lm.corpus), "--vocab-size", "99999999999",
                     "--out", str(tmp_path / "tok")], capsys)
    assert "vocab_size must be an int in [259, 2**32]" in line and "99999999999" in line


@pytest.mark.parametrize("kind", ["empty-file", "dev-null"])
def test_empty_corpus_gives_no_tokenizer(tmp_path, capsys, kind):  # 12
    given = "/dev/null" if kind == "dev-null" else str(tmp_path / "empty.txt")
    (tmp_path / "empty.txt").write_text("")
    line = _refused(["tokenizer", "--input", given, "--out", str(tmp_path / "tok")], capsys)
    assert ("empty corpus" if kind == "empty-file" else "character device") in line
    assert not (tmp_path / "tok" / "tokenizer.json").exists()


@pytest.mark.parametrize("command", ["tokenizer", "prepare"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_device_or_fifo_input_is_refused_at_once(lm, tmp_path, capsys, command, kind):
    given = "/dev/zero"  # 13: reading it would never end; friction: a FIFO blocks
    if kind == "fifo":
        given = str(tmp_path / "pipe")
        os.mkfifo(given)
    out = str(tmp_path / "out")
    argv = ["tokenizer", "--input", given, "--out", out] if command == "tokenizer" else \
        _prepare_args(lm, Path(out), inputs=(given,))
    start = time.monotonic()
    line = _refused(argv, capsys)
    assert f"input {given!r}: not a regular file or a folder" in line
    assert time.monotonic() - start < 30


def test_empty_tokenizer_folder_is_named(lm, tmp_path, capsys):  # friction
    (tmp_path / "tok").mkdir()
    line = _refused(["prepare", "--input", str(lm.corpus), "--tokenizer", str(tmp_path / "tok"),
                     "--out", str(tmp_path / "data")], capsys)
    assert "holds no tokenizer (none of tokenizer.json" in line and "sentencepiece" not in line


# --------------------------------------------------------------------- prepare


def test_prepare_into_a_locked_folder_is_refused(lm, tmp_path, capsys):  # 7
    out = tmp_path / "data"
    assert main(_prepare_args(lm, out)) == 0
    before = _files(out)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert main(_prepare_args(lm, out, "--overwrite", "--seed", "1")) == 1
        err = capsys.readouterr().err
        assert "is in use by another pathattn prepare" in err and "Traceback" not in err
    finally:
        holder.kill()
        holder.wait()
    assert _files(out) == before  # meta.json included: the first one's dataset stands


def test_temp_leftovers_alone_need_no_overwrite(lm, tmp_path):  # friction
    out = tmp_path / "data"
    out.mkdir()
    for name in (".train.bin.0123abcd.tmp", ".meta.json.89abcdef.tmp", LOCK_NAME):
        (out / name).write_text("x")  # what a killed prepare leaves
    assert main(_prepare_args(lm, out)) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == []


@pytest.mark.parametrize("case", ["out-is-a-file", "read-only"])
def test_unwritable_out_is_refused_before_work(lm, tmp_path, capsys, monkeypatch, case):  # 13
    out = tmp_path / "data"
    if case == "out-is-a-file":
        out.write_text("x")
        expected = f"out: {out} exists and is not a folder"
    else:
        out.mkdir()
        real_open = io_module._open

        def read_only(path, flags, mode=0o777):  # what a read-only mount answers
            if Path(path).parent == out and flags & os.O_CREAT:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, mode)

        monkeypatch.setattr(io_module, "_open", read_only)
        expected = f"out: {out} cannot be written (Read-only file system)"
    assert expected in _refused(_prepare_args(lm, out), capsys)


def test_full_disk_exits_1_and_keeps_the_previous_dataset(lm, tmp_path, capsys):  # 13
    out = tmp_path / "data"
    big = write_text_corpus(tmp_path / "big", n=40, seed=3)
    assert main(_prepare_args(lm, out)) == 0
    before = _files(out)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # `ulimit -f`: EFBIG past 4 kB
    try:
        code = main(_prepare_args(lm, out, "--overwrite", inputs=(str(big),)))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    assert code == 1 and "no space left" in err and "Traceback" not in err, err
    assert _files(out) == before  # no temp file left, not even an empty one


@pytest.mark.parametrize("field,value,expected", [
    ("vocab_size", 100, "tokenizer.identity"),  # not the size of the tokenizer's ids
    ("vocab_size", 10 ** 12, "tokenizer.vocab_size must be an int in [1, 2**32]"),
    ("splits", "train", "splits must be"),
], ids=["vocab-100", "vocab-1e12", "splits-a-string"])
def test_hostile_meta_json_values_are_named(lm, tmp_path, capsys, field, value, expected):
    data = tmp_path / "data"  # 13
    shutil.copytree(lm.data_a, data)
    meta = json.loads((data / "meta.json").read_text())
    if field == "vocab_size":
        meta["tokenizer"]["vocab_size"] = value
    else:
        meta[field] = value
    (data / "meta.json").write_text(json.dumps(meta))
    line = _refused(["pretrain", "--data", str(data), "--steps", "1", "--out",
                     str(tmp_path / "run")], capsys)
    assert f"{data / 'meta.json'}: {expected}" in line
    assert not (tmp_path / "run" / "config.json").exists()


def test_val_fraction_zero_is_not_suggested_then_refused(lm, tmp_path, capsys):  # friction
    line = _refused(_prepare_args(lm, tmp_path / "few", "--val-fraction", "1e-9"), capsys)
    assert "the validation split is empty" in line
    assert "val_fraction=0 makes no validation split, which `pathattn pretrain` and the " \
           "evaluations need" in line


# -------------------------------------------------------------- worker processes


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _encoding(out: Path) -> bool:
    """Whether prepare has written encoded tokens (its workers run) to a temp file."""
    return any(p.name.startswith(".train.bin.") and p.stat().st_size > 0
               for p in out.iterdir()) if out.is_dir() else False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_sigkill_of_prepare_leaves_no_worker(lm, tmp_path):  # 8
    big = write_text_corpus(tmp_path / "big", n=2000, seed=4)
    out = tmp_path / "data"
    argv = _prepare_args(lm, out, inputs=(str(big),))[:-3]
    proc = subprocess.Popen([sys.executable, "-m", "pathattn", *argv, "--workers", "2",
                             "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not _encoding(out) and time.monotonic() < deadline:
        assert proc.poll() is None, "prepare ended before it was killed"
        time.sleep(0.01)
    children = _children(proc.pid)  # 2 workers and the resource tracker
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(children) == 3, children
    deadline = time.monotonic() + 30
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [c for c in children if _alive(c)]
