"""path_attn, blockwise backends only: the default block size. The op's exactness on every
backend (forward and every gradient against the float64 reference, packing, low precision,
float64 and gradcheck, empty inputs, errors) is the conformance suite, `tests/ops/conformance`.
"""

from __future__ import annotations

import torch

from pathattn import path_attn
from pathattn.ops.path_attn import default_block_size

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
