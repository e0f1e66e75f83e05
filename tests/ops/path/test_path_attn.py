"""path_attn, blockwise backends only: the default block size. The op's exactness on every
backend (forward and every gradient against the float64 reference, packing, low precision,
float64 and gradcheck, empty inputs, errors) is the conformance suite, `tests/ops/path/conformance`.
"""

from __future__ import annotations

import torch

from pathattn import path_attn
from pathattn.ops.common.block_size import default_block_size

from ._helpers import make_inputs


def test_default_block_size_fits_short_sequences():
    """Short sequences get a block of their length rounded up to 16, not 128 (padding would
    multiply their work); the result is the same as with an explicit block size."""
    assert default_block_size(10) == 16 and default_block_size(300) == 128
    assert default_block_size(70) == 80
    assert default_block_size(300, torch.tensor([0, 5, 30, 300])) == 128
    assert default_block_size(40, torch.tensor([0, 5, 30, 40])) == 32
    inputs = make_inputs(2, 20, 4, 2, 64, 64)
    torch.testing.assert_close(path_attn(*inputs), path_attn(*inputs, block_size=128),
                               rtol=1e-5, atol=1e-6)


def test_fused_kernels_take_longer_blocks_for_long_sequences():
    """Without block_size, the fused CPU kernels ("cpu") run blocks of 256 tokens once the
    longest sequence has LONG_BLOCK_FROM (4096) tokens and every query head has its own key
    head; the PyTorch backend, an explicit block_size, grouped queries and shorter
    sequences keep theirs."""
    from pathattn.ops.path.cpu import LONG_BLOCK_FROM, kernel_block_size
    from pathattn.ops.path.function import blockwise_layout

    assert LONG_BLOCK_FROM == 4096
    assert kernel_block_size(4095) == 128 and kernel_block_size(4096) == 256
    assert kernel_block_size(8192, q_per_kv=2) == 128
    q = torch.zeros(1, 4096, 1, 8)
    assert blockwise_layout(torch.zeros(1, 4096, 4, 8), None, None, True, kv_heads=2).C == 128
    assert blockwise_layout(torch.zeros(1, 4096, 4, 8), None, None, True, kv_heads=4).C == 256
    assert blockwise_layout(q, None, None, kernels=True).C == 256
    assert blockwise_layout(q, None, None, kernels=False).C == 128
    assert blockwise_layout(q, None, 64, kernels=True).C == 64
    assert blockwise_layout(q[:, :4000], None, None, kernels=True).C == 128
    # packed: the longest sequence decides
    cu = torch.tensor([0, 96, 4096])
    assert blockwise_layout(q, cu, None, kernels=True).C == 128
    cu = torch.tensor([0, 4096, 4096 + 50])
    assert blockwise_layout(torch.zeros(1, 4146, 1, 8), cu, None, kernels=True).C == 256


def test_long_blocks_change_nothing_but_rounding():
    """path_attn on the fused kernels over 4096 tokens (blocks of 256) against blocks of
    128, forward and every gradient, in float64."""
    inputs = [x.requires_grad_() for x in
              make_inputs(1, 4096, 2, 2, 16, 16, gates=True, dtype=torch.float64)]
    outs = []
    for block_size in (None, 128):
        o = path_attn(*inputs, backend="cpu", block_size=block_size)
        grads = torch.autograd.grad((o * o.detach().roll(1, 1)).sum(), inputs)
        outs.append((o, *grads))
    assert not torch.equal(outs[0][0], outs[1][0])  # other blocks: other roundings
    for a, b in zip(*outs, strict=True):
        assert float((a - b).abs().max() / b.abs().max()) < 1e-12
