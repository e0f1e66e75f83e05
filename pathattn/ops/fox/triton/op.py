"""The FoX kernels as torch.library custom ops with autograd.

    pathattn::fox_fwd(q, k, v, g, cu_seqlens, scale, block_size)
        -> (o [B, T, HQ, Dv], o_lo, lse [B * T, HQ] float32 (base 2), G [B * T, HQ] float64)
    pathattn::fox_bwd(do, q, k, v, g, cu_seqlens, o, o_lo, lse, G, scale, block_size)
        -> (dq, dk, dv, dg)

o_lo: for 16-bit inputs o's rounding error [B * T, HQ, Dv] (`fwd.fox_forward`), else
empty.

Both have fake (meta) implementations and the forward a registered autograd formula, so
torch.compile traces through `fox_attn_triton` without a graph break. The forward saves
q, k, v, g, o, o_lo, lse and the cumulative gates G: O(T) memory.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...common.row_dot import row_dot
from ...common.token_blocks import token_tile_table
from ...common.triton_gates import block_offsets, sequence_cumsum
from ...common.triton_launch import compile_ahead, grad_follows, specialisation
from ...common.validation import check_tile_length as check_block_size
from ._common import TL_DTYPE, interpreting
from .bwd import key_grads, query_grads
from .config import launch_config, padded_dim
from .fwd import fox_forward

__all__ = ["fox_attn_triton", "check_block_size"]


def _tokens(x: torch.Tensor) -> torch.Tensor:
    """[B, T, *F] -> [B * T, *F], a view where the strides allow; last dim contiguous."""
    x = x.reshape((-1,) + tuple(x.shape[2:]))
    return x if x.stride(-1) == 1 else x.contiguous()


class _Launch:
    """Tile tables, tile widths, dtypes and launch settings of one call; `table(kernel)`
    builds each kernel's table once (kernels with the same tile length share it)."""

    def __init__(self, q, v, cu_seqlens, block_size: int):
        self.B, self.T = q.shape[:2]
        self.q, self.cu_seqlens = q, cu_seqlens
        self.cfg = launch_config(q.shape[-1], v.shape[-1], q.dtype, block_size or None)
        self.tiles = {"BD": padded_dim(q.shape[-1]), "BDV": padded_dim(v.shape[-1]),
                      "dt": TL_DTYPE[q.dtype], "emulate": interpreting(),
                      "prec": "tf32x3" if q.dtype == torch.float32 else "tf32"}
        self._tables: dict = {}

    def table(self, kernel: str) -> torch.Tensor:
        BT = self.cfg.tile(kernel)
        if BT not in self._tables:
            self._tables[BT] = token_tile_table(self.B, self.T, self.cu_seqlens, BT,
                                                self.q.device)
        return self._tables[BT]

    def gate_offsets(self, G: torch.Tensor, kernel: str) -> torch.Tensor:
        """G's float32 offsets to the first and last token of `kernel`'s tiles, [2, HQ, N]
        (`common.triton_gates.block_offsets`), once per tile length."""
        BT = self.cfg.tile(kernel)
        if ("gates", BT) not in self._tables:
            self._tables[("gates", BT)] = block_offsets(G, self.table(kernel), BT)
        return self._tables[("gates", BT)]

    def kwargs(self, kernel: str) -> dict:
        """The launcher's keyword arguments for `kernel`."""
        return {**self.tiles, "BT": self.cfg.tile(kernel), "launch": self.cfg.launch(kernel)}


@torch.library.custom_op("pathattn::fox_fwd", mutates_args=())
def fox_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
            cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
            block_size: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    args = (q, k, v, g, cu_seqlens, scale, block_size)
    backward = grad_follows(q, k, v, g)
    keys = [_compile_key("fwd", None, *args)]
    if backward:  # dO as the backward most often gets it: contiguous, o's shape
        do = torch.empty(q.shape[:3] + v.shape[-1:], dtype=q.dtype, device="meta")
        keys.append(_compile_key("bwd", do, *args))
    compile_ahead(keys, q.device, lambda: _compile_step(args, backward))
    return _forward(*args)


def _compile_key(step: str, do, q, k, v, g, cu_seqlens, scale, block_size) -> tuple:
    """What selects the kernels of a forward (do None) or backward call."""
    return ("fox", step, q.device, specialisation(do, q, k, v, g), cu_seqlens is None,
            block_size)


def _compile_step(args: tuple, backward: bool) -> None:
    """The forward's kernel calls, then with `backward` the backward's on tensors shaped as
    the forward's outputs (and dO as o): the compile-only pass of a training step."""
    saved = _forward(*args)
    if backward:
        q, k, v, g, cu_seqlens, scale, block_size = args
        _backward_kernels(torch.empty_like(saved[0]), q, k, v, g, cu_seqlens, *saved, scale,
                          block_size)


def _forward(q, k, v, g, cu_seqlens, scale: float, block_size: int):
    """`fox_fwd`'s kernels."""
    B, T, HQ, _ = q.shape
    run = _Launch(q, v, cu_seqlens, block_size)
    table = run.table("fwd")
    G = sequence_cumsum(_tokens(g), table, run.cfg.tile("fwd"))  # [N, HQ] float64
    o, o_lo, lse = fox_forward(_tokens(q), _tokens(k), _tokens(v), G,
                               run.gate_offsets(G, "fwd")[1], table, scale, **run.kwargs("fwd"))
    return o.view(B, T, HQ, v.shape[-1]), o_lo, lse, G


@fox_fwd.register_fake
def _(q, k, v, g, cu_seqlens, scale, block_size):
    B, T, HQ, _ = q.shape
    N = B * T if q.dtype != torch.float32 else 0
    return (q.new_empty(B, T, HQ, v.shape[-1]), q.new_empty(N, HQ, v.shape[-1]),
            q.new_empty(B * T, HQ, dtype=torch.float32),
            q.new_empty(B * T, HQ, dtype=torch.float64))


@torch.library.custom_op("pathattn::fox_bwd", mutates_args=())
def fox_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            g: torch.Tensor, cu_seqlens: Optional[torch.Tensor],  # noqa: UP045
            o: torch.Tensor, o_lo: torch.Tensor, lse: torch.Tensor, G: torch.Tensor,
            scale: float,
            block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of (q, k, v, g) in their dtypes from the forward's o, o_lo, lse and G."""
    args = (do, q, k, v, g, cu_seqlens, o, o_lo, lse, G, scale, block_size)
    compile_ahead([_compile_key("bwd", do, q, k, v, g, cu_seqlens, scale, block_size)],
                  q.device, lambda: _backward_kernels(*args))
    return _backward_kernels(*args)


def _backward_kernels(do, q, k, v, g, cu_seqlens, o, o_lo, lse, G, scale: float,
                      block_size: int):
    """`fox_bwd`'s kernels."""
    run = _Launch(q, v, cu_seqlens, block_size)
    qf, kf, vf, dof = _tokens(q), _tokens(k), _tokens(v), _tokens(do)
    # rowsum(dO * O) [N, HQ] float32, O = o + o_lo (o's rounding error, for 16-bit inputs)
    delta = row_dot(dof, _tokens(o), o_lo.view(dof.shape) if o_lo.numel() else None)
    dk, dv, dcol = key_grads(qf, kf, vf, G, run.gate_offsets(G, "dkdv"), dof, lse, delta,
                             run.table("dkdv"), scale, **run.kwargs("dkdv"))
    dq, drow = query_grads(qf, kf, vf, G, run.gate_offsets(G, "dq"), dof, lse, delta,
                           run.table("dq"), scale, **run.kwargs("dq"))
    # dL/dG_t = rowsum_t - colsum_t; dL/dg_t = its sum over s >= t of t's sequence
    dg = sequence_cumsum(drow - dcol, run.table("dq"), run.cfg.tile("dq"), reverse=True)
    return (dq.view(q.shape), dk.view(k.shape), dv.view(v.shape),
            dg.to(g.dtype).view(g.shape))


@fox_bwd.register_fake
def _(do, q, k, v, g, cu_seqlens, o, o_lo, lse, G, scale, block_size):
    return tuple(torch.empty_like(x) for x in (q, k, v, g))


def _setup_context(ctx, inputs, output):
    q, k, v, g, cu_seqlens, scale, block_size = inputs
    ctx.save_for_backward(q, k, v, g, cu_seqlens, *output)  # o, o_lo, lse, G
    ctx.scale, ctx.block_size = scale, block_size
    ctx.mark_non_differentiable(*output[1:])  # o_lo, lse, G: no zero gradients made
    ctx.set_materialize_grads(False)


def _backward(ctx, do, *_):
    q, k, v, g, cu_seqlens, *saved = ctx.saved_tensors  # o, o_lo, lse, G
    dq, dk, dv, dg = fox_bwd(do, q, k, v, g, cu_seqlens, *saved, ctx.scale, ctx.block_size)
    return dq, dk, dv, dg, None, None, None


fox_fwd.register_autograd(_backward, setup_context=_setup_context)


def fox_attn_triton(q, k, v, g, scale: float, cu_seqlens, block_size) -> torch.Tensor:
    """The kernels on validated inputs (B * T > 0; float32, bfloat16 or float16; scale
    resolved): o [B, T, HQ, Dv] in q's dtype, differentiable in q, k, v and g. block_size
    None takes each kernel's tile length from `config.launch_config`."""
    check_block_size(block_size)
    launch_config(q.shape[-1], v.shape[-1], q.dtype)  # head dims checked here
    return fox_fwd(q, k, v, g, cu_seqlens, scale, block_size or 0)[0]
