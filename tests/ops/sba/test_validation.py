"""Bad inputs of `sb_attn` raise a ValueError naming the argument and the expectation."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops import sb_attn

q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 5)

BAD = {
    "q_not_tensor": (dict(q=[1.0]), "q must be a torch.Tensor"),
    "q_rank3": (dict(q=q[0]), "q must have 4 dimensions"),
    "q_int": (dict(q=q.long()), "q must be float16"),
    "k_length": (dict(k=k[:, :5]), "k: expected length T"),
    "k_batch": (dict(k=k.expand(2, -1, -1, -1)), "k: expected batch size"),
    "k_head_dim": (dict(k=k[..., :4]), "k: expected head dim D"),
    "v_heads": (dict(v=v[:, :, :1]), r"v: expected \[B, T, H\]"),
    "heads_not_multiple": (dict(k=torch.randn(1, 6, 3, 8), v=torch.randn(1, 6, 3, 5)),
                           "multiple of the number of key/value heads"),
    "k_dtype": (dict(k=k.double()), "k: expected dtype"),
    "scale_zero": (dict(scale=0.0), "scale must be a positive number"),
    "scale_bool": (dict(scale=True), "scale must be a positive number"),
    "attend_current_int": (dict(attend_current=1), "attend_current must be a bool"),
    "block_size": (dict(block_size=0), "block_size must be a positive integer"),
    "cu_float": (dict(cu_seqlens=torch.tensor([0.0, 6.0])), "cu_seqlens must be int32"),
    "cu_end": (dict(cu_seqlens=torch.tensor([0, 5])), "end at T=6"),
    "cu_order": (dict(cu_seqlens=torch.tensor([0, 4, 2, 6])), "non-decreasing"),
    "cu_batch": (dict(q=q.expand(2, -1, -1, -1), k=k.expand(2, -1, -1, -1),
                      v=v.expand(2, -1, -1, -1), cu_seqlens=torch.tensor([0, 6])),
                 "B == 1"),
}


@pytest.mark.parametrize("name", list(BAD), ids=str)
def test_bad_input_names_argument(name):
    over, match = BAD[name]
    args = dict(q=q, k=k, v=v) | over
    with pytest.raises(ValueError, match=match):
        sb_attn(args.pop("q"), args.pop("k"), args.pop("v"), **args)
