"""Output folders of `pathattn tokenizer` and `pathattn prepare`: the --out guard, and the
data folder's JSON format.

Guard (our choice, as for run folders in `pathattn.train.run_dir`): an --out that exists
and is not empty is refused unless overwrite=True. Overwriting replaces the command's own
files (`names`) only and never deletes anything else in the folder, so a mistyped --out
cannot empty an unrelated directory; the old files stay in place until the new ones are
complete (a failed or interrupted command leaves the previous output as it was). A folder
that holds nothing but the lock file and temp leftovers of our own files (a killed
command) counts as empty. While the command writes, it holds the folder's lock
(`pathattn.utils.folder_lock`): a second command on the same folder is refused at once.

Files are written durably by `pathattn.utils.io` (`AtomicFile` streams the token files);
the temp leftovers of a killed process are removed before writing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from ..utils.folder_lock import LOCK_NAME, lock_folder
from ..utils.io import (
    AtomicFile,
    atomic_write_json,
    remove_temp_files,
    temp_name_target,
    writable_dir,
)
from .corpus import DataError

__all__ = ["prepare_out_dir", "AtomicFile", "write_json", "package_versions"]


@contextmanager
def prepare_out_dir(out: str | os.PathLike, names: Sequence[str], overwrite: bool,
                    temp_names: Sequence[str] = (), user: str = "pathattn prepare"
                    ) -> Iterator[Path]:
    """Create `out` if needed, lock it (FolderBusy when another process holds it) and
    yield it; the lock goes when the block ends. DataError when it is a file, cannot be
    written, or holds anything but the lock and temp leftovers of `names` / `temp_names`
    and not `overwrite`. The temp leftovers are removed (the files themselves are
    replaced later, by the caller)."""
    try:
        out = writable_dir(out, "out")
    except ValueError as e:
        raise DataError(str(e)) from None
    ours = {*names, *temp_names}
    with lock_folder(out, user):
        others = [name for name in sorted(os.listdir(out)) if name != LOCK_NAME
                  and temp_name_target(name) not in ours]
        if others and not overwrite:
            raise DataError(f"out: {out} is not empty; pass overwrite=True (--overwrite) to "
                            f"replace its {', '.join(names)}")
        remove_temp_files(out, ours)
        yield out


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
