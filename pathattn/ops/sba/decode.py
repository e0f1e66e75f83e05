"""Stick-breaking attention inference: a prompt (`sb_attn_prefill`) and steps of new tokens
after it (`sb_attn_step`), through an `SBACache`.

A step of m new tokens attends, for its queries at positions n - m .. n - 1 (n the cache
length after appending them), to every cached key: the same right-to-left log-space visit of
key blocks as the training op (`pathattn.ops.sba.blockwise`), with the m queries as the only
rows. Its rows equal the last m rows of `sb_attn` on the whole sequence.
"""

from __future__ import annotations

import torch

from ...utils.value_checks import checks_on_host, mask_on_device
from ..common.heads import compute_dtype, default_scale
from ..common.padding import MaskedRows, check_attention_mask
from ..common.validation import check_block_size
from .blockwise import later_keys_matrix, tile_weights
from .cache import SBACache
from .sb_attn import sb_attn
from .validation import check_sb_attn_inputs, check_start

__all__ = ["sb_attn_prefill", "sb_attn_step", "sb_attn_last_rows", "DECODE_BLOCK_SIZE"]

DECODE_BLOCK_SIZE = 256  # keys per tile of a step: few rows, so longer tiles


def sb_attn_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    scale: float | None = None, attend_current: bool = False,
                    attention_mask: torch.Tensor | None = None,
                    block_size: int | None = None) -> tuple[torch.Tensor, SBACache]:
    """`sb_attn` over prompts, plus the cache for `sb_attn_step`.

    Args:
        q, k, v, scale, attend_current, block_size: as `sb_attn` (q [B, T, HQ, D]; k
            [B, T, H, D]; v [B, T, H, Dv]).
        attention_mask: optional [B, T] (bool or integer 0 / 1): 1 for real tokens, 0 for
            masked ones, anywhere (left padding is the common case). A masked token is
            removed from its row: each row equals its real tokens run alone; output rows at
            masked tokens are zero.

    Returns (o [B, T, HQ, Dv] in q's dtype, differentiable as `sb_attn`; SBACache holding
    k and v detached, with the mask as its key mask).
    """
    check_sb_attn_inputs(q, k, v, scale, None, attend_current)
    B, T = q.shape[:2]
    mask = check_attention_mask(attention_mask, B, T, q.device)
    kw = dict(scale=scale, attend_current=attend_current, block_size=block_size)
    if mask is None:
        return sb_attn(q, k, v, **kw), SBACache(k.detach(), v.detach())
    pad = MaskedRows(mask)
    o = sb_attn(pad.pack(q), pad.pack(k), pad.pack(v), cu_seqlens=pad.cu_seqlens, **kw)
    return pad.unpack(o), SBACache(k.detach(), v.detach(), mask)


def sb_attn_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: SBACache, *,
                 scale: float | None = None, attend_current: bool = False,
                 block_size: int | None = None,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """m new tokens after `cache` (which they are appended to, in place).

    Args:
        q: [B, m, HQ, D], k: [B, m, H, D], v: [B, m, H, Dv] of the new tokens.
        cache: the `SBACache` of `sb_attn_prefill` (and earlier steps).
        scale, attend_current: as `sb_attn` (the prefill's values).
        block_size: keys per tile, default DECODE_BLOCK_SIZE.
        mask: None or [B, m] (bool or 0 / 1): 0 at masked new tokens (no key; output 0).

    Returns o [B, m, HQ, Dv] in q's dtype: the last m rows of `sb_attn` on the cached
    sequence plus these tokens (m = 0: empty, the cache unchanged). Differentiable through
    plain autograd, which stores every tile: meant for inference.
    """
    check_sb_attn_inputs(q, k, v, scale, None, attend_current)
    if not isinstance(cache, SBACache):
        raise ValueError(f"cache must be the SBACache of sb_attn_prefill, got "
                         f"{type(cache).__name__}")
    for name, x, c in (("k", k, cache.k), ("v", v, cache.v)):
        if x.shape[0] != c.shape[0] or x.shape[2:] != c.shape[2:]:
            raise ValueError(f"{name}: expected [B, m, H, D] = [{c.shape[0]}, m, "
                             f"{', '.join(map(str, c.shape[2:]))}] as the cache's, got "
                             f"{tuple(x.shape)}")
    if q.shape[1] == 0:
        return q.new_zeros(q.shape[:3] + v.shape[3:])
    keep = None
    if mask is not None and checks_on_host(q.device):
        keep = check_attention_mask(mask, q.shape[0], q.shape[1], q.device)
    elif mask is not None:  # values checked by the device: no host read per token
        keep = mask_on_device(mask, q.shape[0], q.shape[1], q.device)
    cache.append(k, v, keep)
    o = sb_attn_last_rows(q, cache.k, cache.v, scale=scale, attend_current=attend_current,
                          key_mask=cache.key_mask, block_size=block_size)
    return o if keep is None else torch.where(keep[..., None, None], o, o.new_zeros(()))


def sb_attn_last_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      scale: float | None = None, attend_current: bool = False,
                      start: torch.Tensor | None = None,
                      key_mask: torch.Tensor | None = None,
                      block_size: int | None = None) -> torch.Tensor:
    """The last m rows of `sb_attn` on a sequence of n keys.

    Args:
        q: [B, m, HQ, D] queries of positions n - m .. n - 1 (m <= n).
        k: [B, n, H, D], v: [B, n, H, Dv] every key and value.
        start: None or int [B]: keys before start[b] are absent (left padding).
        key_mask: None or bool [B, n]: False marks absent keys (masked tokens).
        scale, attend_current: as `sb_attn`; block_size: keys per tile (DECODE_BLOCK_SIZE).

    Returns o [B, m, HQ, Dv] in q's dtype.
    """
    check_sb_attn_inputs(q, k, v, scale, None, attend_current, decode=True)
    B, m, HQ, D = q.shape
    n, H, Dv = k.shape[1], k.shape[2], v.shape[3]
    if start is not None:
        check_start(start, B, n, q.device)
    if key_mask is not None and (not isinstance(key_mask, torch.Tensor) or tuple(
            key_mask.shape) != (B, n) or key_mask.dtype != torch.bool):
        raise ValueError(f"key_mask must be a bool tensor [B, n] = [{B}, {n}]")
    C = check_block_size(block_size) or DECODE_BLOCK_SIZE
    Gr, cd, s = HQ // H, compute_dtype(q.dtype), default_scale(D, scale)
    if B * m == 0:
        return q.new_zeros(B, m, HQ, Dv)
    qr = q.to(cd).view(B, m, H, Gr, D).permute(0, 2, 3, 1, 4).reshape(B, H, Gr * m, D)
    pos = (n - m + torch.arange(m, device=q.device)).repeat(Gr)  # [R] position of each row
    later = later_keys_matrix(C, False, cd, q.device)
    o = qr.new_zeros(B, H, Gr * m, Dv)  # [B, H, R, Dv]
    run = qr.new_zeros(B, H, Gr * m)
    for lo in range((n - 1) // C * C, -1, -C):  # key blocks, right to left
        hi = min(lo + C, n)
        keys = torch.arange(lo, hi, device=q.device)  # [c]
        allowed = keys[None, :] <= pos[:, None] if attend_current else \
            keys[None, :] < pos[:, None]  # [R, c]
        if start is not None:
            allowed = allowed & (keys[None, :] >= start[:, None])[:, None, None, :]
        if key_mask is not None:  # [B, 1, 1, c]
            allowed = allowed & key_mask[:, None, None, lo:hi]
        kc = k[:, lo:hi].to(cd).transpose(1, 2)  # [B, H, c, D]
        t = tile_weights(qr, kc, run, s, allowed, later[: hi - lo, : hi - lo])
        o += t.A @ v[:, lo:hi].to(cd).transpose(1, 2)  # [B, H, R, Dv]
        run += t.ln.sum(-1)
    o = o.view(B, H, Gr, m, Dv).permute(0, 3, 1, 2, 4).reshape(B, m, HQ, Dv)
    return o.to(q.dtype)
