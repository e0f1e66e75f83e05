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
from ..utils.system import check_fits_memory
from ._files import package_versions, prepare_out_dir, write_json
from .corpus import CorpusReader, DataError, collect_sources, file_kind

__all__ = ["train_tokenizer", "load_tokenizer", "special_ids", "SPECIAL_TOKENS",
           "TOKENIZER_FILES", "TOKENIZER_FILE_NAMES", "MAX_VOCAB_SIZE"]

SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "pathattn_tokenizer.json")
# any of these files in a folder means a tokenizer was saved there
TOKENIZER_FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                        "vocab.json")
TEMP_NAME = "tokenizer"  # the temp folder .tokenizer.<8 hex>.tmp
BYTE_ALPHABET = 256
DEFAULT_VOCAB_SIZE = 32000


MAX_VOCAB_SIZE = 2 ** 32  # ids must fit the uint32 token files of `pathattn prepare`
BPE_BYTES_PER_TOKEN = 66  # what the `tokenizers` BPE trainer reserves per requested token


def _check_vocab_size(vocab_size) -> int:
    low = BYTE_ALPHABET + len(SPECIAL_TOKENS)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or \
            not low <= vocab_size <= MAX_VOCAB_SIZE:
        raise DataError(f"vocab_size must be an int in [{low}, 2**32] (256 bytes + "
                        f"{len(SPECIAL_TOKENS)} special tokens; ids fit uint32), got "
                        f"{vocab_size!r}")
    return vocab_size


def _trainer_vocab_size(vocab_size: int, reader: CorpusReader) -> int:
    """The size asked of the BPE trainer: vocab_size, capped by what the corpus can give
    (every merge needs a pair of adjacent symbols, so at most one new token per byte of
    text and JSON Lines files; parquet text is compressed, so no cap there). The trainer
    reserves memory for every requested token up front (and aborts the process when it
    cannot), so a size that cannot fit is refused here (DataError)."""
    low = BYTE_ALPHABET + len(SPECIAL_TOKENS)
    files = [f for s in reader.sources for f in s.files]
    if all(file_kind(f) != "parquet" for f in files):
        vocab_size = min(vocab_size, low + sum(f.stat().st_size for f in files))
    try:
        check_fits_memory(BPE_BYTES_PER_TOKEN * vocab_size,
                          f"vocab_size {vocab_size}: the BPE trainer")
    except ValueError as e:
        raise DataError(str(e)) from None
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
        vocab_size: size of the vocabulary, special tokens included (259 to 2**32). A
            corpus too small to produce that many merges gives a smaller one.
        out: the tokenizer folder (refused when not empty, unless `overwrite`; locked
            while written, `pathattn.utils.folder_lock`).
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
    trainer_vocab = _trainer_vocab_size(vocab_size, reader)
    with prepare_out_dir(out, TOKENIZER_FILES, overwrite, temp_names=(TEMP_NAME,),
                         user="pathattn tokenizer") as out:
        num_texts = reader.num_files if reader.only_text_files else None
        counted = [0]  # non-empty documents: empty texts teach the trainer nothing

        def texts():
            for text in reader.texts():
                if text:
                    counted[0] += 1
                    yield text

        tok = _bpe_tokenizer(texts(), num_texts, trainer_vocab, min_frequency, progress)
        if counted[0] == 0:
            raise DataError(f"empty corpus: inputs {inputs!r} hold no non-empty document")
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, add_bos_token=True,
                                     **SPECIAL_TOKENS)
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
    """`AutoTokenizer.from_pretrained(path)`; DataError when `path` holds none of
    `TOKENIZER_FILE_NAMES`, or the tokenizer cannot be loaded or has no eos token."""
    require_text_packages()
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise DataError(f"tokenizer: {str(path)!r} is not a folder (train one with "
                        "`pathattn tokenizer --out DIR`, or give a Hugging Face tokenizer "
                        "folder)")
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILE_NAMES):
        raise DataError(f"tokenizer: {str(path)!r} holds no tokenizer (none of "
                        f"{', '.join(TOKENIZER_FILE_NAMES)})")
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
