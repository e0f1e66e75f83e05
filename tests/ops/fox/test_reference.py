"""The FoX reference is PaTH-FoX with identity transforms (the definition), and the op's
"path" backend is the PaTH op with identity transforms, bit for bit. Input checks."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops import path_attn, path_attn_naive
from pathattn.ops.fox import fox_attn, fox_attn_naive

from ._helpers import make_inputs


def _identity(k, g):
    return torch.zeros_like(k), k.new_zeros(k.shape[:3], dtype=g.dtype)


@pytest.mark.parametrize("B, T, HQ, H, cu", [
    pytest.param(2, 21, 4, 2, None, id="dense-gqa"),
    pytest.param(1, 30, 2, 1, (0, 7, 7, 30), id="packed"),
])
def test_reference_is_path_fox_with_identity_transforms(B, T, HQ, H, cu):
    q, k, v, g = make_inputs(B, T, HQ, H, 8)
    cu = None if cu is None else torch.tensor(cu)
    ours = fox_attn_naive(q, k, v, g, cu_seqlens=cu)
    path = path_attn_naive(q, k, v, *_identity(k, g), g, cu_seqlens=cu)
    torch.testing.assert_close(ours, path, rtol=1e-12, atol=1e-12)


def test_path_backend_is_the_path_op():
    q, k, v, g = make_inputs(1, 40, 2, 1, 16)
    cu = torch.tensor([0, 17, 40])
    ours = fox_attn(q, k, v, g, cu_seqlens=cu, backend="path")
    assert torch.equal(ours, path_attn(q, k, v, *_identity(k, g), g, cu_seqlens=cu))
    assert torch.equal(fox_attn(q, k, v, g, cu_seqlens=cu), ours)  # "auto" on CPU


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "g": a["g"][..., :1]}, "g: expected shape"),
    (lambda a: {**a, "k": a["k"][:, :, :, :4]}, "head dim"),
    (lambda a: {**a, "v": a["v"].double()}, "dtype equal to q's"),
    (lambda a: {**a, "backend": "cuda"}, "backend must be one of"),
    (lambda a: {**a, "scale": -1.0}, "scale"),
    (lambda a: {**a, "cu_seqlens": torch.tensor([0, 5])}, "end at T"),
], ids=["g-shape", "head-dim", "dtype", "backend", "scale", "cu_seqlens"])
def test_bad_arguments_raise(change, match):
    q, k, v, g = make_inputs(1, 12, 2, 1, 8)
    args = change({"q": q, "k": k, "v": v, "g": g, "backend": "auto", "scale": None,
                   "cu_seqlens": None})
    with pytest.raises(ValueError, match=match):
        fox_attn(args["q"], args["k"], args["v"], args["g"], scale=args["scale"],
                 cu_seqlens=args["cu_seqlens"], backend=args["backend"])


def test_triton_refuses_float64():
    q, k, v, g = (x.double() for x in make_inputs(1, 4, 1, 1, 8))
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        fox_attn(q, k, v, g, backend="triton")
