"""`pathattn tokenizer`: train a byte-level BPE tokenizer, and load any tokenizer folder.

Training (`train_tokenizer`) uses the `tokenizers` library: a BPE model over bytes (GPT-2's
ByteLevel pre-tokenizer, which splits words, numbers, punctuation and whitespace runs, and
its decoder), so that every text has an encoding (no unknown token) and decoding gives
back the exact text. The initial alphabet is the 256 byte symbols, then merges up to
`vocab_size`; the special tokens `<|bos|>`, `<|eos|>`, `<|pad|>` take ids 0, 1, 2. The
documents are those of `pathattn.data.corpus` (the default corpus without inputs).

The folder is a Hugging Face `PreTrainedTokenizerFast` (tokenizer.json,
tokenizer_config.json, plus special_tokens_map.json for older readers) that loads with
`transformers.AutoTokenizer.from_pretrained(DIR)` with bos / eos / pad set, and
`pathattn_tokenizer.json` records how it was trained (sources and their hashes, Python
version for the default corpus). Calling the tokenizer on a text prepends `<|bos|>`
(add_bos_token), as `pathattn prepare` does for every document, so that prompts look like
the start of a training document; `pathattn prepare` itself encodes without special tokens
and adds them explicitly, whatever the tokenizer.

Any Hugging Face tokenizer folder can be used wherever a tokenizer is expected:
`load_tokenizer` only relies on `AutoTokenizer.from_pretrained` and its eos / bos / pad
ids, and refuses one without an eos token (documents must end with it).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

from ..utils.io import move_into_place, temp_dir
from ._files import package_versions, prepare_out_dir, write_json
from .corpus import CorpusReader, DataError, collect_sources

__all__ = ["train_tokenizer", "load_tokenizer", "special_ids", "SPECIAL_TOKENS",
           "TOKENIZER_FILES"]

SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "pathattn_tokenizer.json")
TEMP_NAME = "tokenizer"  # the temp folder .tokenizer.<8 hex>.tmp
BYTE_ALPHABET = 256
DEFAULT_VOCAB_SIZE = 32000


def _check_vocab_size(vocab_size) -> int:
    low = BYTE_ALPHABET + len(SPECIAL_TOKENS)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < low:
        raise DataError(f"vocab_size must be an int >= {low} (256 bytes + "
                        f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size!r}")
    return vocab_size


def require_text_packages() -> None:
    """DataError naming the install command when `tokenizers` or `transformers` (the
    `text` extra) is missing."""
    import importlib.util

    missing = [m for m in ("tokenizers", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise DataError(f"tokenizers and pretraining need the packages {missing}: "
                        "pip install 'pathattn[text]'")


def _bpe_tokenizer(texts, num_texts: int | None, vocab_size: int, min_frequency: int,
                   progress: bool):
    """A trained `tokenizers.Tokenizer` (module docstring)."""
    require_text_packages()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=progress,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=num_texts)
    return tok


def train_tokenizer(inputs=None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                    out: str | os.PathLike = "tokenizer", *, min_frequency: int = 2,
                    text_field: str = "text", overwrite: bool = False,
                    progress: bool = True) -> Path:
    """Train a byte-level BPE on the documents of `inputs` and save it to `out`.

    Args:
        inputs: files and folders (`pathattn.data.corpus`); None = the default corpus.
        vocab_size: size of the vocabulary, special tokens included (>= 259). A corpus too
            small to produce that many merges gives a smaller one.
        out: the tokenizer folder (refused when not empty, unless `overwrite`).
        min_frequency: pairs seen fewer times are not merged.
        text_field: the text field of JSON Lines / parquet records.
        overwrite: replace the tokenizer files of a non-empty `out` (nothing else there).
        progress: show the trainer's progress bar.

    Returns the folder.
    """
    from transformers import PreTrainedTokenizerFast

    _check_vocab_size(vocab_size)
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or \
            min_frequency < 0:
        raise DataError(f"min_frequency must be a non-negative int, got {min_frequency!r}")
    reader = CorpusReader(collect_sources(inputs), text_field)
    out = prepare_out_dir(out, TOKENIZER_FILES, overwrite, temp_names=(TEMP_NAME,))
    num_texts = reader.num_files if reader.only_text_files else None
    tok = _bpe_tokenizer(reader.texts(), num_texts, vocab_size, min_frequency, progress)
    if sum(m["documents"] for m in reader.sources_meta()) == 0:
        raise DataError(f"empty corpus: inputs {inputs!r} hold no document")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, add_bos_token=True, **SPECIAL_TOKENS)
    info = dict(vocab_size=len(hf), requested_vocab_size=vocab_size,
                min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
                sources=reader.sources_meta(), python=platform.python_version(),
                versions=package_versions("tokenizers", "transformers"))
    _save(hf, out, info)
    return out


def _save(hf, out: Path, info: dict) -> None:
    """Write the tokenizer files to `out`: saved to a temp folder inside it, then each
    moved into place (`move_into_place`: fsync, rename) with the record last."""
    tmp = temp_dir(out, TEMP_NAME)
    try:
        hf.save_pretrained(tmp)
        config_path = tmp / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        # the class name that transformers 4 and 5 both load (5 maps it to its backend)
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        write_json(config_path, config)
        write_json(tmp / "special_tokens_map.json", SPECIAL_TOKENS)
        for name in TOKENIZER_FILES[:-1]:
            move_into_place(tmp / name, out / name)
        write_json(out / "pathattn_tokenizer.json", info)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(path: str | os.PathLike):
    """`AutoTokenizer.from_pretrained(path)`; DataError when it cannot be loaded or has no
    eos token."""
    require_text_packages()
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise DataError(f"tokenizer: {str(path)!r} is not a folder (train one with "
                        "`pathattn tokenizer --out DIR`, or give a Hugging Face tokenizer "
                        "folder)")
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise DataError(f"tokenizer: cannot load {str(path)!r} with AutoTokenizer: {e}") \
            from None
    if tok.eos_token_id is None:
        raise DataError(f"tokenizer: {str(path)!r} has no eos token (eos_token_id is None); "
                        "documents must end with one: set eos_token in its "
                        "tokenizer_config.json")
    return tok


def special_ids(tok) -> dict[str, int | None]:
    """{"bos_id", "eos_id", "pad_id"} of a loaded tokenizer (bos / pad None when absent;
    the pad id falls back to the eos id, pad positions are never scored)."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return {"bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id, "pad_id": pad}
