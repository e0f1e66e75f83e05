"""The Triton path of PaTH attention as torch.library custom ops with autograd.

    pathattn::path_attn_fwd(q, k, v, w, beta, g, cu_seqlens, scale, block_size, seg)
        -> (o [B, T, HQ, Dv], lse [B, T, HQ] float32, u, kt, m, x, wt, vc, gc, go)
    pathattn::path_attn_bwd(do, q, k, v, w, beta, g, cu_seqlens, o, lse, u, kt, m, x, wt, vc,
                            gc, go, scale, block_size, seg) -> (dq, dk, dv, dw, dbeta, dg)

w is [B, T, H, D] and beta [B, T, H], or with R reflections per token w [B, T, H, R, D] and
beta [B, T, H, R] (dw and dbeta in the same shapes). Both have fake (meta) implementations,
and the forward op has a registered autograd formula, so torch.compile traces through
`path_attn_triton` without a graph break. The forward saves the inputs, o, lse and the UT
quantities (u, kt, m, the inverses x and the copies wt, vc that the scans read, all of
`ut.ut_fwd`; O(T) memory), so the UT transform runs once per training step, and the
cumulative gates gc with their block offsets go (`_cumulative_gates`; empty without g).
The first forward call of a configuration compiles its kernels side by side, with the
backward's when an input requires grad (`pathattn.ops.common.triton_launch.compile_ahead`).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ...common.heads import default_scale
from ...common.row_dot import row_dot
from ...common.triton_gates import block_offsets, sequence_cumsum
from ...common.triton_launch import compile_ahead, grad_follows, specialisation, specialised
from ...common.validation import check_tile_length
from ..stages import single_reflection
from ..validation import check_path_attn_inputs
from ._common import interpreting, tile_kwargs, transition_dtype
from .bwd import bwd_scan
from .config import device_launch_config
from .fwd import fwd_scan
from .segments import segment_keys
from .tables import call_tables, default_seg
from .ut import ut_bwd, ut_fwd

__all__ = ["path_attn_triton", "run_kernels", "largest_block_size"]

_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def largest_block_size(D: int, Dv: int | None = None, dtype: torch.dtype = torch.float32,
                       device: torch.device | str = "cpu", reflections: int = 1) -> int:
    """Block length BT the kernels use for head dims D, Dv, inputs of `dtype` on `device` and
    `reflections` (R) reflections per token: the largest whose kernels fit the device's
    shared memory (`config.launch_config`)."""
    return device_launch_config(D, D if Dv is None else Dv, dtype, torch.device(device),
                                reflections=reflections).BT


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, T, *F] -> contiguous [B * T, *F]."""
    return x.reshape((-1,) + tuple(x.shape[2:])).contiguous()


def _flat_reflections(w: torch.Tensor, beta: torch.Tensor):
    """w [B, T, H, D] or [B, T, H, R, D], beta [B, T, H] or [B, T, H, R] -> contiguous
    w [B * T * R, H, D] and beta [B * T * R, H], reflection r of token t in row t * R + r
    (the kernels' layout: a block's reflections are consecutive rows of each head)."""
    if w.ndim == 4:
        return _flat(w), _flat(beta)
    B, T, H, R, D = w.shape
    return (w.transpose(2, 3).reshape(B * T * R, H, D),  # [B, T, R, H, D] rows
            beta.transpose(2, 3).reshape(B * T * R, H))


def _unflat_reflections(dw: torch.Tensor, dbeta: torch.Tensor, w: torch.Tensor,
                        beta: torch.Tensor):
    """Gradients [B * T * R, H, D] / [B * T * R, H] back to the shapes of w and beta."""
    if w.ndim == 4:
        return dw.view(w.shape), dbeta.view(beta.shape)
    B, T, H, R, D = w.shape
    return (dw.view(B, T, R, H, D).transpose(2, 3).contiguous(),  # [B, T, H, R, D]
            dbeta.view(B, T, R, H).transpose(2, 3).contiguous())


def _cumulative_gates(g, table: torch.Tensor, block_size: int):
    """The scans' gates (None without g): G [B * T, HQ] float64, the per-sequence cumulative
    sum of the log forget gates (no sum crosses a sequence; non-finite gates read as 0),
    and its float32 offsets to each block's first and last token [2, HQ, B * T]
    (`block_gate_offsets`): three kernels of `pathattn.ops.common.triton_gates` over the
    block table."""
    if g is None:
        return None
    G = sequence_cumsum(_flat(g), table, block_size, finite=True)
    return G, block_offsets(G, table, block_size)


def _gate_grad(dG, table: torch.Tensor, block_size: int):
    """dL/dg [B * T, HQ] float64 from dG = dL/dG [B * T, HQ] (`bwd.bwd_scan`):
    dL/dg_t = sum of dL/dG_s over s >= t in t's sequence."""
    return sequence_cumsum(dG, table, block_size, reverse=True)


def _setup(q, v, w, block_size: int, seg: int, B, T, cu_seqlens, pairs: bool = False):
    """Block table, segment length (about sqrt of the blocks per sequence unless given) with
    the segment slots and their number (`segments.segment_slots`), with `pairs` the pair
    bases and rows of the multi-segment transitions (`crossings.segment_pairs`; else
    None), all of `tables.call_tables` (kept per shape for dense batches), float32 product
    precision (3xTF32 for float32 inputs: tensor cores at about float32 accuracy), the
    triton dtypes of the inputs and of the transitions' operands,
    interpreter flag, and the launch configuration (num_warps / num_stages per kernel) of
    this block size on q's device for the reflections per token of w."""
    cfg = device_launch_config(q.shape[-1], v.shape[-1], q.dtype, q.device, block_size,
                               _reflections(w))
    t = call_tables(B, T, cu_seqlens, block_size, seg, q.device, pairs, cfg.seg_multiple())
    prec = "tf32x3" if q.dtype == torch.float32 else "tf32"
    tdt = _TL_DTYPE[transition_dtype(q.dtype)]
    return (t.table, t.seg, (t.slots, t.n_slots), t.pairs, prec, _TL_DTYPE[q.dtype], tdt,
            interpreting(), cfg)


def _reflections(w: torch.Tensor) -> int:
    """R: w [B, T, H, D] (1) or [B, T, H, R, D]."""
    return 1 if w.ndim == 4 else w.shape[3]


def _compile_key(step: str, q, k, v, w, beta, g, cu_seqlens, block_size: int, seg: int
                 ) -> tuple:
    """What selects the kernels of a forward or backward call and their specialisation:
    the inputs (`specialisation`), packing, block size and the segment length the call
    uses (`_setup`)."""
    B, T = q.shape[:2]
    n_max = -(-(T if cu_seqlens is None else B * T) // block_size)
    if seg <= 0:
        seg = default_seg(n_max, device_launch_config(q.shape[-1], v.shape[-1], q.dtype,
                                                      q.device, block_size,
                                                      _reflections(w)).seg_multiple())
    return ("path", step, q.device, specialisation(q, k, v, w, beta, g),
            cu_seqlens is None, block_size, specialised(seg))


@torch.library.custom_op("pathattn::path_attn_fwd", mutates_args=())
def path_attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                  beta: torch.Tensor, g: Optional[torch.Tensor],  # noqa: UP045
                  cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
                  block_size: int, seg: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor, torch.Tensor]:
    args = (q, k, v, w, beta, g, cu_seqlens, scale, block_size, seg)
    keys = [_compile_key(step, q, k, v, w, beta, g, cu_seqlens, block_size, seg)
            for step in ("fwd", "bwd")[:1 + grad_follows(q, k, v, w, beta, g)]]
    compile_ahead(keys, q.device, lambda: _compile_step(args, len(keys) > 1))
    return _forward(*args)


def _compile_step(args: tuple, backward: bool) -> None:
    """The forward's kernel calls, then with `backward` the backward's on tensors shaped as
    the forward's outputs (and dO as o): the compile-only pass of a training step."""
    saved = _forward(*args)
    if backward:
        q, k, v, w, beta, g, cu_seqlens, scale, block_size, seg = args
        _backward_kernels(torch.empty_like(saved[0]), q, k, v, w, beta, g, cu_seqlens, *saved,
                          scale, block_size, seg)


def _forward(q, k, v, w, beta, g, cu_seqlens, scale: float, block_size: int, seg: int):
    """`path_attn_fwd`'s kernels."""
    B, T, HQ, D = q.shape
    Dv = v.shape[-1]
    table, seg, (slots, n_slots), _, prec, dt, tdt, emulate, cfg = _setup(
        q, v, w, block_size, seg, B, T, cu_seqlens)
    tiles = tile_kwargs(D, Dv)
    BD = tiles["BD"]
    qf, kf, vf = (_flat(x) for x in (q, k, v))
    wf, bf = _flat_reflections(w, beta)  # [N * R, H, D], [N * R, H]
    u, kt, m, xinv, wt, vc = ut_fwd(kf, vf, wf, bf, table, block_size, tiles["BD"],
                                    tiles["BDV"], prec, transition_dtype(q.dtype),
                                    cfg.launch_kwargs("ut_fwd"))
    G = _cumulative_gates(g, table, block_size)
    ks, ms, _ = segment_keys(wt, u, kt, table, slots, n_slots, seg, block_size, BD, prec, dt,
                             tdt, emulate, _reflections(w), launch=cfg.launch_kwargs("seg"),
                             walk=cfg.seg_walk)
    o, lse = fwd_scan(qf, kf, vc, wt, u, kt, m, G, ks, ms, slots, table, scale, seg,
                      block_size, BD, tiles["BDV"], cfg.m_rows(BD), dt, tdt, prec, emulate,
                      cfg.launch_kwargs("fwd"))
    gc, go = G if G is not None else (q.new_empty(0, dtype=torch.float64),
                                      q.new_empty(0, dtype=torch.float32))
    return o.view(B, T, HQ, Dv), lse.view(B, T, HQ), u, kt, m, xinv, wt, vc, gc, go


@path_attn_fwd.register_fake
def _(q, k, v, w, beta, g, cu_seqlens, scale, block_size, seg):
    B, T, HQ, D = q.shape
    H = k.shape[2]
    NR = B * T * (1 if w.ndim == 4 else w.shape[3])
    BTR = triton.next_power_of_2(block_size * (1 if w.ndim == 4 else w.shape[3]))
    return (q.new_empty(B, T, HQ, v.shape[-1]),
            q.new_empty(B, T, HQ, dtype=torch.float32),
            q.new_empty(NR, H, D, dtype=transition_dtype(q.dtype)),
            q.new_empty(B * T, H, D),
            q.new_empty(NR, H, block_size, dtype=torch.float32),
            q.new_empty(NR, H, BTR, dtype=torch.float32),
            q.new_empty(NR, H, D, dtype=transition_dtype(q.dtype)),
            v.new_empty(B * T, H, v.shape[-1]),
            q.new_empty(*((0,) if g is None else (B * T, HQ)), dtype=torch.float64),
            q.new_empty(*((0,) if g is None else (2, HQ, B * T)), dtype=torch.float32))


@torch.library.custom_op("pathattn::path_attn_bwd", mutates_args=())
def path_attn_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  w: torch.Tensor, beta: torch.Tensor,
                  g: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],  # noqa: UP045
                  o: torch.Tensor, lse: torch.Tensor, u: torch.Tensor, kt: torch.Tensor,
                  m: torch.Tensor, xinv: torch.Tensor, wt: torch.Tensor, vc: torch.Tensor,
                  gc: torch.Tensor, go: torch.Tensor,
                  scale: float, block_size: int,
                  seg: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                     torch.Tensor, torch.Tensor]:
    """Gradients of (q, k, v, w, beta, g) from the forward's outputs and UT quantities; dg
    is an empty tensor when g is None."""
    args = (do, q, k, v, w, beta, g, cu_seqlens, o, lse, u, kt, m, xinv, wt, vc, gc, go, scale,
            block_size, seg)
    compile_ahead([_compile_key("bwd", q, k, v, w, beta, g, cu_seqlens, block_size, seg)],
                  q.device, lambda: _backward_kernels(*args))
    return _backward_kernels(*args)


def _backward_kernels(do, q, k, v, w, beta, g, cu_seqlens, o, lse, u, kt, m, xinv, wt, vc,
                      gc, go,
                      scale: float, block_size: int, seg: int):
    """`path_attn_bwd`'s kernels."""
    B, T, HQ, D = q.shape
    H, Dv = k.shape[2], v.shape[-1]
    table, seg, (slots, n_slots), pairs, prec, dt, tdt, emulate, cfg = _setup(
        q, v, w, block_size, seg, B, T, cu_seqlens, pairs=True)
    tiles = tile_kwargs(D, Dv)
    BD, BDV = tiles["BD"], tiles["BDV"]
    qf, kf = _flat(q), _flat(k)
    wf, bf = _flat_reflections(w, beta)  # [N * R, H, D], [N * R, H]
    dof = _flat(do)
    G = None if g is None else (gc, go)  # the forward's
    lsef = _flat(lse)
    delta = row_dot(dof, _flat(o))  # rowsum(dO * O) [N, HQ], float32
    dqt, dsd, dv, dkt, du, dwp, dG = bwd_scan(qf, kf, vc, wt, u, kt, m, G, dof, lsef, delta,
                                              table, slots, n_slots, pairs, scale, seg,
                                              block_size, BD, BDV, dt,
                                              tdt, prec, emulate, cfg.e_rows(BD),
                                              cfg.kv_rows(BD), cfg.launch_kwargs("bwd"),
                                              cfg.launch_kwargs("seg"),
                                              cfg.launch_kwargs("bwd_kv"),
                                              cfg.kv_tiles(), cfg.seg_bwd_rows(BD),
                                              cfg.launch_kwargs("seg_bwd"), cfg.seg_walk,
                                              cfg.launch_kwargs("pi"))
    dq, dk, dw, dbeta = ut_bwd(qf, kf, wf, bf, xinv, dqt, dsd, dkt, du, dwp, table, scale,
                               block_size, BD, prec, cfg.launch_kwargs("ut_bwd"),
                               cfg.launch_kwargs("ut_bwd_q"), cfg.launch_kwargs("ut_bwd_inv"),
                               cfg.launch_kwargs("ut_bwd_dk"))
    dg = (q.new_empty(0) if g is None
          else _gate_grad(dG, table, block_size).to(g.dtype).view(g.shape))
    dw, dbeta = _unflat_reflections(dw, dbeta, w, beta)
    return (dq.view(q.shape), dk.view(k.shape), dv.view(B, T, H, Dv), dw, dbeta,
            dg)


@path_attn_bwd.register_fake
def _(do, q, k, v, w, beta, g, cu_seqlens, o, lse, u, kt, m, xinv, wt, vc, gc, go, scale,
      block_size, seg):
    dg = q.new_empty(0) if g is None else torch.empty_like(g)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(w),
            torch.empty_like(beta), dg)


def _setup_context(ctx, inputs, output):
    q, k, v, w, beta, g, cu_seqlens, scale, block_size, seg = inputs
    ctx.save_for_backward(q, k, v, w, beta, g, cu_seqlens, *output)  # o, lse, u, ..., go
    ctx.scale, ctx.block_size, ctx.seg = scale, block_size, seg
    ctx.has_g = g is not None
    # only o carries a gradient: no zero gradients are made for lse and the UT quantities
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)


def _backward(ctx, do, *_):
    q, k, v, w, beta, g, cu_seqlens, *saved = ctx.saved_tensors  # o, lse, u, ..., vc, gc, go
    dq, dk, dv, dw, dbeta, dg = path_attn_bwd(do.contiguous(), q, k, v, w, beta, g, cu_seqlens,
                                              *saved, ctx.scale, ctx.block_size, ctx.seg)
    return dq, dk, dv, dw, dbeta, (dg if ctx.has_g else None), None, None, None, None


path_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


def path_attn_triton(q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None,
                     block_size=None, seg: int = 0) -> torch.Tensor:
    """`pathattn.path_attn` on the Triton kernels (same arguments and result).

    block_size: None (the largest block length whose kernels fit the device's shared memory,
    see `pathattn.ops.path.triton.config`; with R > 1 reflections per token a shorter one, so
    that a block's tile of reflections stays at most 64 rows) or a power of two in
    [16, 128]; on a GPU a block size whose kernels do not fit raises a ValueError naming
    the largest that does.
    seg: blocks per segment (0: about sqrt of the number of blocks): the forward meets the
    blocks of earlier segments as plain attention and the backward recomputes states per
    segment (`segments.py`); a tuning and testing knob, the result does not depend on it.
    Inputs must be float32, bfloat16 or float16 (float64 stays on the PyTorch path).
    """
    check_path_attn_inputs(q, k, v, w, beta, g, scale, cu_seqlens)
    w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, T, H, D]
    if q.dtype == torch.float64:
        raise ValueError("backend='triton' computes in float32: float64 inputs need "
                         "backend='torch'")
    B, T, HQ, D = q.shape
    if B * T == 0:
        if block_size is not None:
            check_tile_length(block_size)
        return q.new_zeros(B, T, HQ, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
    return run_kernels(q, k, v, w, beta, g, default_scale(D, scale), cu_seqlens, block_size,
                       seg)


def run_kernels(q, k, v, w, beta, g, scale: float, cu_seqlens, block_size, seg: int = 0
                ) -> torch.Tensor:
    """The kernels on inputs already validated (the "triton" entry of
    `pathattn.ops.path.backends`; `path_attn_triton` checks first): B * T > 0, float32 /
    bfloat16 / float16, scale a float. Returns o [B, T, HQ, Dv]."""
    if block_size is not None:
        check_tile_length(block_size)
    block_size = device_launch_config(q.shape[-1], v.shape[-1], q.dtype, q.device,
                                      block_size, _reflections(w)).BT
    o = path_attn_fwd(q, k, v, w, beta, g, cu_seqlens, scale, block_size, seg)[0]
    return o
