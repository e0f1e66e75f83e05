"""Run folders: the guard around the folder a training command writes. `pathattn train`,
`compare`, `layers` (and any later training command) go through `prepare_run_dir` (one run
per folder: `Trainer` calls it) or `lock_run_dir` (a folder of several runs, e.g.
compare's DIR with one run per attention type in DIR/<attn>/).

Protection (our choice): a fresh run into a folder that already holds a run (any of
`RUN_FILES`) is refused (`RunDirError`) unless the caller continues it (resume=True,
`--resume`) or replaces it (overwrite=True, `--overwrite`). Replacing deletes the run's own
files only (`RUN_FILES`, checkpoint files by their name pattern, temp leftovers), never
anything else in the folder, so that a mistyped --out cannot empty an unrelated directory.
A symlink in place of a run file or of `checkpoints/` is replaced (or unlinked), never
followed; a resume refuses a symlinked `checkpoints/`.

Lock: while a run writes to a folder it holds the folder's lock
(`pathattn.utils.folder_lock`: an OS lock that dies with its process, re-entrant within
one process); a second process is refused at once (`RunDirBusy`).

Logs: `read_jsonl` reads log.jsonl / eval.jsonl and drops a cut-off last line (a process
killed while appending), so that everything that reads a log survives such a kill.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..utils.folder_lock import LOCK_NAME, FolderBusy, FolderLock, lock_folder
from ..utils.io import atomic_write_text, remove_file, remove_temp_files
from .checkpoint import remove_checkpoints
from .synthetic import SyntheticConfig

__all__ = ["prepare_run_dir", "lock_run_dir", "holds_run", "clear_run", "read_jsonl",
           "truncate_jsonl", "finished_metrics", "check_sub_runs", "RunLock", "RunDirError",
           "RunDirBusy", "LOCK_NAME", "RUN_FILES"]

LOG_FILES = ("config.json", "log.jsonl", "eval.jsonl", "metrics.json")
RUN_FILES = (*LOG_FILES, "checkpoints")
RunDirBusy = FolderBusy  # another process holds the folder's lock (a run is writing to it)
RunLock = FolderLock


class RunDirError(ValueError):
    """A fresh run was asked for in a folder that already holds one."""


def lock_run_dir(folder: str | os.PathLike) -> RunLock:
    """Take `folder`'s lock (`pathattn.utils.folder_lock.lock_folder`), creating the
    folder; RunDirBusy at once when another process holds it."""
    return lock_folder(folder, "run")


# ------------------------------------------------------------------------- protection

def holds_run(folder: str | os.PathLike) -> list[str]:
    """The names of `RUN_FILES` present in `folder` (empty: it holds no run)."""
    folder = Path(folder)
    return [name for name in RUN_FILES if os.path.lexists(folder / name)]


def clear_run(folder: str | os.PathLike) -> None:
    """Delete the run in `folder`: its `LOG_FILES`, its checkpoints and the temp leftovers
    of interrupted writes; anything else in the folder stays."""
    folder = Path(folder)
    remove_temp_files(folder, LOG_FILES)
    for name in LOG_FILES:
        remove_file(folder / name)
    remove_checkpoints(folder)


def _refusal(folders: dict[Path, list[str]]) -> RunDirError:
    what = "; ".join(f"{folder} ({', '.join(found)})" for folder, found in folders.items())
    it = "it" if len(folders) == 1 else "them"
    return RunDirError(f"{what} already {'holds a run' if len(folders) == 1 else 'hold runs'}"
                       f"; continue {it} with --resume (Python: resume=True) or replace "
                       f"{it} with --overwrite (overwrite=True)")


def prepare_run_dir(folder: str | os.PathLike, *, resume: bool = False,
                    overwrite: bool = False) -> RunLock:
    """Lock `folder` for a run and check it (module docstring): a fresh run (neither flag)
    needs a folder without a run (RunDirError otherwise), overwrite=True deletes the run
    that is there first (`clear_run`), resume=True takes it as it is. Returns the lock."""
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other (--resume continues the "
                         "run in the folder, --overwrite replaces it)")
    lock = lock_run_dir(folder)
    try:
        if resume and (Path(folder) / "checkpoints").is_symlink():
            raise RunDirError(f"{Path(folder) / 'checkpoints'} is a symlink; checkpoints are "
                              "written and deleted in a real folder only: move the folder it "
                              "points to in its place, then resume")
        if overwrite:
            clear_run(folder)
        elif not resume and (found := holds_run(folder)):
            raise _refusal({Path(folder): found})
    except BaseException:
        lock.release()
        raise
    return lock


def finished_metrics(cfg: SyntheticConfig) -> dict | None:
    """The metrics of a finished run of exactly cfg (same `run_identity`) in cfg.out_dir,
    else None."""
    out = Path(cfg.out_dir)
    try:
        stored = type(cfg).from_dict(json.loads((out / "config.json").read_text()))
        metrics = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    if (stored.run_identity() != cfg.run_identity() or not isinstance(metrics, dict)
            or metrics.get("step") != cfg.steps):
        return None
    return metrics


def check_sub_runs(cfgs: Iterable[SyntheticConfig], *, resume: bool = False,
                   overwrite: bool = False, reuse_finished: bool = False) -> None:
    """Refuse (RunDirError naming every such folder) before anything trains when a run of a
    multi-run command (compare, layers) would start fresh in a folder that holds a run:
    without resume or overwrite, unless reuse_finished and the run there is a finished run
    of the same config (which is then reused, not retrained)."""
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other (--resume continues the "
                         "runs in the folder, --overwrite replaces them)")
    if resume or overwrite:
        return
    refused = {}
    for cfg in cfgs:
        found = holds_run(cfg.out_dir)
        if found and not (reuse_finished and finished_metrics(cfg) is not None):
            refused[Path(cfg.out_dir)] = found
    if refused:
        raise _refusal(refused)


# ------------------------------------------------------------------------------- logs

def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSONL log (log.jsonl, eval.jsonl), [] when it does not exist. A last
    line that is not a complete JSON object is dropped (a process killed mid-append leaves
    one); a bad line anywhere else raises ValueError naming the file and line."""
    return [record for _, record in _jsonl_lines(Path(path))]


def _jsonl_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) pairs of `read_jsonl`, the line as written (without its newline)."""
    try:
        lines = path.read_bytes().decode(errors="replace").split("\n")
    except FileNotFoundError:
        return []
    if lines and lines[-1] == "":
        lines.pop()  # the text after the final newline
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                raise ValueError("not a record with an int 'step'")
        except ValueError as e:
            if i == len(lines) - 1:
                break  # cut off by a kill mid-append
            raise ValueError(f"{path}, line {i + 1}: not a JSON record ({e}); remove the line "
                             "or start over with --overwrite") from None
        out.append((line, record))
    return out


def truncate_jsonl(path: str | os.PathLike, last_step: int) -> None:
    """Keep the records of `path` with "step" <= last_step, rewritten atomically: lines
    unchanged (so a resumed run's log is byte for byte an uninterrupted run's, but for
    the wall-clock fields "elapsed_s" and "tokens_per_s"), a cut-off last line dropped."""
    path = Path(path)
    if not path.exists():
        return
    keep = [line for line, record in _jsonl_lines(path) if record["step"] <= last_step]
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def config_for_resume(config_cls, out_dir: str, given: dict, common: dict,
                      changes: Callable[[dict], dict] | None = None):
    """The config of a `--resume`: the one stored in out_dir's checkpoint, with the options
    given on the command line that do not change results (`config_cls.NOT_IDENTITY`) and
    `common`. ValueError when there is no checkpoint, or listing every given option that
    differs from the stored config with both values: the options of `given` (by flag) and
    those `changes(stored)` returns ({flag: (stored value, given value)}) for options
    that are not config fields (data, model flags, step budgets)."""
    from .checkpoint import CheckpointWarning, load_checkpoint

    try:
        with warnings.catch_warnings():  # the Trainer warns when it loads the checkpoint
            warnings.simplefilter("ignore", CheckpointWarning)
            stored = load_checkpoint(out_dir)["config"]
    except FileNotFoundError:
        raise ValueError(f"--resume: no checkpoint in {out_dir} (start over with "
                         "--overwrite)") from None
    own = {k: v for k, v in given.items() if k in config_cls.NOT_IDENTITY}
    diff = {"--" + k.replace("_", "-"): (stored.get(k), v) for k, v in sorted(given.items())
            if k not in own and stored.get(k) != v}
    diff.update(changes(stored) if changes is not None else {})
    if diff:
        run = ", ".join(f"{k} {v[0]!r}" for k, v in diff.items())
        asked = ", ".join(f"{k} {v[1]!r}" for k, v in diff.items())
        raise ValueError(f"--resume: {', '.join(diff)} would change the run (the run's: "
                         f"{run}; given: {asked}); resume without them to continue it, or "
                         "start a new run (another --out, or --overwrite)")
    return config_cls.from_dict({**stored, **own, **common})
