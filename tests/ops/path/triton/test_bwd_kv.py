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


@pytest.mark.parametrize("tiles, B, T, HQ, H, gates, cu", [
    pytest.param((16, 16), 2, 100, 4, 2, True, None, id="keys-and-queries-split-B2-GQA"),
    pytest.param((32, 16), 1, 70, 2, 1, False, CU_70, id="queries-split-packed"),
    pytest.param((16, 32), 1, 100, 2, 1, True, None, id="keys-split"),
])
def test_kv_tiles(monkeypatch, tiles, B, T, HQ, H, gates, cu):
    D = 32
    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, D, False), tiles)
    assert config.launch_config(D, D, torch.float32, None, 32).kv_tiles() == tiles
    inputs = make_inputs(B, T, HQ, H, D, D, gates)
    dout = make_dout(B, T, HQ, D)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, cu_seqlens=cu_seqlens,
                          block_size=32, seg=1)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)



def test_h100_tiles_past_head_dim_64(monkeypatch):
    """The H100's bfloat16 tiles at padded head dim 128, whole 32-token blocks, with Pi read
    32 rows at a time: run in float32 at D = 96 (the last slice a quarter masked), GQA,
    gates, one block per segment, against the float64 reference."""
    h100 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                capability=(9, 0))
    assert h100.kv_tiles() == (h100.BT, h100.BT) == (32, 32)
    for arch in (80, 90):
        monkeypatch.setitem(config.KV_TILES, (arch, 128, False), h100.kv_tiles())
    assert config.launch_config(96, 96, torch.float32, None, 32).kv_tiles() == (32, 32)
    inputs = make_inputs(1, 100, 2, 1, 96, 32, True)
    dout = make_dout(1, 100, 2, 32)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=32, seg=1)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    assert_close_to_reference(ours, ref, F32_TOL)
