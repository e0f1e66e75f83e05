"""Bad arguments of path_attn raise a ValueError whose message starts with the argument."""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn

from ._helpers import make_inputs


def _valid_args(B: int) -> dict:
    """q [B, 5, 4, 8]; k, w [B, 5, 2, 8]; v [B, 5, 2, 6]; beta [B, 5, 2]; g [B, 5, 4]."""
    q, k, v, w, beta, g = make_inputs(B, T=5, HQ=4, H=2, D=8, Dv=6)
    return {"q": q, "k": k, "v": v, "w": w, "beta": beta, "g": g}


def bad(id: str, edit, match: str, B: int = 2):
    """edit(valid args) -> the arguments to replace."""
    return pytest.param(edit, match, B, id=id)


def cu(*bounds, dtype=torch.int64):
    """Packed inputs (B = 1, T = 5) with these sequence boundaries."""
    return lambda a: {"cu_seqlens": torch.tensor(bounds, dtype=dtype)}


BAD_INPUTS = [
    # types and ranks
    bad("q-list", lambda a: {"q": a["q"].tolist()}, r"^q must be a torch.Tensor"),
    bad("q-rank3", lambda a: {"q": a["q"][0]}, r"^q must have 4 dimensions"),
    bad("k-rank3", lambda a: {"k": a["k"][0]}, r"^k must have 4 dimensions"),
    bad("v-rank5", lambda a: {"v": a["v"][..., None]}, r"^v must have 4 dimensions"),
    bad("w-rank3", lambda a: {"w": a["w"][0]}, r"^w must have 4 dimensions"),
    bad("beta-rank4", lambda a: {"beta": a["beta"][..., None]}, r"^beta must have 3 dim"),
    bad("g-rank4", lambda a: {"g": a["g"][..., None]}, r"^g must have 3 dimensions"),
    # batch and sequence length
    bad("k-batch", lambda a: {"k": torch.cat([a["k"], a["k"][:1]])}, r"^k: expected \[B, T\]"),
    bad("v-seq-len", lambda a: {"v": a["v"][:, :4]}, r"^v: expected \[B, T, H\]"),
    bad("w-seq-len", lambda a: {"w": a["w"][:, :4]}, r"^w: expected shape"),
    bad("beta-seq-len", lambda a: {"beta": a["beta"][:, :4]}, r"^beta: expected shape"),
    bad("g-batch", lambda a: {"g": a["g"][:1]}, r"^g: expected shape"),
    # head dims and head counts
    bad("k-head-dim", lambda a: {"k": a["k"][..., :7]}, r"^k: expected head dim"),
    bad("w-head-dim", lambda a: {"w": a["w"][..., :7]}, r"^w: expected shape"),
    bad("v-heads", lambda a: {"v": a["v"][:, :, :1]}, r"^v: expected \[B, T, H\]"),
    bad("beta-HQ-heads", lambda a: {"beta": a["beta"].repeat(1, 1, 2)}, r"^beta: expected"),
    bad("HQ-not-multiple-of-H", lambda a: {"q": a["q"][:, :, :3], "g": None},
        r"^q: number of query heads HQ=3 must be a multiple of .* H=2"),
    bad("g-H-heads", lambda a: {"g": a["g"][:, :, :2]}, r"^g: expected shape"),
    bad("D-zero", lambda a: {x: a[x][..., :0] for x in ("q", "k", "w")},
        r"^head dims must be positive, got D=0"),
    # dtypes and devices
    bad("k-float64", lambda a: {"k": a["k"].double()}, r"^k: expected dtype"),
    bad("v-float16", lambda a: {"v": a["v"].half()}, r"^v: expected dtype"),
    bad("q-int64", lambda a: {"q": a["q"].long()}, r"^q must be float16, bfloat16"),
    bad("beta-int64", lambda a: {"beta": a["beta"].long()}, r"^beta must be float16"),
    bad("k-meta-device", lambda a: {"k": a["k"].to("meta")}, r"^k is on meta but q is on cpu"),
    # cu_seqlens
    bad("cu_seqlens-B2", cu(0, 5), r"^cu_seqlens needs packed inputs with B == 1"),
    bad("cu_seqlens-start", cu(1, 5), r"^cu_seqlens must start at 0 and end at T=5", B=1),
    bad("cu_seqlens-end", cu(0, 3), r"^cu_seqlens must start at 0 and end at T=5", B=1),
    bad("cu_seqlens-decreasing", cu(0, 4, 2, 5), r"^cu_seqlens must be non-decreasing", B=1),
    bad("cu_seqlens-float", cu(0, 5, dtype=torch.float32), r"^cu_seqlens must be int32", B=1),
    bad("cu_seqlens-2d", lambda a: {"cu_seqlens": torch.tensor([[0, 5]])},
        r"^cu_seqlens must be a 1-D integer tensor", B=1),
    bad("cu_seqlens-list", lambda a: {"cu_seqlens": [0, 5]},
        r"^cu_seqlens must be a 1-D integer tensor", B=1),
    bad("cu_seqlens-one-bound", cu(0), r"^cu_seqlens must hold at least 2", B=1),
    # scale and block_size
    bad("scale-zero", lambda a: {"scale": 0.0}, r"^scale must be a positive number"),
    bad("scale-negative", lambda a: {"scale": -1}, r"^scale must be a positive number"),
    bad("scale-nan", lambda a: {"scale": float("nan")}, r"^scale must be a positive number"),
    bad("scale-str", lambda a: {"scale": "1"}, r"^scale must be a positive number"),
    bad("block_size-zero", lambda a: {"block_size": 0}, r"^block_size must be a positive"),
    bad("block_size-negative", lambda a: {"block_size": -4}, r"^block_size must be a positive"),
]


@pytest.mark.parametrize("edit, match, B", BAD_INPUTS)
def test_bad_input_raises_value_error_naming_it(edit, match, B):
    args = _valid_args(B)
    args.update(edit(args))
    with pytest.raises(ValueError, match=match):
        path_attn(**args)


@pytest.mark.parametrize("kwargs", [
    pytest.param({}, id="defaults"),
    pytest.param({"g": None, "scale": 1, "block_size": 3}, id="no-gates-int-scale"),
    pytest.param({"cu_seqlens": torch.tensor([0, 2, 2, 5], dtype=torch.int32)}, id="cu-int32"),
])
def test_valid_inputs_pass(kwargs):
    args = _valid_args(B=1)
    args.update(kwargs)
    assert path_attn(**args).shape == (1, 5, 4, 6)
