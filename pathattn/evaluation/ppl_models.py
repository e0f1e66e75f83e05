"""The model folders that `pathattn eval ppl` evaluates: find, check and load them, and run
the perplexity evaluation (`pathattn.evaluation.ppl`) over several of them.

A model folder is one written by `save_pretrained` and loadable by
`AutoModelForCausalLM.from_pretrained`: the hf folder of a `pathattn pretrain` run
(RUN/hf) or any Hugging Face causal LM, with the tokenizer the data was prepared with saved
next to the weights. `check_model_folder` checks a folder against the data before any model
is loaded: a config.json, a tokenizer file, and a tokenizer that is the data's (vocabulary
size and special ids, then the vocabulary and a probe text against the data's tokenizer
folder, or, when that folder is gone, the data's first document decoded and re-encoded). It
also reads the length the model was trained at (`train_length`: RUN/config.json's seq_len
for a `pathattn pretrain` export, otherwise the config's max_position_embeddings or
n_positions), drawn as a dashed line in the loss-by-position plot. `load_model` loads a
checked folder in float32 on the evaluation device.

`evaluate_models` checks every argument and every folder first, so a bad folder fails
before any model is loaded, then loads and evaluates the models one at a time and
returns the report that `pathattn eval ppl` prints and writes to ppl.json.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..data.tokenizer import TOKENIZER_FILE_NAMES
from ..utils import DTYPES, is_int
from .ppl import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_LENGTHS,
    PplError,
    check_enough_tokens,
    check_lengths,
    document_windows,
    evaluate_documents,
    evaluate_ppl,
    held_out_documents,
    num_windows,
    open_split,
)

__all__ = ["ModelFolder", "evaluate_models", "check_model_folder", "load_model",
           "train_length"]

PROBE_TEXT = "def probe(x):\n    return {'h\u00e9llo': x + 1}  # \u4e16\u754c\n"


@dataclass
class ModelFolder:
    """A model folder checked against the data: name (the folder's name, or the run's
    for a `pathattn pretrain` RUN/hf), path, tokenizer (loaded), train_length (None when
    unknown) and train_length_source."""

    name: str
    path: Path
    tokenizer: object
    train_length: int | None
    train_length_source: str | None


def train_length(path: str | os.PathLike, config=None) -> tuple[int | None, str | None]:
    """(the length the model was trained at, where it was read) or (None, None).

    A `pathattn pretrain` export RUN/hf reads RUN/config.json's seq_len (the training
    length itself); otherwise the model config's max_position_embeddings (or n_positions),
    the longest context its authors meant it for."""
    import json

    path = Path(path)
    run_config = path.parent / "config.json"
    if path.name == "hf" and run_config.is_file():
        try:
            seq_len = json.loads(run_config.read_text()).get("seq_len")
        except (OSError, ValueError, AttributeError):
            seq_len = None
        if is_int(seq_len) and seq_len > 0:
            return int(seq_len), f"{run_config} seq_len"
    for attr in ("max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if is_int(value) and value > 0:
            return int(value), f"config.json {attr}"
    return None, None


def _tokenizer_mismatch(tok, meta: dict, first_doc: np.ndarray | None) -> str | None:
    """Why `tok` is not the tokenizer of the data (meta.json "tokenizer" record), or None.
    The identities must match (`pathattn.data.identity`); for data prepared before they
    were recorded, vocabulary size and special ids must match; then, when the data's
    tokenizer folder is still there, the vocabularies and the ids of a probe text;
    otherwise the data's first document (without BOS / EOS) must decode and re-encode to
    the same ids."""
    from ..data import DataError, load_tokenizer, special_ids
    from ..data.identity import check_same, describe, tokenizer_identity

    recorded = meta.get("identity")  # `pathattn.data.identity`; absent in older data
    if isinstance(recorded, dict):
        found = tokenizer_identity(tok)
        try:
            check_same(found, recorded, "", "", "")
        except DataError:
            return f"its identity is {describe(found)}, the data's {describe(recorded)}"
        return None
    if len(tok) != meta["vocab_size"]:
        return f"{len(tok)} tokens, the data's tokenizer has {meta['vocab_size']}"
    ids = special_ids(tok)
    for key, value in ids.items():
        if meta.get(key) != value:
            return f"{key} {value}, the data's tokenizer has {meta.get(key)}"
    try:
        ref = load_tokenizer(meta["path"]) if Path(meta["path"]).is_dir() else None
    except DataError:
        ref = None
    if ref is not None:
        if ref.get_vocab() != tok.get_vocab():
            return f"its vocabulary differs from the data's tokenizer ({meta['path']})"
        mine, theirs = (t.encode(PROBE_TEXT, add_special_tokens=False) for t in (tok, ref))
        return None if mine == theirs else f"it encodes {PROBE_TEXT!r} as {mine[:8]}..., " \
            f"the data's tokenizer as {theirs[:8]}..."
    if first_doc is not None and len(first_doc):
        doc = [int(i) for i in first_doc if i not in (ids["bos_id"], ids["eos_id"])]
        again = tok.encode(tok.decode(doc), add_special_tokens=False)
        if again != doc:
            return "it does not re-encode the data's first document to the stored ids"
    return None


def check_model_folder(path: str | os.PathLike, meta: dict,
                       first_doc: np.ndarray | None = None) -> ModelFolder:
    """Check a model folder before any evaluation: a folder with a config.json and a
    tokenizer that is the data's (`meta`: meta.json's "tokenizer" record; `first_doc`: the
    data's first held-out document, used when the data's tokenizer folder is gone).
    PplError("model") otherwise."""
    from transformers import AutoConfig

    from ..data import DataError
    from ..data.identity import model_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise PplError("model", f"{str(path)!r} is not a folder")
    if not (path / "config.json").is_file():
        raise PplError("model", f"{path} has no config.json (a folder written by "
                       "save_pretrained, e.g. the hf folder of a `pathattn pretrain` run)")
    if not any((path / name).is_file() for name in TOKENIZER_FILE_NAMES):
        names = ", ".join(TOKENIZER_FILE_NAMES)
        raise PplError("model", f"{path} holds no tokenizer (none of {names}); save the "
                       "data's tokenizer next to the weights (tokenizer.save_pretrained)")
    try:  # also the tokenizer its export recorded, and no larger than the model
        tok, _ = model_tokenizer(path, "model")
    except DataError as e:
        raise PplError("model", f"{str(e).removeprefix('model: ')}; save the data's "
                       "tokenizer next to the weights (tokenizer.save_pretrained)") from None
    why = _tokenizer_mismatch(tok, meta, first_doc)
    if why is not None:
        raise PplError("model", f"the tokenizer of {path} is not the one the data was "
                       f"prepared with: {why}")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise PplError("model", f"{path}: cannot read config.json ({e})") from None
    name = path.resolve().parent.name if path.resolve().name == "hf" else path.resolve().name
    return ModelFolder(name, path, tok, *train_length(path, config))


def load_model(folder: ModelFolder, vocab_size: int, device: str | torch.device = "cpu"
               ) -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained` (float32) on `device`, in eval mode;
    PplError("model") when it cannot be loaded, holds a weight that is not finite or its
    embedding has fewer than vocab_size rows."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from ..train.divergence import non_finite_parameters

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the evaluation's own bar is enough
    try:
        model = AutoModelForCausalLM.from_pretrained(folder.path, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise PplError("model", f"{folder.path}: cannot load it with "
                       f"AutoModelForCausalLM ({e})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    bad = non_finite_parameters(model.state_dict().items())
    if bad:
        raise PplError("model", f"{folder.path} holds weights that are not finite ({bad[0]}"
                       f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}): a diverged "
                       "training; evaluate a finite checkpoint")
    rows = model.get_input_embeddings().num_embeddings
    if rows < vocab_size:
        raise PplError("model", f"{folder.path}: its embedding has {rows} rows, fewer than "
                       f"the data's {vocab_size} token ids")
    return model.to(device).eval()


# ------------------------------------------------------------------------ report

def evaluate_models(model_dirs: Sequence[str | os.PathLike], data: str | os.PathLike,
                    lengths: Sequence[int] = DEFAULT_LENGTHS, *, split: str = "val",
                    max_docs: int | None = None, batch_size: int = 1,
                    chunk_size: int | None = DEFAULT_CHUNK_SIZE, dtype: str = "float32",
                    device: str | torch.device = "cpu", progress: bool = False,
                    per_document: bool = False) -> dict:
    """`evaluate_ppl` of every model folder on the held-out stream of `data`, or with
    per_document `evaluate_documents` of its held-out documents (the windows and metrics:
    `pathattn.evaluation.ppl`).

    Every argument is checked, and every folder against the data's tokenizer, before the
    first model is loaded; the models are then loaded and evaluated one at a time.
    Returns the report written to ppl.json: {"data", "split", "mode" ("windows" or
    "per-document"), "documents", "tokens" (held-out tokens, BOS / EOS included),
    "lengths", "dtype", "models": [{"name", "path", "train_length",
    "train_length_source", "chunked_head", "ppl", "loss", "windows", "tokens" (dicts by
    length, string keys), "loss_by_position": {"length", "windows", "bins"}}]}.
    """
    lengths = check_lengths(lengths)
    if isinstance(model_dirs, (str, os.PathLike)) or not model_dirs:
        raise PplError("model", f"must be a non-empty list of folders, got {model_dirs!r}")
    if dtype not in DTYPES:
        raise PplError("dtype", f"must be one of {DTYPES}, got {dtype!r}")
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise PplError("device", f"{device}: not usable here ({e})") from None
    dataset, documents = open_split(data, split, max_docs)
    stream, meta = dataset.tokens[:dataset.offsets[documents]], dataset.meta
    if per_document:
        docs, prefix_id = held_out_documents(data, split, max_docs)
        total = sum(len(document_windows(len(d), L)) for d in docs for L in lengths)
    else:
        check_enough_tokens(len(stream), lengths, f"the {split!r} split" + (
            f" (its first {documents} documents)" if documents < dataset.num_documents
            else ""))
        total = sum(num_windows(len(stream), L) for L in lengths)
    folders = [check_model_folder(d, meta["tokenizer"], np.asarray(dataset[0]))
               for d in model_dirs]
    _dedupe_names(folders)
    report = {"data": str(data), "split": split,
              "mode": "per-document" if per_document else "windows", "documents": documents,
              "tokens": len(stream), "lengths": lengths, "dtype": dtype, "models": []}
    with tqdm(total=len(folders) * total, unit="window", disable=not progress) as bar:
        for folder in folders:
            model = load_model(folder, meta["tokenizer"]["vocab_size"], device)
            bar.set_description(folder.name)
            options = dict(batch_size=batch_size, chunk_size=chunk_size, dtype=dtype,
                           progress=bar)
            try:
                res = (evaluate_documents(model, docs, prefix_id, lengths, **options)
                       if per_document else evaluate_ppl(model, stream, lengths, **options))
            except RuntimeError as e:  # e.g. a model with learned positions at a long L
                raise PplError("model", f"{folder.path} failed on the windows: {e}") from e
            del model
            report["models"].append(_model_record(folder, res))
    return report


def _dedupe_names(folders: list[ModelFolder]) -> None:
    """Give equal names a suffix " (2)", " (3)" ... so each model has its own label."""
    seen: dict[str, int] = {}
    for f in folders:
        seen[f.name] = seen.get(f.name, 0) + 1
        if seen[f.name] > 1:
            f.name = f"{f.name} ({seen[f.name]})"


def _model_record(folder: ModelFolder, res: dict) -> dict:
    def by_length(values: dict) -> dict:
        return {str(L): values[L] for L in res["lengths"]}

    longest = res["lengths"][-1]
    return {"name": folder.name, "path": str(folder.path), "train_length": folder.train_length,
            "train_length_source": folder.train_length_source,
            "chunked_head": res["chunked_head"], "ppl": by_length(res["ppl"]),
            "loss": by_length(res["loss"]), "windows": by_length(res["windows"]),
            "tokens": by_length(res["tokens"]),
            "loss_by_position": {"length": longest, "windows": res["windows"][longest],
                                 "bins": res["loss_by_position"]}}
