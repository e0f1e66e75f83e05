"""Tokenizer identity: which tokenizer turned text into the ids of a prepared folder, of a
model export, of a teacher, and the check wherever two of them meet.

The identity of a tokenizer (`tokenizer_identity`) is {"sha256", "vocab_size", "bos_id",
"eos_id", "pad_id"}: the sha256 of its definition plus its size and special ids. The
definition is the tokenizer's `tokenizer.json` as the `tokenizers` library serializes it
(vocabulary, merges, normalizer, pre-tokenizer, post-processor, decoder, added tokens),
re-serialized with sorted keys, without the padding / truncation settings of a session;
a tokenizer without that backend hashes its vocabulary. So a copy written by
`save_pretrained` (an export) has the identity of the folder it came from, whatever its
tokenizer_config.json says about lengths or class names, and two tokenizers of one size
with other merges differ. "encoder_sha256" hashes the same without the post-processor (what
`tokenizer(text)` adds around the ids, which prepared ids never come from); where both
identities hold it, it is compared instead of sha256, since exports save the tokenizer
without its BOS template (`pathattn.hf.export`).

Records: `pathattn prepare` writes it into meta.json (tokenizer.identity) next to the
tokenizer folder's path; every export (`pathattn pretrain`, `pathattn convert`) writes
`IDENTITY_FILE` next to the tokenizer it saves. Checks (each a DataError naming the
argument and both identities): `data_tokenizer` (the folder meta.json names must be the
one prepared with), `model_tokenizer` (a model folder's tokenizer must be the one its
export recorded, and fit its model's vocabulary), `check_same` (data against a model, a
teacher or init weights; `model_for_data` does both for a model folder). Data prepared
before identities were recorded is checked by the files_sha256 of its tokenizer folder.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..utils.io import atomic_write_json
from .corpus import DataError
from .tokenizer import TOKENIZER_FILE_NAMES, load_tokenizer, special_ids

__all__ = ["tokenizer_identity", "describe", "check_same", "data_identity", "data_tokenizer",
           "model_tokenizer", "model_for_data", "prepared_identity", "write_export_identity",
           "read_export_identity", "folder_files_sha256", "IDENTITY_FILE", "IDENTITY_KEYS"]

IDENTITY_FILE = "pathattn_tokenizer_identity.json"
IDENTITY_KEYS = ("sha256", "vocab_size", "bos_id", "eos_id", "pad_id")
_SESSION_KEYS = ("padding", "truncation")  # set by calls, not part of the definition


def _definition(tok, post_processor: bool = True) -> bytes:
    """The bytes hashed for a loaded tokenizer (module docstring)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        for key in _SESSION_KEYS + (() if post_processor else ("post_processor",)):
            spec.pop(key, None)
        return b"tokenizer.json\0" + json.dumps(spec, sort_keys=True).encode()
    vocab = sorted(tok.get_vocab().items(), key=lambda item: (item[1], item[0]))
    return b"vocab\0" + json.dumps(vocab).encode()


def tokenizer_identity(tok) -> dict:
    """The identity of a loaded tokenizer (module docstring)."""
    return {"sha256": hashlib.sha256(_definition(tok)).hexdigest(), "vocab_size": len(tok),
            **special_ids(tok),
            "encoder_sha256": hashlib.sha256(_definition(tok, False)).hexdigest()}


def describe(identity: dict | None) -> str:
    """One line for messages: "sha256 29cd98ca934c, 512 ids, bos/eos/pad 0/1/2"."""
    if identity is None:
        return "unknown (not recorded)"
    ids = "/".join(str(identity.get(k)) for k in ("bos_id", "eos_id", "pad_id"))
    return (f"sha256 {str(identity.get('sha256'))[:12]}, {identity.get('vocab_size')} ids, "
            f"bos/eos/pad {ids}")


def check_same(found: dict, expected: dict, found_what: str, expected_what: str,
               argument: str) -> None:
    """DataError "<argument>: <found_what> (<identity>) is not <expected_what>
    (<identity>)" when the identities differ."""
    keys = IDENTITY_KEYS
    if found.get("encoder_sha256") and expected.get("encoder_sha256"):  # module docstring
        keys = ("encoder_sha256",) + IDENTITY_KEYS[1:]
    if {k: found.get(k) for k in keys} != {k: expected.get(k) for k in keys}:
        raise DataError(f"{argument}: {found_what} ({describe(found)}) is not "
                        f"{expected_what} ({describe(expected)})")


def _valid(identity) -> bool:
    if not isinstance(identity, dict) or not isinstance(identity.get("sha256"), str):
        return False
    ints = [identity.get(k) for k in ("vocab_size", "eos_id", "pad_id")]
    return all(isinstance(v, int) and not isinstance(v, bool) for v in ints) and \
        (identity.get("bos_id") is None or isinstance(identity.get("bos_id"), int))


def data_identity(meta: dict, where: str = "meta.json") -> dict | None:
    """meta.json's tokenizer identity; None for data prepared before it was recorded;
    DataError when it is not a valid record."""
    identity = meta["tokenizer"].get("identity")
    if identity is not None and not _valid(identity):
        raise DataError(f"{where}: tokenizer.identity must be {{{', '.join(IDENTITY_KEYS)}}}, "
                        f"got {identity!r}")
    return identity


def folder_files_sha256(folder: str | os.PathLike) -> str:
    """sha256 over "<name>\\0<sha256>\\n" of the folder's top-level files, sorted (the
    record of data prepared before identities)."""
    lines = []
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        lines.append(f"{path.name}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def data_tokenizer(data: str | os.PathLike, meta: dict, argument: str = "data"):
    """The tokenizer that prepared `data` (the folder its meta.json names), loaded and
    checked against the identity recorded there; DataError naming `argument` when that
    folder is missing, cannot be loaded or is not the one the data was prepared with."""
    path = Path(meta["tokenizer"]["path"])
    where = Path(data) / "meta.json"
    if not path.is_dir():
        raise DataError(f"{argument}: the tokenizer folder {path} named in {where} is "
                        f"missing (runs export it with the model); restore it, or prepare "
                        f"{data} again")
    try:
        tok = load_tokenizer(path)
    except DataError as e:
        raise DataError(f"{argument}: the tokenizer named in {where}: {e}") from None
    expected = data_identity(meta, str(where))
    if expected is not None:
        check_same(tokenizer_identity(tok), expected, f"the tokenizer folder {path}",
                   f"the tokenizer {data} was prepared with (recorded in {where})", argument)
    elif folder_files_sha256(path) != meta["tokenizer"].get("files_sha256"):
        raise DataError(f"{argument}: the files of the tokenizer folder {path} changed since "
                        f"{data} was prepared (files_sha256 in {where}); restore them, or "
                        f"prepare {data} again")
    return tok


def write_export_identity(folder: str | os.PathLike, identity: dict) -> Path:
    """Record `identity` in folder/IDENTITY_FILE (an export)."""
    return atomic_write_json(Path(folder) / IDENTITY_FILE, identity, indent=2)


def read_export_identity(folder: str | os.PathLike) -> dict | None:
    """The identity an export recorded, None when it recorded none; DataError when the
    record is damaged."""
    path = Path(folder) / IDENTITY_FILE
    try:
        identity = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a tokenizer identity ({e})") from None
    if not _valid(identity):
        raise DataError(f"{path}: not a tokenizer identity, got {identity!r}")
    return identity


def _model_vocab_size(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") if isinstance(config, dict) else None
    if size is None and isinstance(config, dict):  # multimodal configs nest it
        size = (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def model_tokenizer(folder: str | os.PathLike, argument: str = "model"):
    """(tokenizer, identity) of a model folder (an export, a teacher): the folder must hold
    a tokenizer, the one its export recorded (when it recorded one; that record is the
    identity returned) and no larger than its model's vocabulary (config.json vocab_size);
    DataError naming `argument` otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{argument}: {str(folder)!r} is not a folder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILE_NAMES):
        raise DataError(f"{argument}: {folder} holds no tokenizer (none of "
                        f"{', '.join(TOKENIZER_FILE_NAMES)}); save the tokenizer next to the "
                        "weights (tokenizer.save_pretrained)")
    try:
        tok = load_tokenizer(folder)
    except DataError as e:
        raise DataError(f"{argument}: {folder} holds no usable tokenizer ({e})") from None
    identity = tokenizer_identity(tok)
    recorded = read_export_identity(folder)
    if recorded is not None:
        check_same(identity, recorded, f"the tokenizer in {folder}",
                   f"the one its export recorded in {IDENTITY_FILE} (its files were "
                   "replaced after the export)", argument)
    rows = _model_vocab_size(folder)
    if rows is not None and len(tok) > rows:
        raise DataError(f"{argument}: the tokenizer in {folder} has {len(tok)} ids, more "
                        f"than its model's vocabulary ({rows}, config.json vocab_size)")
    return tok, identity if recorded is None else recorded


def prepared_identity(data: str | os.PathLike, meta: dict, argument: str = "data") -> dict:
    """The identity of the tokenizer `data` was prepared with: the one meta.json records,
    or for data prepared before identities that of its tokenizer folder (`data_tokenizer`
    checks the folder's files_sha256)."""
    recorded = data_identity(meta, str(Path(data) / "meta.json"))
    return recorded if recorded is not None else \
        tokenizer_identity(data_tokenizer(data, meta, argument))


def model_for_data(folder: str | os.PathLike, data: str | os.PathLike, meta: dict,
                   argument: str = "model"):
    """The tokenizer of the model folder `folder` (`model_tokenizer`), checked to be the one
    `data` was prepared with (`prepared_identity`): DataError naming `argument` and both
    identities otherwise."""
    tok, found = model_tokenizer(folder, argument)
    check_same(found, prepared_identity(data, meta), f"the tokenizer of {folder}",
               f"the one {data} was prepared with", argument)
    return tok
