"""`tables.call_tables`: the same tables as built from scratch; kept per shape for dense
batches (one build per shape, the oldest dropped past `CACHE_SIZE`), built on every call for
packed ones; and the op's results unchanged when the tables come from the cache."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.path.triton import tables  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _equal(a: tables.CallTables, b: tables.CallTables) -> bool:
    same = (torch.equal(a.table, b.table) and torch.equal(a.slots, b.slots)
            and (a.n_max, a.seg, a.n_slots) == (b.n_max, b.seg, b.n_slots))
    if a.pairs is None or b.pairs is None:
        return same and a.pairs is b.pairs
    return same and torch.equal(a.pairs[0], b.pairs[0]) and a.pairs[1] == b.pairs[1]


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch):
    monkeypatch.setattr(tables, "_CACHE", type(tables._CACHE)())


@pytest.mark.parametrize("B,T,BT,seg", [(2, 300, 16, 0), (1, 64, 16, 2), (3, 1000, 64, 0)])
@pytest.mark.parametrize("pairs", [False, True])
def test_dense_tables_as_built(B, T, BT, seg, pairs):
    got = tables.call_tables(B, T, None, BT, seg, DEVICE, pairs)
    assert _equal(got, tables._build(B, T, None, BT, seg, DEVICE, pairs))
    again = tables.call_tables(B, T, None, BT, seg, DEVICE, pairs)
    assert again.table is got.table and again.slots is got.slots  # kept, not rebuilt
    assert len(tables._CACHE) == 1


def test_forward_and_backward_share_one_entry(monkeypatch):
    builds = []
    build = tables._build
    monkeypatch.setattr(tables, "_build", lambda *a: builds.append(a) or build(*a))
    fwd = tables.call_tables(2, 256, None, 16, 0, DEVICE)
    bwd = tables.call_tables(2, 256, None, 16, 0, DEVICE, pairs=True)
    assert len(builds) == 1 and fwd.pairs is None and bwd.pairs is not None
    assert bwd.table is fwd.table


def test_packed_tables_are_built_every_call(monkeypatch):
    builds = []
    build = tables._build
    monkeypatch.setattr(tables, "_build", lambda *a: builds.append(a) or build(*a))
    cu = torch.tensor([0, 5, 70, 100], dtype=torch.int32, device=DEVICE)
    a = tables.call_tables(1, 100, cu, 16, 0, DEVICE, True)
    cu2 = torch.tensor([0, 50, 60, 100], dtype=torch.int32, device=DEVICE)  # same shape
    b = tables.call_tables(1, 100, cu2, 16, 0, DEVICE, True)
    assert len(builds) == 2 and not tables._CACHE
    assert not torch.equal(a.table, b.table)
    assert _equal(b, tables._build(1, 100, cu2, 16, 0, DEVICE, True))


def test_oldest_entry_dropped(monkeypatch):
    monkeypatch.setattr(tables, "CACHE_SIZE", 2)
    for T in (32, 48, 32, 64):  # 32 used again: 48 is the oldest when 64 comes
        tables.call_tables(1, T, None, 16, 0, DEVICE)
    assert [k[3] for k in tables._CACHE] == [32, 64]


def test_op_results_with_cached_tables():
    """Two calls of the op on one shape (the second from the cache) and one after the cache
    is emptied give the same outputs and gradients, bit for bit."""
    from pathattn import path_attn
    from tests.ops.path._helpers import make_inputs

    xs = make_inputs(2, 40, 2, 2, 16, 16, True, torch.float32)
    xs = tuple(x.to(DEVICE).requires_grad_() for x in xs)
    dout = torch.randn(2, 40, 2, 16, device=DEVICE)

    def run():
        o = path_attn(*xs, backend="triton", block_size=16)
        return (o, *torch.autograd.grad(o, xs, dout))

    first, second = run(), run()
    tables._CACHE.clear()
    third = run()
    for a, b, c in zip(first, second, third, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
