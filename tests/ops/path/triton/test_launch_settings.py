"""Per-device launch settings of the Triton kernels that change what a program computes or
how its loops are compiled: the pipeline depth PIPE of the scan kernels' loops over earlier
segments (`config.PIPE_STAGES`) and the rows of E per program of the segment backward
(`config.SEG_BWD_ROWS`). The interpreter runs the H100 settings; here the other values run
through it, forward and every gradient against the float64 reference."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops import path_attn_naive  # noqa: E402
from pathattn.ops.path.triton import config  # noqa: E402
from pathattn.ops.path.triton import op as op_module  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402

from .._helpers import (  # noqa: E402
    assert_close_to_reference,
    cast,
    make_dout,
    make_inputs,
    run_with_grads,
)
from .test_path_attn_triton import CU_70, F32_TOL, _on_device  # noqa: E402


def test_devices_settings():
    """sm_80 takes its tables' values (16-bit inputs), sm_90 the kernels' num_stages and
    whole-block rows, float32 inputs the kernels' num_stages."""
    a100 = config.launch_config(64, 64, torch.bfloat16, config.A100_SHARED, capability=(8, 0))
    h100 = config.launch_config(64, 64, torch.bfloat16, config.H100_SHARED, capability=(9, 0))
    assert a100.pipe_stages("fwd") == config.PIPE_STAGES[80, 64]["fwd"]
    a100_f32 = config.launch_config(64, 64, torch.float32, config.A100_SHARED, capability=(8, 0))
    assert a100_f32.pipe_stages("fwd") == a100_f32.launch("fwd")[1]
    assert a100.seg_bwd_rows(64) == config.SEG_BWD_ROWS[80] < 64
    for k in config.PIPELINED:
        assert h100.pipe_stages(k) == h100.launch(k)[1]
        assert h100.launch_kwargs(k)["PIPE"] == h100.pipe_stages(k)
    assert h100.seg_bwd_rows(64) == 64
    assert "PIPE" not in h100.launch_kwargs("ut_fwd")
    # sm_90, D 128, bf16: 64 rows of E (two 32-token blocks' worth) at 8 warps
    h100_128 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                    capability=(9, 0))
    assert (h100_128.BT, h100_128.seg_bwd_rows(128)) == (32, 64)
    assert h100_128.launch("seg_bwd")[0] == 8 and h100_128.launch("seg")[0] == 2
    assert h100_128.seg_walk and h100.seg_walk and a100.seg_walk
    # the segment keys at D 128 with 16-bit inputs: 2 warps, the crossings' products 4
    assert h100_128.launch_kwargs("seg")["num_warps"] == 2
    assert h100_128.launch_kwargs("pi")["num_warps"] == 4 == h100.launch("seg")[0]
    assert a100_f32.launch("seg")[0] == 4 and not a100_f32.seg_walk
    # and with 32 rows of E per program at D 64 (R = 2: 32-token blocks)
    r2 = config.launch_config(64, 64, torch.bfloat16, config.A100_SHARED, capability=(8, 0),
                              reflections=2)
    assert r2.BT == 32 and r2.launch("seg")[0] == 2 and r2.launch("fwd")[0] == 4
    # the forward too with 16-token blocks (D 128, R = 2), not the query kernel
    r2_128 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                  capability=(9, 0), reflections=2)
    assert r2_128.BT == 16 and r2_128.launch_kwargs("fwd")["num_warps"] == 2
    assert r2_128.launch("seg")[0] == 2 and r2_128.launch("bwd")[0] == 4
    # the query kernel's walk through loop-invariant offsets at D 64 with 16-bit inputs
    assert h100.walk_hoist and a100.walk_hoist and h100.launch_kwargs("bwd")["HOIST"]
    assert not (h100_128.walk_hoist or a100_f32.walk_hoist)
    # and its own-segment loop on the H100 at D 64 and 128
    assert h100.own_hoist and h100_128.own_hoist and h100_128.launch_kwargs("bwd")["HOIST_OWN"]
    assert not (a100.own_hoist or a100_f32.own_hoist)
    assert not config.launch_config(128, 128, torch.float32, config.H100_SHARED,
                                    capability=(9, 0)).seg_walk
    assert config.launch_config(128, 128, torch.bfloat16, config.A100_SHARED,
                                capability=(8, 0)).seg_bwd_rows(128) == 32


@pytest.mark.parametrize("gates, cu", [(True, None), (False, CU_70)], ids=["gates", "packed"])
def test_other_settings_through_the_interpreter(monkeypatch, gates, cu):
    """Depths 2 and 3 and a quarter of E's rows per program (D = 32, 16-token blocks, one
    block per segment: every block pair but the diagonal crosses segments)."""
    monkeypatch.setattr(config, "pipe_table", lambda *a: (("fwd", 3), ("bwd", 2), ("bwd_kv", 3)))
    monkeypatch.setitem(config.SEG_BWD_ROWS, 90, 8)
    cfg = config.launch_config(32, 32, torch.float32, None, 16)
    assert (cfg.pipe_stages("fwd"), cfg.pipe_stages("bwd"), cfg.seg_bwd_rows(32)) == (3, 2, 8)
    _against_reference(gates, cu, seg=1)


def _against_reference(gates: bool, cu, seg: int) -> None:
    """D = 32, 16-token blocks, 70 tokens: forward and every gradient against float64."""
    inputs = make_inputs(1, 70, 2, 1, 32, 32, gates)
    dout = make_dout(1, 70, 2, 32)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, cu_seqlens=cu_seqlens,
                          block_size=16, seg=seg)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)


@pytest.mark.parametrize("gates, cu", [(True, None), (False, CU_70)], ids=["gates", "packed"])
def test_segment_keys_walk(monkeypatch, gates, cu):
    """`SEG_WALK` (the H100's and A100's setting at D 64 and 128, 16-bit inputs): the
    segment keys walk each segment, here for float32 at D = 32 (segments of 3 blocks, the
    last partial), forward and every gradient against the float64 reference."""
    monkeypatch.setattr(config, "SEG_WALK", {(90, 32, False)})
    assert config.launch_config(32, 32, torch.float32, None, 16).seg_walk
    assert not config.launch_config(64, 64, torch.float32, None, 16).seg_walk
    _against_reference(gates, cu, seg=3)


@pytest.mark.parametrize("steps, gates, cu, seg", [(1, True, None, 2), (2, False, None, 2),
                                                   (1, False, CU_70, 1)],
                         ids=["gates", "2-steps", "packed"])
def test_hoisted_walk_loads(monkeypatch, steps, gates, cu, seg):
    """`WALK_HOIST` and `OWN_HOIST` (the H100 at D = 64, and D = 128 for the latter, with
    16-bit inputs): the query kernel's walk over earlier segments (one block or two a step)
    and its loop over its own segment load keys, values and reflections through
    loop-invariant offsets; here for float32 at D = 32 (segments of 2 blocks, or 1 in the
    packed sequences, so that every case walks), forward and every gradient against the
    float64 reference, and the launch passing HOIST and HOIST_OWN."""
    from pathattn.ops.path.triton import bwd

    monkeypatch.setattr(config, "WALK_HOIST", {(90, 32, False)})
    monkeypatch.setattr(config, "OWN_HOIST", {(90, 32, False)})
    monkeypatch.setattr(config, "step_table", lambda *a: (("bwd", steps),))
    cfg = config.launch_config(32, 32, torch.float32, None, 16)
    assert cfg.walk_hoist and cfg.launch_kwargs("bwd")["HOIST"] is True
    assert cfg.own_hoist and cfg.launch_kwargs("bwd")["HOIST_OWN"] is True
    assert not config.launch_config(64, 64, torch.float32, None, 16).walk_hoist
    assert not config.launch_config(64, 64, torch.float32, None, 16).own_hoist
    assert "HOIST" not in cfg.launch_kwargs("fwd")
    seen = []
    scan = bwd.bwd_scan

    def spy(*args, **kw):
        launch = inspect.signature(scan).bind(*args, **kw).arguments["launch"]
        seen.append((launch["HOIST"], launch["HOIST_OWN"]))  # the query kernel's settings
        return scan(*args, **kw)

    monkeypatch.setattr(op_module, "bwd_scan", spy)
    _against_reference(gates, cu, seg=seg)
    assert seen == [(True, True)]


@pytest.mark.parametrize("gates, cu", [(True, None), (False, CU_70)], ids=["gates", "packed"])
def test_segment_backward_rows_past_the_block(monkeypatch, gates, cu):
    """`SEG_BWD_WIDE` (the H100's 64 rows of E at D = 128, 32-token blocks): more rows of E
    per program of the segment backward than a block has tokens, and its own launch
    settings reaching `segment_grads`. D = 32, 16-token blocks, all 32 rows of E in one
    program, against the float64 reference."""
    from pathattn.ops.path.triton import bwd

    monkeypatch.setitem(config.SEG_BWD_WIDE, (90, 32, False), (32, 8))
    cfg = config.launch_config(32, 32, torch.float32, None, 16)
    assert (cfg.seg_bwd_rows(32), cfg.launch("seg_bwd")[0]) == (32, 8)
    seen = []

    def spy(*args):
        seen.append((args[-1], args[-2]))  # rows, launch
        return segment_grads(*args)

    segment_grads = bwd.segment_grads
    monkeypatch.setattr(bwd, "segment_grads", spy)
    _against_reference(gates, cu, seg=2)
    assert [(rows, launch["num_warps"]) for rows, launch in seen] == [(32, 8)]


@pytest.mark.parametrize("steps, B, T, HQ, H, gates, cu, seg", [
    pytest.param((4, 2), 2, 100, 4, 2, True, None, 3, id="4-2-seg3-GQA-gates"),
    pytest.param((4, 2), 1, 120, 2, 1, True, None, 5, id="4-2-seg5-gates"),
    pytest.param((2, 4), 1, 70, 2, 1, False, CU_70, 2, id="2-4-seg2-packed"),
    pytest.param((4, 2), 1, 90, 2, 1, True, None, 1, id="4-2-seg1"),
])
def test_key_blocks_per_step_through_the_interpreter(monkeypatch, steps, B, T, HQ, H, gates,
                                                     cu, seg):
    """The forward's and the query kernel's walks over earlier segments KSTEP blocks a
    step (`KEY_STEPS`, the H100's setting at D = 128), the last SEG % KSTEP blocks of a
    segment one at a time; with gates each block keeps its own gate term. D = 32, 16-token
    blocks, against the float64 reference."""
    monkeypatch.setattr(config, "step_table", lambda *a: (("fwd", steps[0]), ("bwd", steps[1])))
    cfg = config.launch_config(32, 32, torch.float32, None, 16)
    assert (cfg.launch_kwargs("fwd")["KSTEP"], cfg.launch_kwargs("bwd")["KSTEP"]) == steps
    assert "KSTEP" not in cfg.launch_kwargs("bwd_kv")
    inputs = make_inputs(B, T, HQ, H, 32, 32, gates)
    dout = make_dout(B, T, HQ, 32)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, cu_seqlens=cu_seqlens,
                          block_size=16, seg=seg)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)


def test_key_steps_per_device():
    """Several key blocks a step at D = 128 with 16-bit inputs and one reflection per token
    on the H100, one elsewhere (D = 64, float32, R = 2, the A100); a step is a power of
    two."""
    h100 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED, capability=(9, 0))
    assert (h100.key_steps("fwd"), h100.key_steps("bwd")) == (4, 2)
    for cfg in (config.launch_config(64, 64, torch.bfloat16, config.H100_SHARED,
                                     capability=(9, 0)),
                config.launch_config(128, 128, torch.float32, config.H100_SHARED,
                                     capability=(9, 0)),
                config.launch_config(128, 128, torch.bfloat16, config.A100_SHARED,
                                     capability=(8, 0)),
                config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                     capability=(9, 0), reflections=2)):
        assert (cfg.key_steps("fwd"), cfg.key_steps("bwd")) == (1, 1)
    for steps in config.KEY_STEPS.values():
        assert all(n in (1, 2, 4) for n in steps.values()) and set(steps) <= set(config.STEPPED)


def test_default_segments_hold_whole_steps_and_tiles():
    """At D = 128 on the H100 (bf16) the default segment length is a multiple of the
    forward's 4-block steps and the key kernel's 4-block tiles and 2-block query steps: 23
    blocks at T = 16384 become 24; elsewhere it is about sqrt(blocks), as before. The op
    takes the same length it was compiled for."""
    from pathattn.ops.path.triton import op, tables

    h100 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED, capability=(9, 0))
    assert h100.kv_tiles() == (4 * h100.BT, 2 * h100.BT) and h100.launch("bwd_kv")[0] == 8
    assert h100.seg_multiple() == 4
    for cfg in (config.launch_config(64, 64, torch.bfloat16, config.H100_SHARED,
                                     capability=(9, 0)),
                config.launch_config(128, 128, torch.float32, config.H100_SHARED,
                                     capability=(9, 0))):
        assert cfg.seg_multiple() == 1
    assert [tables.default_seg(n, 4) for n in (1, 3, 64, 256, 512, 1024)] == [1, 3, 8, 16, 24,
                                                                               32]
    assert [tables.default_seg(n) for n in (1, 3, 64, 256, 512)] == [1, 2, 8, 16, 23]
    with pytest.raises(ValueError, match="multiple"):
        tables.default_seg(10, 0)
    q = torch.zeros(1, 16384, 1, 128, dtype=torch.bfloat16)
    w = torch.zeros(1, 16384, 1, 128, dtype=torch.bfloat16)
    seg = op._setup(q, q, w, h100.BT, 0, 1, 16384, None)[1]
    key = op._compile_key("fwd", q, q, q, w, q[..., 0], None, None, h100.BT, 0)
    assert seg == 24 and key[-1] == op.specialised(24)


def test_rows_must_divide_the_head_dim():
    from pathattn.ops.path.triton.segments import segment_grads

    with pytest.raises(ValueError, match="rows must divide the padded head dim 32, got 24"):
        segment_grads(*([None] * 8), 1, 16, 32, "ieee", None, None, False, None, None, None,
                      rows=24)


def test_ut_kernels_warps():
    """The UT kernels run 8 warps, 4 where `UT_FOUR_WARPS` lists them; the scan kernels 4,
    but the key kernel where `KV_WARPS` lists it and the segment backward where
    `SEG_BWD_WIDE` does (8 each at D = 128 on the H100); the launches of
    `MAXNREG_KERNELS` state maxnreg, and on the A100 the query kernel's (`MAXNREG_ARCH`),
    the others not."""
    h100 = config.launch_config(64, 64, torch.bfloat16, config.H100_SHARED, capability=(9, 0))
    a100 = config.launch_config(64, 64, torch.bfloat16, config.A100_SHARED, capability=(8, 0))
    h100_128 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                    capability=(9, 0))
    h100_f32 = config.launch_config(64, 64, torch.float32, config.H100_SHARED, capability=(9, 0))
    assert (h100.BT, a100.BT) == (64, 64)
    # D 64, bf16, sm_90 and sm_80: every UT kernel at 4 warps
    assert config.UT_FOUR_WARPS[90, 64, True, 64] == config.UT_KERNELS
    assert config.UT_FOUR_WARPS[80, 64, True, 64] == config.UT_KERNELS
    for R in (1, 2):  # D 128, bf16, sm_80: every UT kernel at 4 warps (a 32-row UT tile)
        a100_128 = config.launch_config(128, 128, torch.bfloat16, config.A100_SHARED,
                                        capability=(8, 0), reflections=R)
        assert a100_128.BT * R == 32
        assert all(a100_128.launch(k)[0] == 4 for k in config.UT_KERNELS)
    r2 = config.launch_config(64, 64, torch.bfloat16, config.H100_SHARED, capability=(9, 0),
                              reflections=2)  # 32-token blocks: a 64-row UT tile
    assert r2.BT == 32 and all(r2.launch(k)[0] == 4 for k in config.UT_KERNELS)
    # D 128: ut_fwd takes 4 warps with one reflection per token only (16-token blocks of
    # R = 2 fill the same 32-row UT tile)
    r2_128 = config.launch_config(128, 128, torch.bfloat16, config.H100_SHARED,
                                  capability=(9, 0), reflections=2)
    assert r2_128.BT == 16 and r2_128.launch("ut_fwd")[0] == 8
    assert r2_128.launch("ut_bwd_inv")[0] == 4
    for cfg, four in ((h100, set(config.UT_KERNELS)), (a100, set(config.UT_KERNELS)),
                      (h100_128, {"ut_fwd", "ut_bwd_q", "ut_bwd_dk", "ut_bwd", "ut_bwd_inv"}),
                      (h100_f32, set())):
        for k in config.KERNELS:
            warps = 4 if k not in config.UT_KERNELS or k in four else 8
            if k == "bwd_kv" and cfg is h100_128:
                warps = config.KV_WARPS[90, 128, True]
            if k == "seg_bwd" and cfg is h100_128:
                warps = config.SEG_BWD_WIDE[90, 128, True][1]
            if k == "seg" and cfg is h100_128:
                warps = 2 if "seg" in config.TWO_WARPS[90, 128, True, 32] else 4
            assert cfg.launch(k)[0] == warps, (cfg, k)
            assert cfg.launch_kwargs(k)["num_warps"] == warps
            stated = k in config.MAXNREG_KERNELS or (cfg is a100 and k == "bwd")
            regs = config.MAX_REGISTERS if stated else None
            assert cfg.launch_kwargs(k).get("maxnreg") == regs, (cfg, k)
    assert config.MAX_REGISTERS == 255 and "bwd" not in config.MAXNREG_KERNELS
    assert config.MAXNREG_ARCH == {80: ("bwd",)}
    assert set(config.UT_KERNELS) < set(config.KERNELS)
