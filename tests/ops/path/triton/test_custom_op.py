"""The Triton path as torch.library custom ops: schema, fake (meta) kernels and autograd
registration (torch.library.opcheck), and torch.compile(fullgraph=True) tracing through
path_attn(backend="triton") with no graph break.

On CPU the compiled graph uses the aot_eager backend: it traces forward and backward with
fake tensors (the custom ops' register_fake implementations) and runs the captured graph
eagerly, which calls the interpreted kernels. Inductor would only change how the code around
the opaque custom op is compiled.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from pathattn import path_attn  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_fwd  # noqa: E402

from .._helpers import make_inputs  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs():
    return [x.to(DEVICE).requires_grad_() for x in make_inputs(1, 20, 2, 1, 16, 16, True)]


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_opcheck(gates):
    q, k, v, w, beta, g = _inputs()
    args = (q, k, v, w, beta, g if gates else None, None, 0.25, 16, 0)
    torch.library.opcheck(path_attn_fwd, args)


def test_torch_compile_fullgraph():
    def loss(q, k, v, w, beta, g):
        return path_attn(q, k, v, w, beta, g, backend="triton", block_size=16).square().sum()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loss, backend=counter, fullgraph=True)
    xs, ys = _inputs(), _inputs()
    out = compiled(*xs)
    out.backward()
    ref = loss(*ys)
    ref.backward()
    assert counter.frame_count == 1
    torch.testing.assert_close(out, ref)
    for x, y in zip(xs, ys, strict=True):
        torch.testing.assert_close(x.grad, y.grad)
