"""Output folders of `pathattn tokenizer` and `pathattn prepare`: the --out guard, and the
data folder's JSON format.

Guard (our choice, as for run folders in `pathattn.train.run_dir`): an --out that exists
and is not empty is refused unless overwrite=True. Overwriting replaces the command's own
files (`names`) only and never deletes anything else in the folder, so a mistyped --out
cannot empty an unrelated directory; the old files stay in place until the new ones are
complete (a failed or interrupted command leaves the previous output as it was).

Files are written durably by `pathattn.utils.io` (`AtomicFile` streams the token files);
--overwrite clears the temp leftovers of a killed process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from ..utils.io import AtomicFile, atomic_write_json, remove_temp_files
from .corpus import DataError

__all__ = ["prepare_out_dir", "AtomicFile", "write_json", "package_versions"]


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
        remove_temp_files(out, (*names, *temp_names))
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_json(path: Path, obj) -> None:
    """Atomic write of `obj` as indented JSON (indent 2, final newline)."""
    atomic_write_json(path, obj, indent=2)


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
