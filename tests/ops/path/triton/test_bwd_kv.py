"""The backward's key-parallel kernel (`bwd_kv.py`) with its key and query tiles shorter
than the block (`config.KV_TILES`, chosen per device): forward and every gradient against
the float64 reference, dense with GQA and gates, and packed. block_size=32 with one block
per segment makes every pair of blocks but the diagonal ones go through it; the tiles of
16 split both the keys of a block over two programs and the queries of a block over two
steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops import path_attn_naive  # noqa: E402
from pathattn.ops.path.triton import config  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402

from .._helpers import (  # noqa: E402
    assert_close_to_reference,
    cast,
    make_dout,
    make_inputs,
    run_with_grads,
)
from .test_path_attn_triton import CU_70, F32_TOL, _on_device  # noqa: E402

CU_MULTI = (0, 70, 75, 180)  # lengths 70, 5, 105: several 16-token blocks and segments


@pytest.mark.parametrize("tiles, B, T, HQ, H, gates, cu, block_size, seg", [
    pytest.param((16, 16), 2, 100, 4, 2, True, None, 32, 1,
                 id="keys-and-queries-split-B2-GQA"),
    pytest.param((32, 16), 1, 70, 2, 1, False, CU_70, 32, 1, id="queries-split-packed"),
    pytest.param((16, 32), 1, 100, 2, 1, True, None, 32, 1, id="keys-split"),
    # tiles over several blocks of a segment: segments of 3 blocks, so that a segment's
    # last block is a tile of its own (half of it masked) and its last query step is one
    # block; the last block partial. Without gates: with make_inputs' gates the pairs a
    # segment or more apart weigh about exp(-12) and would hide an error there
    pytest.param((64, 64), 1, 300, 2, 1, False, None, 32, 3, id="blocks-joined-odd-segments"),
    pytest.param((32, 32), 1, 180, 4, 2, True, CU_MULTI, 16, 2,
                 id="blocks-joined-packed-GQA"),
    pytest.param((64, 16), 1, 200, 2, 1, True, None, 32, 2, id="keys-joined-queries-split"),
    pytest.param((16, 64), 2, 200, 2, 1, True, None, 32, 3, id="keys-split-queries-joined"),
])
def test_kv_tiles(monkeypatch, tiles, B, T, HQ, H, gates, cu, block_size, seg):
    D = 32
    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, D, False), tiles)
    assert config.launch_config(D, D, torch.float32, None, block_size).kv_tiles() == tiles
    inputs = make_inputs(B, T, HQ, H, D, D, gates)
    dout = make_dout(B, T, HQ, D)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, cu_seqlens=cu_seqlens,
                          block_size=block_size, seg=seg)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)


@pytest.mark.parametrize("tiles", [(48, 32), (32, 0)])
def test_tiles_must_be_powers_of_two(monkeypatch, tiles):
    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, 32, False), tiles)
    inputs = make_inputs(1, 40, 2, 1, 32, 32, False)
    dout = make_dout(1, 40, 2, 32)
    with pytest.raises(ValueError, match="power of two"):
        run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=16, seg=1)


def test_joined_tiles_no_longer_than_a_segment(monkeypatch):
    """Tiles of 64 keys and queries with 16-token blocks and a given segment of 1 or 3
    blocks launch as one block or two (no tile mostly masked), and stay exact."""
    from pathattn.ops.path.triton import bwd_kv

    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, 32, False), (64, 64))
    seen = []
    launch = bwd_kv.launch_kernel

    def spy(fn, grid):
        run = launch(fn, grid)

        def call(*args, **kw):
            seen.append((kw["BKT"], kw["BQ"]))
            return run(*args, **kw)
        return call
    monkeypatch.setattr(bwd_kv, "launch_kernel", spy)
    inputs = make_inputs(1, 100, 2, 1, 32, 32, False)
    dout = make_dout(1, 100, 2, 32)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    for seg, tiles in ((1, (16, 16)), (3, (32, 32))):
        ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=16,
                              seg=seg)
        assert seen.pop() == tiles
        assert_close_to_reference(ours, ref, F32_TOL)


@pytest.mark.parametrize("tiles, block_size", [((32, 32), 16), ((64, 64), 32)],
                         ids=["tiles-of-2x16", "tiles-of-2x32"])
def test_joined_blocks_across_gate_walls(monkeypatch, tiles, block_size):
    """g = -1e5 on tokens 3, 21 and 37, inside blocks, with key tiles and query steps of two
    blocks and segments of two: the keys just after a wall meet the queries before the
    next one through gate terms whose reference points (the tile's last token, the step's
    first) lie between key and query, so no float32 difference of large G rounds them
    away."""
    D = 32
    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, D, False), tiles)
    q, k, v, w, beta, g = make_inputs(1, 120, 2, 1, D, D, True)
    g[:, [3, 21, 37]] = -1e5
    inputs = (q, k, v, w, beta, g)
    dout = make_dout(1, 120, 2, D)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=block_size,
                          seg=2)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    assert_close_to_reference(ours, ref, F32_TOL)


@pytest.mark.parametrize("gates", [False, True], ids=["no-gates", "gates"])
def test_h100_tiles_past_head_dim_64(monkeypatch, gates):
    """The H100's bfloat16 tiles at padded head dim 128, four 32-token blocks of a segment
    per program and 64 queries a step, with K' passing through memory and Pi read 32 rows
    at a time: run in float32 at D = 96 (the last slice a quarter masked), GQA, segments
    of 6 blocks (a tile of 4 and one of 2, three steps), the last block partial, against
    the float64 reference (without gates the pairs segments apart weigh as much as the
    near ones)."""
    h100 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                capability=(9, 0))
    assert h100.kv_tiles() == (4 * h100.BT, 2 * h100.BT) == (128, 64)
    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, 128, False), h100.kv_tiles())
    assert config.launch_config(96, 96, torch.float32, None, 32).kv_tiles() == (128, 64)
    inputs = make_inputs(1, 500, 2, 1, 96, 32, gates)
    dout = make_dout(1, 500, 2, 32)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=32, seg=6)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    assert_close_to_reference(ours, ref, F32_TOL)
