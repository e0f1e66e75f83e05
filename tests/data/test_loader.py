"""`pathattn.data.loader`: batches against a plain-Python reference of the stream
(concatenated epochs in `epoch_order`), per-epoch shuffling, rank shards whose union is
the global batch, exact resume from a JSON state (also with another world size and
across epochs), the evaluation pass (each target once, fixed shapes), and validation.

The dataset: 60 code snippets of 1 to 600 characters (3 to about 300 tokens with the
vocab-300 tokenizer), so that rows of 32 / 64 tokens hold several documents and cut long
ones, and an epoch (about 5k tokens) is a few dozen batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pathattn.data import (
    MODES,
    DataError,
    EvalLoader,
    TokenDataset,
    TokenLoader,
    epoch_order,
    prepare_dataset,
)
from pathattn.models import IGNORE_INDEX

from . import snippets, tiny_tokenizer, write_jsonl


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loader")
    tok = tiny_tokenizer(tmp / "tok")
    path = write_jsonl(tmp / "docs.jsonl", snippets(60, seed=3))
    prepare_dataset([str(path)], tok, tmp / "data", val_fraction=0.2, workers=1,
                    progress=False)
    return tmp / "data"


def reference_stream(data: TokenDataset, seed: int, epochs: int, shuffle: bool = True):
    """(tokens, is_first, is_last) of the first `epochs` epochs, built document by
    document."""
    tokens, first, last = [], [], []
    for e in range(epochs):
        order = epoch_order(len(data), seed, e) if shuffle else range(len(data))
        for d in order:
            doc = data[int(d)].tolist()
            tokens += doc
            first += [True] + [False] * (len(doc) - 1)
            last += [False] * (len(doc) - 1) + [True]
    return np.array(tokens), np.array(first), np.array(last)


def expected_batch(stream, k: int, L: int, B: int, mode: str):
    """(input_ids, labels, cu_seqlens or None) of global batch k from the reference."""
    tokens, first, last = stream
    s = k * B * L
    ids, nxt = tokens[s:s + B * L], tokens[s + 1:s + B * L + 1]
    if mode == "windows":
        return ids.reshape(B, L), nxt.reshape(B, L), None
    labels = np.where(last[s:s + B * L], IGNORE_INDEX, nxt)
    starts = sorted(set(range(0, B * L, L)) | set(np.flatnonzero(first[s:s + B * L])))
    return ids[None], labels[None], np.array([*starts, B * L])


@pytest.mark.parametrize("mode,L,B", [("packed", 32, 4), ("packed", 64, 3),
                                      ("windows", 32, 4), ("windows", 64, 3)], ids=str)
def test_batches_match_the_reference_stream(data_dir, mode, L, B):
    loader = TokenLoader(data_dir, L, B, mode=mode, seed=5)
    n = loader.data.num_tokens
    batches = 2 * n // (B * L) + 2  # beyond two epochs
    stream = reference_stream(loader.data, 5, epochs=3)
    for k in range(batches):
        batch = next(loader)
        ids, labels, cu = expected_batch(stream, k, L, B, mode)
        assert batch.input_ids.dtype == torch.int64 and batch.index == k
        assert torch.equal(batch.input_ids, torch.from_numpy(ids))
        assert torch.equal(batch.labels, torch.from_numpy(labels))
        if mode == "windows":
            assert batch.cu_seqlens is None
            continue
        assert batch.cu_seqlens.dtype == torch.int32
        assert batch.cu_seqlens.tolist() == cu.tolist()
        assert int(batch.cu_seqlens.diff().max()) <= L  # no piece longer than L
        assert batch.num_scored == batch.global_num_scored == int((labels != -100).sum())
    assert loader.epoch > 2


def test_each_epoch_is_a_new_permutation_of_the_documents(data_dir):
    data = TokenDataset(data_dir)
    orders = [epoch_order(len(data), seed, e).tolist() for seed in (0, 1) for e in (0, 1)]
    assert all(sorted(o) == list(range(len(data))) for o in orders)
    assert len({tuple(o) for o in orders}) == 4
    assert epoch_order(len(data), 0, 1).tolist() == orders[1]
    plain = TokenLoader(data, 16, 2, shuffle=False).batch(0)
    assert plain.input_ids[0].tolist() == data.tokens[:32].tolist()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_shards_concatenate_to_the_global_batch(data_dir, mode, world_size):
    B, L = 5, 32
    full = TokenLoader(data_dir, L, B, mode=mode, seed=2)
    ranks = [TokenLoader(data_dir, L, B, mode=mode, seed=2, rank=r, world_size=world_size)
             for r in range(world_size)]
    for k in (0, 7, 40):
        want = full.batch(k)
        parts = [r.batch(k) for r in ranks]
        dim = 1 if mode == "packed" else 0
        assert torch.equal(torch.cat([p.input_ids for p in parts], dim), want.input_ids)
        assert torch.equal(torch.cat([p.labels for p in parts], dim), want.labels)
        assert [p.rows for p in parts] == [tuple(map(int, (a[0], a[-1] + 1))) for a in
                                           np.array_split(np.arange(B), world_size)]
        assert sum(p.num_scored for p in parts) == want.num_scored
        assert {p.global_num_scored for p in parts} == {want.global_num_scored}
        if mode == "packed":
            shifted = [p.cu_seqlens[:-1] + p.rows[0] * L for p in parts]
            assert torch.equal(torch.cat([*shifted, want.cu_seqlens[-1:]]), want.cu_seqlens)


@pytest.mark.parametrize("mode", MODES)
def test_resume_from_json_state_gives_the_next_batch(data_dir, mode):
    loader = TokenLoader(data_dir, 32, 4, mode=mode, seed=9)
    per_epoch = loader.data.num_tokens // loader.tokens_per_batch
    for stop in (0, 3, per_epoch, per_epoch + 1):  # also across the first epoch's end
        while loader.next_index < stop:
            next(loader)
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = TokenLoader(data_dir, 32, 4, mode=mode, seed=9, rank=1, world_size=2)
        resumed.load_state_dict(state)  # another world size: the same global batches
        for _ in range(2):
            want, got = next(loader), next(resumed)
            assert got.index == want.index
            assert torch.equal(got.input_ids.flatten(), want.input_ids.flatten()[64:])
            assert torch.equal(got.labels.flatten(), want.labels.flatten()[64:])


@pytest.mark.parametrize("option,value", [("seed", 1), ("seq_len", 16), ("mode", "windows"),
                                          ("batch_size", 8), ("shuffle", False)], ids=str)
def test_resume_refuses_other_stream_options(data_dir, option, value):
    kw = {"seq_len": 32, "batch_size": 4, "mode": "packed", "seed": 0, "shuffle": True}
    state = TokenLoader(data_dir, **kw).state_dict()
    other = TokenLoader(data_dir, **{**kw, option: value})
    with pytest.raises(DataError, match=option):
        other.load_state_dict(state)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world_size", [1, 2])
def test_eval_pass_scores_every_target_once(data_dir, mode, world_size):
    L, B = 32, 3
    val = TokenDataset(data_dir, "val")
    tokens, first, last = reference_stream(val, 0, epochs=1, shuffle=False)
    loaders = [EvalLoader(data_dir, L, B, mode=mode, rank=r, world_size=world_size)
               for r in range(world_size)]
    assert len(loaders[0]) == -(-(len(tokens) - 1) // (B * L))
    ids, labels = [], []
    for parts in zip(*loaders, strict=True):
        for p in parts:
            assert p.input_ids.numel() == (p.rows[1] - p.rows[0]) * L  # always full shape
            if mode == "packed":
                assert int(p.cu_seqlens.diff().max()) <= L
        ids += [p.input_ids.flatten() for p in parts]
        labels += [p.labels.flatten() for p in parts]
    ids, labels = torch.cat(ids).numpy(), torch.cat(labels).numpy()
    n = len(tokens)
    assert (ids[:n] == tokens).all() and (ids[n:] == val.pad_id).all()
    want = np.where(last[:-1], IGNORE_INDEX, tokens[1:]) if mode == "packed" else tokens[1:]
    assert (labels[:n - 1] == want).all() and (labels[n - 1:] == IGNORE_INDEX).all()


@pytest.mark.parametrize("kw,match", [
    ({"seq_len": 0}, "seq_len"), ({"batch_size": 0}, "batch_size"),
    ({"mode": "rows"}, "mode"), ({"seed": -1}, "seed"), ({"shuffle": 1}, "shuffle"),
    ({"rank": 2, "world_size": 2}, "rank"), ({"world_size": 5}, "world_size"),
], ids=str)
def test_loader_options_are_validated(data_dir, kw, match):
    with pytest.raises(DataError, match=match):
        TokenLoader(data_dir, **{"seq_len": 32, "batch_size": 4, **kw})


def test_eval_of_a_dataset_without_val_split_is_refused(data_dir, tmp_path):
    meta = json.loads((data_dir / "meta.json").read_text())
    path = write_jsonl(tmp_path / "r.jsonl", snippets(3))
    prepare_dataset([str(path)], meta["tokenizer"]["path"], tmp_path / "d", val_fraction=0,
                    workers=1, progress=False)
    with pytest.raises(DataError, match="val split holds no document"):
        EvalLoader(tmp_path / "d", 32, 2)
