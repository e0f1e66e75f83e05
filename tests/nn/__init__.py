"""Tests of pathattn.nn. Shared helpers of the layer tests live here.

`LAYERS` maps a readable id to a small layer factory (hidden 32, <= 4 heads): PaTH variants
and the baselines, all with the forward / prefill / decode interface.
"""

from __future__ import annotations

import torch

from pathattn.nn import FoXAttention, PaTHAttention, RoPEAttention, SBAttention

HIDDEN = 32

LAYERS = {
    "path": lambda: PaTHAttention(HIDDEN, 4),
    "path_fox": lambda: PaTHAttention(HIDDEN, 4, use_forget_gate=True),
    "path_qknorm": lambda: PaTHAttention(HIDDEN, 4, qk_norm=True),
    "path_gqa": lambda: PaTHAttention(HIDDEN, 4, num_kv_heads=2),
    "path_fox_gqa_reflections2": lambda: PaTHAttention(HIDDEN, 4, num_kv_heads=2,
                                                       use_forget_gate=True, num_reflections=2),
    "path_fox_mqa_qknorm_fullrank": lambda: PaTHAttention(
        HIDDEN, 4, num_kv_heads=1, w_rank=None, use_forget_gate=True, qk_norm=True,
        beta_max=1.9, bias=True),
    "rope": lambda: RoPEAttention(HIDDEN, 4),
    "rope_gqa_qknorm": lambda: RoPEAttention(HIDDEN, 4, num_kv_heads=2, qk_norm=True),
    "fox": lambda: FoXAttention(HIDDEN, 4),
    "fox_gqa_qknorm": lambda: FoXAttention(HIDDEN, 4, num_kv_heads=2, qk_norm=True),
    "sba": lambda: SBAttention(HIDDEN, 4),
    "sba_gqa_qknorm_current": lambda: SBAttention(HIDDEN, 4, num_kv_heads=2, qk_norm=True,
                                                  attend_current=True),
}


def make_layer(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A seeded layer; norm weights are perturbed away from 1 so that they matter."""
    torch.manual_seed(0)
    layer = LAYERS[name]().to(dtype)
    with torch.no_grad():
        for pname, p in layer.named_parameters():
            if pname.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    return layer


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def assert_rel(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4, msg: str = "") -> None:
    """a == b up to a relative error tol (max |a - b| / max |b|)."""
    assert a.shape == b.shape, (msg, a.shape, b.shape)
    err = rel_err(a, b)
    assert err <= tol, f"{msg}: relative error {err:.3e} > {tol:.0e}"
