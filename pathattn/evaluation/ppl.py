"""Perplexity by context length and loss by token position of a model object on held-out
token streams: how well a language model uses (and extrapolates to) long contexts, the
length-extrapolation curve of the paper's language-modelling evaluation (section 4.2). The
model folders that `pathattn eval ppl` checks and loads are `pathattn.evaluation.ppl_models`.

Data: the held-out documents of a prepared folder (`pathattn prepare`, split "val" by
default), concatenated in stored order. Each stored document already starts with BOS (when
the tokenizer has one) and ends with EOS, so the stream is the documents joined by their
separators, and a window may span several documents (code files are often shorter than
the lengths of interest); the model sees the separators and the earlier documents, as a
model trained on plain windows does.

Windows: for a length L, window w is inputs stream[w L : w L + L] and targets
stream[w L + 1 : w L + L + 1] (the next token), for w = 0 .. (N - 1) // L - 1: the windows
tile the stream without overlap, every window is scored at all its L positions, and
position p (1-based) is the prediction made from p tokens of context. Every window starts
the model afresh (position 0, no cache).

Per-document mode (`evaluate_documents`, `pathattn eval ppl --per-document`): each
held-out document is scored alone, the way lm-evaluation-harness scores a document with
`loglikelihood_rolling` (pathattn's lm-eval wrapper, `pathattn.evaluation.lmeval`): its
tokens without BOS / EOS are predicted from its first token on, after one prefix token (BOS,
or EOS for a tokenizer without BOS), in windows of at most L inputs (`document_windows`:
the first window predicts the first L tokens, every later one the next up to L tokens from
the L tokens before them, each token scored once). The EOS is not scored. The perplexity of
a length L is then the lm-eval wrapper's token perplexity with max_length L on the same
documents (tested). Documents shorter than L are scored at their own length, so short code
files say little about long contexts: the window mode is the length-extrapolation metric.

Metrics, per model: loss[L] and ppl[L], the mean next-token cross-entropy over every
position of every window of length L and exp of it; position_loss, the mean loss at each
position 1 .. Lmax over the windows of the longest length Lmax; loss_by_position, that
averaged in log-spaced bins, `bins_per_octave` per doubling of the position.

Memory: the model body runs once per batch of windows, the LM head and the cross-entropy
over chunks of `chunk_size` positions (`Scorer`), so the [T, V] logits never exist at once;
with pathattn models (blockwise attention) the evaluation is linear in the length.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..utils import DTYPES, autocast_context, is_int

__all__ = ["PplError", "Scorer", "evaluate_ppl", "loss_by_position", "token_losses",
           "open_split", "held_out_tokens", "check_lengths", "check_enough_tokens",
           "num_windows", "document_windows", "held_out_documents", "evaluate_documents",
           "DEFAULT_LENGTHS", "DEFAULT_CHUNK_SIZE", "DTYPES"]

DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
DEFAULT_CHUNK_SIZE = 512  # tokens per LM-head chunk: 512 x V float32 logits at a time


class PplError(ValueError):
    """Bad input of the evaluation; `argument` names the parameter (or command-line
    option without its dashes) at fault, and the message starts with it."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument, self.message = argument, message


# ---------------------------------------------------------------------- checking

def check_lengths(lengths: Sequence[int]) -> list[int]:
    """The distinct lengths, ascending; PplError("lengths") unless positive ints."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise PplError("lengths", f"must be a non-empty list of positive ints, got {lengths!r}")
    bad = [length for length in lengths if not is_int(length) or length < 1]
    if bad:
        raise PplError("lengths", f"must be positive ints, got {bad}")
    return sorted({int(length) for length in lengths})


def num_windows(num_tokens: int, length: int) -> int:
    """Windows of `length` inputs (+1 target) that tile a stream of num_tokens tokens."""
    return max(0, (num_tokens - 1) // length)


def check_enough_tokens(num_tokens: int, lengths: Sequence[int], where: str = "") -> None:
    """PplError("lengths") when the longest length has no full window in the stream."""
    longest = max(lengths)
    if num_windows(num_tokens, longest) == 0:
        raise PplError("lengths", f"{longest} needs {longest + 1} held-out tokens (a window "
                       f"plus its next token), but {where or 'the stream'} has {num_tokens}; "
                       f"the longest usable length is {max(num_tokens - 1, 0)}")


def open_split(data: str | os.PathLike, split: str = "val", max_docs: int | None = None):
    """(the `TokenDataset` of a prepared folder's split, the number of its documents used:
    max_docs or all); PplError as `held_out_tokens`."""
    from ..data import DataError, TokenDataset
    from ..data.prepare import SPLITS

    if split not in SPLITS:
        raise PplError("split", f"must be one of {SPLITS}, got {split!r}")
    if max_docs is not None and (not is_int(max_docs) or max_docs < 1):
        raise PplError("max_docs", f"must be a positive int, got {max_docs!r}")
    if not Path(data).is_dir():
        raise PplError("data", f"{str(data)!r} is not a folder (make one with `pathattn "
                       "prepare`)")
    try:
        dataset = TokenDataset(data, split)
    except DataError as e:
        raise PplError("data", str(e)) from None
    if dataset.num_documents == 0:
        raise PplError("split", f"the {split!r} split of {data} holds no document")
    docs = dataset.num_documents if max_docs is None else min(max_docs, dataset.num_documents)
    return dataset, docs


def held_out_tokens(data: str | os.PathLike, split: str = "val",
                    max_docs: int | None = None) -> np.ndarray:
    """The token stream of a prepared folder's split (module docstring): the first
    `max_docs` documents (all when None), a read-only view [N] of uint16 / uint32 ids.
    PplError("data" / "split" / "max_docs") for a folder that is not a prepared one, an
    unknown or empty split, or a max_docs that is not a positive int."""
    dataset, docs = open_split(data, split, max_docs)
    return dataset.tokens[:dataset.offsets[docs]]


def held_out_documents(data: str | os.PathLike, split: str = "val",
                       max_docs: int | None = None) -> tuple[list[np.ndarray], int]:
    """(documents, prefix id) of a prepared folder's split for the per-document mode
    (module docstring): the first `max_docs` documents (all when None), each a read-only
    view [n] of its stored ids without the leading BOS and the trailing EOS, and the prefix
    token that starts every document's first window (BOS, or EOS without one).
    PplError as `held_out_tokens`."""
    dataset, docs = open_split(data, split, max_docs)
    bos, eos = dataset.bos_id, dataset.eos_id
    documents = []
    for d in range(docs):
        ids = dataset[d]  # [n + 2] with BOS, [n + 1] without
        start = 1 if bos is not None and len(ids) and ids[0] == bos else 0
        end = len(ids) - 1 if len(ids) > start and ids[-1] == eos else len(ids)
        documents.append(ids[start:end])
    return documents, (eos if bos is None else bos)


# ------------------------------------------------------------------------ scoring

def _hidden_states(body: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The base model's final hidden states [B, T, hidden] (after its final norm)."""
    out = body(input_ids=input_ids, use_cache=False, return_dict=True)
    return out.last_hidden_state


def _full_logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The causal LM's own forward: logits [B, T, V]."""
    return model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def _cross_entropy_chunks(features: torch.Tensor, targets: torch.Tensor, chunk: int,
                          head: nn.Module | None) -> torch.Tensor:
    """Per-token cross-entropy [N] float32 of features [N, hidden] through `head` (or
    features = logits [N, V] when head is None) against targets [N], `chunk` rows at a
    time; the logits are cast to float32 (float64 for a float64 model)."""
    N = features.shape[0]
    out = torch.empty(N, dtype=torch.promote_types(features.dtype, torch.float32),
                      device=features.device)
    for s in range(0, N, chunk):
        logits = features[s:s + chunk] if head is None else head(features[s:s + chunk])
        logits = logits.to(out.dtype)  # [C, V]
        out[s:s + chunk] = F.cross_entropy(logits, targets[s:s + chunk], reduction="none")
    return out


@dataclass
class Scorer:
    """Next-token losses of a causal LM, with the LM head applied in chunks where it can
    be split off.

    Split: the base model (`model.base_model`, e.g. `PaTHForCausalLM.model` or
    `LlamaForCausalLM.model`) gives the final hidden states, and
    `model.get_output_embeddings()` (the LM head) maps `chunk_size` of them at a time to
    logits, so the [T, V] logits never exist at once. Some models change the logits after
    the head (soft-capping, scaling) or have no separate head, so `Scorer.of` decides once
    per model, by comparing the split with the model's own forward on a short probe; where
    they differ it falls back to the full forward (logits [B, T, V] at once) and chunks only
    the cross-entropy.

    Attributes: model, body (None = full forward), head, chunk_size (tokens per chunk;
    None = one chunk, the unchunked computation).
    """

    model: nn.Module
    body: nn.Module | None
    head: nn.Module | None
    chunk_size: int | None = DEFAULT_CHUNK_SIZE

    @classmethod
    def of(cls, model: nn.Module, chunk_size: int | None = DEFAULT_CHUNK_SIZE,
           probe_ids: torch.Tensor | None = None) -> Scorer:
        """The scorer of `model` (class docstring); probe_ids int [1, T] (default 16 ids
        below the vocabulary size) checks the split."""
        if chunk_size is not None and (not is_int(chunk_size) or chunk_size < 1):
            raise PplError("chunk_size", f"must be None or a positive int, got {chunk_size!r}")
        body, head = getattr(model, "base_model", model), model.get_output_embeddings()
        if body is model or head is None:
            return cls(model, None, None, chunk_size)
        if probe_ids is None:
            vocab = model.get_input_embeddings().num_embeddings
            probe_ids = (torch.arange(16) * 7919 % vocab)[None]  # [1, 16]
        device = next(model.parameters()).device
        probe_ids = probe_ids.to(device)
        with torch.no_grad():
            full = _full_logits(model, probe_ids).float()  # [1, T, V]
            try:
                split = head(_hidden_states(body, probe_ids)).float()
            except (TypeError, ValueError, AttributeError, RuntimeError):
                return cls(model, None, None, chunk_size)  # a base model of another API
        same = split.shape == full.shape and torch.allclose(
            split, full, rtol=1e-4, atol=1e-4 * max(float(full.abs().max()), 1.0))
        return cls(model, body, head, chunk_size) if same else cls(model, None, None,
                                                                    chunk_size)

    @property
    def chunked_head(self) -> bool:
        return self.body is not None

    @torch.no_grad()
    def losses(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy [B, T] float32 of the prediction at every position of input_ids
        int [B, T] against targets int [B, T] (targets[:, t] = the token after
        input_ids[:, t])."""
        B, T = input_ids.shape
        targets = targets.reshape(-1).long()  # [B * T]
        chunk = B * T if self.chunk_size is None else self.chunk_size
        if self.body is None:
            features, head = _full_logits(self.model, input_ids), None  # [B, T, V]
        else:
            features, head = _hidden_states(self.body, input_ids), self.head  # [B, T, hidden]
        features = features.reshape(B * T, -1)  # [B * T, hidden or V]
        return _cross_entropy_chunks(features, targets, chunk, head).float().view(B, T)


def token_losses(model: nn.Module, input_ids: torch.Tensor, targets: torch.Tensor,
                 chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Per-position cross-entropy [B, T] float32 of a causal LM: input_ids int [B, T],
    targets int [B, T] (the next tokens). `Scorer.of(model, chunk_size).losses(...)`."""
    return Scorer.of(model, chunk_size).losses(input_ids, targets)


def _ids(tokens: np.ndarray) -> torch.Tensor:
    """int64 tensor of a slice of the stream (only the slice is converted)."""
    return torch.from_numpy(np.asarray(tokens, dtype=np.int64))


def _autocast(dtype: str, device: torch.device):
    if dtype not in DTYPES:
        raise PplError("dtype", f"must be one of {DTYPES}, got {dtype!r}")
    return autocast_context(dtype, device)


@torch.no_grad()
def evaluate_ppl(model: nn.Module, tokens, lengths: Sequence[int] = DEFAULT_LENGTHS, *,
                 batch_size: int = 1, chunk_size: int | None = DEFAULT_CHUNK_SIZE,
                 dtype: str = "float32", bins_per_octave: int = 4,
                 progress: bool | tqdm = False, name: str | None = None) -> dict:
    """Perplexity at each length and loss by position of a causal LM (module docstring).

    Args:
        model: a Hugging Face causal LM (pathattn's `PaTHForCausalLM`, or any
            `AutoModelForCausalLM`), on the device to evaluate on; put in eval mode and back.
        tokens: the token stream, int array-like [N] (e.g. `held_out_tokens(...)`).
        lengths: context lengths L (positive ints); every one needs N >= L + 1.
        batch_size: windows per forward pass.
        chunk_size: tokens per LM-head chunk (`Scorer`); None = all logits at once.
        dtype: "float32", or "bfloat16" autocast (the losses are float32 either way).
        bins_per_octave: resolution of `loss_by_position`.
        progress: a tqdm bar over the windows (True: a new one), or False.
        name: the bar's label.

    Returns {"lengths": [L...], "loss": {L: mean loss}, "ppl": {L: exp(loss)},
    "windows": {L: count}, "tokens": {L: scored positions}, "chunked_head": bool,
    "position_loss": float64 np.ndarray [Lmax] (mean loss at positions 1 .. Lmax over the
    windows of Lmax), "loss_by_position": the bins of it (`loss_by_position`)}.
    """
    lengths = check_lengths(lengths)
    if not is_int(batch_size) or batch_size < 1:
        raise PplError("batch_size", f"must be a positive int, got {batch_size!r}")
    device = next(model.parameters()).device
    _autocast(dtype, device)  # checks dtype
    stream = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)  # [N]
    if stream.ndim != 1 or not np.issubdtype(stream.dtype, np.integer):
        raise PplError("tokens", f"must be a 1-D array of int ids, got {stream.dtype} "
                       f"{stream.shape}")
    check_enough_tokens(len(stream), lengths)
    counts = {L: num_windows(len(stream), L) for L in lengths}
    was_training = model.training
    model.eval()
    bar = progress if isinstance(progress, tqdm) else tqdm(
        total=sum(counts.values()), unit="window", desc=name, disable=not progress)
    try:
        scorer = Scorer.of(model, chunk_size, _ids(stream[:16])[None])
        result = {"lengths": lengths, "loss": {}, "ppl": {}, "windows": counts, "tokens": {},
                  "chunked_head": scorer.chunked_head}
        for L in lengths:
            position_sum = torch.zeros(L, dtype=torch.float64)  # [L]
            for w0 in range(0, counts[L], batch_size):
                B = min(batch_size, counts[L] - w0)  # windows w0 .. w0 + B - 1
                block = _ids(stream[w0 * L:(w0 + B) * L + 1]).to(device)  # [B L + 1]
                with _autocast(dtype, device):
                    loss = scorer.losses(block[:-1].view(B, L), block[1:].view(B, L))
                position_sum += loss.double().sum(0).cpu()  # [L]
                bar.update(B)
            mean = float(position_sum.sum()) / (counts[L] * L)
            result["loss"][L], result["ppl"][L] = mean, math.exp(min(mean, 700.0))
            result["tokens"][L] = counts[L] * L
        position_loss = (position_sum / counts[lengths[-1]]).numpy()  # [Lmax]
    finally:
        model.train(was_training)
        if bar is not progress:
            bar.close()
    result["position_loss"] = position_loss
    result["loss_by_position"] = loss_by_position(position_loss, bins_per_octave)
    return result


def document_windows(num_tokens: int, max_length: int) -> list[tuple[int, int]]:
    """The windows that score a document of `num_tokens` tokens alone, in the order
    lm-evaluation-harness's rolling log-likelihood uses (one token of context carried over,
    windows made disjoint): (end, scored) pairs over the sequence s = [prefix] + tokens. A
    window's inputs are s[max(end - max_length, 0) : end], its targets the next tokens
    s[... + 1 : end + 1], and its last `scored` targets, tokens[end - scored : end], are
    scored. The first window predicts tokens[:min(max_length, num_tokens)] from the prefix
    on; each later one the next min(max_length, rest) tokens with max_length inputs, so
    every token is scored exactly once and every window has min(max_length, num_tokens)
    inputs. No window for an empty document."""
    if not is_int(max_length) or max_length < 1:
        raise PplError("lengths", f"must be positive ints, got {max_length!r}")
    if num_tokens < 1:
        return []
    first = min(max_length, num_tokens)
    windows, predicted = [(first, first)], first
    while predicted < num_tokens:
        scored = min(num_tokens - predicted, max_length)
        predicted += scored
        windows.append((predicted, scored))
    return windows


@torch.no_grad()
def evaluate_documents(model: nn.Module, documents: Sequence, prefix_id: int,
                       lengths: Sequence[int] = DEFAULT_LENGTHS, *, batch_size: int = 1,
                       chunk_size: int | None = DEFAULT_CHUNK_SIZE, dtype: str = "float32",
                       bins_per_octave: int = 4, progress: bool | tqdm = False,
                       name: str | None = None) -> dict:
    """Perplexity of a causal LM with every document scored alone (module docstring,
    per-document mode), for windows of at most L inputs at each length L.

    Args:
        model: a Hugging Face causal LM, on the device to evaluate on.
        documents: the documents, each an int array-like [n] of the tokens to predict
            (no BOS / EOS; e.g. `held_out_documents(...)[0]`); empty ones are skipped.
        prefix_id: the token before each document's first token (BOS, or EOS).
        lengths: the longest windows L (positive ints); any document length works.
        batch_size: windows of one document per forward pass.
        chunk_size, dtype, bins_per_octave, progress, name: as in `evaluate_ppl`.

    Returns the keys of `evaluate_ppl`, with "windows" {L: windows over all documents},
    "tokens" {L: scored tokens, the same for every L}, "documents" (count), and
    "position_loss" float64 [longest document] (mean loss at each position 1 .. n of a
    document, position p predicting its p-th token, over the documents that reach p, with
    windows of the longest L).
    """
    lengths = check_lengths(lengths)
    if not is_int(batch_size) or batch_size < 1:
        raise PplError("batch_size", f"must be a positive int, got {batch_size!r}")
    device = next(model.parameters()).device
    _autocast(dtype, device)  # checks dtype
    docs = [d if isinstance(d, np.ndarray) else np.asarray(d, dtype=np.int64)
            for d in documents]
    if any(d.ndim != 1 or (len(d) and not np.issubdtype(d.dtype, np.integer)) for d in docs):
        raise PplError("documents", "must be 1-D arrays of int ids")
    docs = [d for d in docs if len(d)]
    if not docs:
        raise PplError("documents", "holds no token to score")
    counts = {L: sum(len(document_windows(len(d), L)) for d in docs) for L in lengths}
    longest = max(len(d) for d in docs)
    was_training = model.training
    model.eval()
    bar = progress if isinstance(progress, tqdm) else tqdm(
        total=sum(counts.values()), unit="window", desc=name, disable=not progress)
    try:
        probe = _ids(np.concatenate([[prefix_id], docs[0][:15]]))[None]  # [1, <= 16]
        scorer = Scorer.of(model, chunk_size, probe)
        result = {"lengths": lengths, "loss": {}, "ppl": {}, "windows": counts, "tokens": {},
                  "documents": len(docs), "chunked_head": scorer.chunked_head}
        for L in lengths:
            total, scored_tokens = 0.0, 0
            position_sum = torch.zeros(longest, dtype=torch.float64)  # [n max]
            position_count = torch.zeros(longest, dtype=torch.float64)  # [n max]
            for doc in docs:
                seq = _ids(np.concatenate([[prefix_id], doc])).to(device)  # [n + 1]
                windows, T = document_windows(len(doc), L), min(L, len(doc))
                for w0 in range(0, len(windows), batch_size):
                    part = windows[w0:w0 + batch_size]
                    rows = torch.stack([seq[end - T:end + 1] for end, _ in part])  # [B, T + 1]
                    with _autocast(dtype, device):
                        loss = scorer.losses(rows[:, :-1], rows[:, 1:]).double().cpu()  # [B, T]
                    for row, (end, scored) in enumerate(part):
                        kept = loss[row, T - scored:]  # [scored]: tokens[end - scored : end]
                        total += float(kept.sum())
                        scored_tokens += scored
                        position_sum[end - scored:end] += kept
                        position_count[end - scored:end] += 1
                    bar.update(len(part))
            mean = total / scored_tokens
            result["loss"][L], result["ppl"][L] = mean, math.exp(min(mean, 700.0))
            result["tokens"][L] = scored_tokens
        position_loss = (position_sum / position_count).numpy()  # [n max], longest L
    finally:
        model.train(was_training)
        if bar is not progress:
            bar.close()
    result["position_loss"] = position_loss
    result["loss_by_position"] = loss_by_position(position_loss, bins_per_octave)
    return result


def loss_by_position(position_loss, bins_per_octave: int = 4) -> list[dict]:
    """Mean of position_loss (float [L], the loss at positions 1 .. L) in log-spaced bins:
    bin edges at the distinct integers round(2 ** (k / bins_per_octave)), so the bins are
    single positions at the start and `bins_per_octave` per doubling further on. Returns
    [{"start", "end" (1-based positions, end exclusive), "center" (geometric mean of the
    bin's first and last position), "loss"}], in order."""
    if not is_int(bins_per_octave) or bins_per_octave < 1:
        raise PplError("bins_per_octave", f"must be a positive int, got {bins_per_octave!r}")
    values = np.asarray(position_loss, dtype=np.float64)  # [L]
    L = len(values)
    edges, k = [1], 1
    while edges[-1] <= L:
        edge = min(round(2 ** (k / bins_per_octave)), L + 1)
        if edge > edges[-1]:
            edges.append(edge)
        k += 1
    return [{"start": a, "end": b, "center": math.sqrt(a * (b - 1)),
             "loss": float(values[a - 1:b - 1].mean())}
            for a, b in zip(edges[:-1], edges[1:], strict=True)]
