"""The stick-breaking kernels as torch.library custom ops with autograd.

    pathattn::sb_triton_fwd(q, k, v, cu_seqlens, scale, attend_current, block_size)
        -> o [B, T, HQ, Dv] in q's dtype
    pathattn::sb_triton_bwd(do, q, k, v, cu_seqlens, scale, attend_current, block_size)
        -> (dq, dk, dv)

Both have fake (meta) implementations and the forward a registered autograd formula, so
torch.compile traces through `sb_attn_triton` without a graph break. The forward saves
q, k, v only (the backward recomputes every tile): O(T) memory between the passes. The
backward's running sums take [2, heads, key tiles, N] float32 while it runs
(`config.SNAPSHOT_BYTES`, `bwd`); nothing is read back to the host.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...common.token_blocks import token_tile_table
from ...common.triton_launch import compile_ahead, grad_follows, specialisation
from ...common.triton_tiles import TL_DTYPE, interpreting, padded_dim
from ...common.validation import check_tile_length as check_block_size
from . import config
from .bwd import key_grads, query_grads
from .config import launch_config
from .fwd import sb_forward

__all__ = ["sb_attn_triton", "check_block_size"]


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """[B, T, *F] -> [B * T, *F], a view where the strides allow; last dim contiguous."""
    x = x.reshape((-1,) + tuple(x.shape[2:]))
    return x if x.stride(-1) == 1 else x.contiguous()


def _tile_args(q: torch.Tensor, v: torch.Tensor, kernel: str, block_size: int) -> dict:
    """The launcher's keyword arguments for `kernel` (tile length, widths, dtype, launch)."""
    cfg = launch_config(q.shape[-1], v.shape[-1], q.dtype, block_size or None)
    return {"BT": cfg.tile(kernel), "BD": padded_dim(q.shape[-1]),
            "BDV": padded_dim(v.shape[-1]), "dt": TL_DTYPE[q.dtype], "emulate": interpreting(),
            "prec": "tf32x3" if q.dtype == torch.float32 else "tf32",
            "launch": cfg.launch(kernel)}


@torch.library.custom_op("pathattn::sb_triton_fwd", mutates_args=())
def sb_triton_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
                  attend_current: bool, block_size: int) -> torch.Tensor:
    args = (q, k, v, cu_seqlens, scale, attend_current, block_size)
    if grad_follows(q, k, v):  # the forward's one kernel, with the backward's two
        do = torch.empty(q.shape[:3] + v.shape[-1:], dtype=q.dtype, device="meta")
        compile_ahead([_compile_key("fwd", None, *args), _compile_key("bwd", do, *args)],
                      q.device, lambda: _compile_step(args))
    return _forward(*args)


def _compile_key(step: str, do, q, k, v, cu_seqlens, scale, attend_current, block_size
                 ) -> tuple:
    """What selects the kernels of a forward (do None) or backward call."""
    return ("sba", step, q.device, specialisation(do, q, k, v), cu_seqlens is None,
            attend_current, block_size)


def _compile_step(args: tuple) -> None:
    """The forward's kernel call, then the backward's with dO shaped as o: the compile-only
    pass of a training step."""
    o = _forward(*args)
    _backward_kernels(torch.empty_like(o), *args)


def _forward(q, k, v, cu_seqlens, scale: float, attend_current: bool, block_size: int):
    """`sb_triton_fwd`'s kernel."""
    B, T, HQ, _ = q.shape
    args = _tile_args(q, v, "fwd", block_size)
    table = token_tile_table(B, T, cu_seqlens, args["BT"], q.device)
    o = sb_forward(_tokens(q), _tokens(k), _tokens(v), table, scale, attend_current, **args)
    return o.view(B, T, HQ, v.shape[-1])


@sb_triton_fwd.register_fake
def _(q, k, v, cu_seqlens, scale, attend_current, block_size):
    return q.new_empty(tuple(q.shape[:3]) + (v.shape[-1],))


@torch.library.custom_op("pathattn::sb_triton_bwd", mutates_args=())
def sb_triton_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
                  attend_current: bool,
                  block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of (q, k, v) in their dtype, recomputing the forward's tiles."""
    args = (do, q, k, v, cu_seqlens, scale, attend_current, block_size)
    compile_ahead([_compile_key("bwd", *args)], q.device, lambda: _backward_kernels(*args))
    return _backward_kernels(*args)


def _backward_kernels(do, q, k, v, cu_seqlens, scale: float, attend_current: bool,
                      block_size: int):
    """`sb_triton_bwd`'s kernels."""
    B, T, HQ, D = q.shape
    H = k.shape[2]
    G = HQ // H
    qf, kf, vf, dof = _tokens(q), _tokens(k), _tokens(v), _tokens(do.to(q.dtype))
    N = qf.shape[0]
    dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
    dq_args = _tile_args(q, v, "dq", block_size)
    kv_args = _tile_args(q, v, "dkdv", block_size)
    BT = dq_args["BT"]
    table = token_tile_table(B, T, cu_seqlens, BT, q.device)
    NS = -(-T // BT)  # key tiles of the longest possible sequence
    heads = max(1, min(H, config.SNAPSHOT_BYTES // (8 * G * NS * N)))  # key/value heads per launch
    snapshots = torch.empty(2, heads * G, NS, N, dtype=torch.float32, device=q.device)
    for h0 in range(0, H, heads):
        h1 = min(H, h0 + heads)
        qs, ks = slice(h0 * G, h1 * G), slice(h0, h1)
        snap = snapshots[:, : (h1 - h0) * G]
        args = (qf[:, qs], kf[:, ks], vf[:, ks], dof[:, qs])
        query_grads(*args, dq[:, qs], snap, table, scale, attend_current, **dq_args)
        key_grads(*args, dk[:, ks], dv[:, ks], snap, table, scale, attend_current, **kv_args)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


@sb_triton_bwd.register_fake
def _(do, q, k, v, cu_seqlens, scale, attend_current, block_size):
    return tuple(torch.empty_like(x) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, scale, attend_current, block_size = inputs
    ctx.save_for_backward(q, k, v, cu_seqlens)
    ctx.args = (scale, attend_current, block_size)


def _backward(ctx, do):
    q, k, v, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = sb_triton_bwd(do, q, k, v, cu_seqlens, *ctx.args)
    return dq, dk, dv, None, None, None, None


sb_triton_fwd.register_autograd(_backward, setup_context=_setup_context)


def sb_attn_triton(q, k, v, scale: float, cu_seqlens, attend_current: bool,
                   block_size) -> torch.Tensor:
    """The kernels on validated inputs (B * T > 0; float32, bfloat16 or float16; scale
    resolved): o [B, T, HQ, Dv] in q's dtype, differentiable in q, k and v. block_size None
    takes the tile lengths of `config.launch_config`."""
    check_block_size(block_size)
    launch_config(q.shape[-1], v.shape[-1], q.dtype)  # head dims checked here
    return sb_triton_fwd(q, k, v, cu_seqlens, scale, attend_current, block_size or 0)
