"""Several reflections per token on the Triton kernels (w [B, T, H, R, D], beta [B, T, H, R]):
forward and every gradient against the float64 naive reference, float32 within the
conformance suite's 1e-4 relative error, with the backward's state recomputed in segments
(the segment products and the transitions then run over each block's BT * R reflections),
GQA, gates and packed sequences; R = 3 pads the tile of a block's reflections to the next
power of two. `tests/ops/path/conformance/test_reflections.py` runs the shared cases through
`path_attn(backend="triton")`; here are the kernels' own knobs (block size, segments) and
the launcher's choice of block length for R > 1.

Without CUDA the kernels run on Triton's interpreter (see conftest.py): small sizes,
block_size=16 so that T <= 70 spans up to 5 blocks.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops import path_attn_naive  # noqa: E402
from pathattn.ops.path.triton.config import (  # noqa: E402
    H100_SHARED,
    MAX_REFLECTION_TILE,
    SHARED_BYTES_REFLECTIONS,
    launch_config,
    padded_reflections,
)
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402

from .._helpers import (  # noqa: E402
    assert_close_to_reference,
    cast,
    make_dout,
    make_reflection_inputs,
    run_with_grads,
)
from .test_path_attn_triton import CU_70, DEVICE, F32_TOL, _on_device  # noqa: E402


@pytest.mark.parametrize("B, T, HQ, H, R, gates, cu, block_size, seg", [
    pytest.param(1, 50, 2, 1, 2, True, None, 16, 1, id="R2-GQA-gates-seg1"),
    pytest.param(1, 50, 2, 2, 3, False, None, 16, 2, id="R3-MHA-nogates-seg2"),
    pytest.param(2, 24, 4, 2, 2, True, None, 16, 0, id="R2-B2-GQA2"),
    pytest.param(1, 70, 2, 1, 2, True, CU_70, 16, 1, id="R2-packed-seg1"),
    pytest.param(1, 70, 4, 2, 3, True, CU_70, 16, 0, id="R3-packed-GQA2"),
    pytest.param(1, 40, 2, 1, 2, True, None, None, 0, id="R2-default-block"),
])
def test_fp32_reflections(B, T, HQ, H, R, gates, cu, block_size, seg):
    D = 16
    inputs = make_reflection_inputs(B, T, HQ, H, D, D, R, gates)
    dout = make_dout(B, T, HQ, D)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, cu_seqlens=cu_seqlens,
                          block_size=block_size, seg=seg)
    assert ours[1][3].shape == (B, T, H, R, D) and ours[1][4].shape == (B, T, H, R)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)


def test_one_reflection_as_5d_is_the_4d_op():
    """w [B, T, H, 1, D] runs the one-reflection kernels: bitwise the result of w [B, T, H, D],
    and the gradients come back in the 5-D shapes."""
    inputs = make_reflection_inputs(1, 20, 2, 1, 16, 16, 1, True)
    dout = make_dout(1, 20, 2, 16)
    five = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=16)
    q, k, v, w, beta, g = inputs
    four = run_with_grads(_on_device(path_attn_triton), (q, k, v, w[:, :, :, 0],
                                                         beta[..., 0], g), dout, block_size=16)
    assert torch.equal(five[0], four[0])
    assert torch.equal(five[1][3][:, :, :, 0], four[1][3])
    assert five[1][3].shape == w.shape and five[1][4].shape == beta.shape


@pytest.mark.parametrize("R", [1, 2, 3, 4, 8])
def test_block_length_for_reflections(R):
    """The default block length (bfloat16, D = 64) keeps a block's tile of reflections at
    most MAX_REFLECTION_TILE rows (16 tokens at least), on GPUs (R measured for them) as in
    the interpreter."""
    RP = padded_reflections(R)
    gpu = RP == 1 or RP in SHARED_BYTES_REFLECTIONS
    for limit, cap in ((None, (9, 0)),) + (((H100_SHARED, (9, 0)),) if gpu else ()):
        BT = launch_config(64, 64, torch.bfloat16, limit, capability=cap, reflections=R).BT
        assert BT * RP <= max(MAX_REFLECTION_TILE, 16 * RP)
        assert R > 1 or BT == 64  # one reflection per token: the full 64-token block


def test_unmeasured_reflections_refused_on_a_gpu():
    """R beyond the measured tables runs in the interpreter only; a GPU refuses it by name,
    as it refuses a block size not in the tables."""
    R = 2 * max(SHARED_BYTES_REFLECTIONS)
    assert launch_config(32, 32, torch.float32, None, reflections=R).BT == 16
    with pytest.raises(ValueError, match=f"R={R}"):
        launch_config(32, 32, torch.float32, H100_SHARED, reflections=R)
    with pytest.raises(ValueError, match="block_size=64"):
        launch_config(32, 32, torch.float32, H100_SHARED, 64, reflections=2)


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU-only behaviour")
def test_partial_tile_masks_padding():
    """R = 3 with BT = 16: 48 reflections in a 64-row tile. A NaN placed in memory right
    after the block's reflections (the next block's first ones, here the next token) must
    not reach earlier tokens: the padding rows are masked, not read."""
    q, k, v, w, beta, g = make_reflection_inputs(1, 32, 2, 1, 16, 16, 3, True)
    o = path_attn_triton(q, k, v, w, beta, g, block_size=16)
    w2 = w.clone()
    w2[:, 16:] = float("nan")  # every reflection of the second block
    o2 = path_attn_triton(q, k, v, w2, beta, g, block_size=16)
    assert torch.equal(o[:, :16], o2[:, :16])
