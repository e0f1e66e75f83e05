"""Context-parallel (ring) PaTH attention over torch.distributed (paper section 3.5,
"Compatibility with context-parallelism (CP) techniques").

The sequence is cut into P contiguous shards, shard r on group rank r. Each rank

1. runs the blockwise op on its own shard (in-shard attention: `scan_forward`), and keeps
   the shard-level boundary-adjusted queries Qs, keys Ks and the shard's row-form
   transition Pt (`shard.shard_terms`; Pt = P^T with P the product of every H_t of the
   shard, D x D per head);
2. receives (Ks, V, Pt, gate key terms) of shards r-1, r-2, ..., 0, in that order (right to
   left, the scan order of section 3.3), each forwarded by its right neighbour along a
   chain 0 -> 1 -> ... -> P-1; attends with its query states Qs M to each incoming shard,
   M = Pt_{r-1} ... Pt_{s+1} the accumulated transition of the shards in between
   (maintained as a D x D product, M <- M Pt_s after shard s), and combines the partial
   softmaxes by log-sum-exp.

Backward (FlashAttention-2 recomputation with the global lse): the shards travel the same
chain again. With each shard travel its gradient accumulators (dKs, dV, and the column sums
of dS for the gate gradient); every rank adds its contribution and passes them on, and the
last rank returns them to the shard's owner. The query-state gradient splits into
dQs += dQ_t M_t^T and a D x D term Qs^T dQ_t per step, from which the gradients of the
transitions in between (dPt) follow by a D x D recursion after the ring; one all-reduce of
[P, B, H, D, D] (+ the gate totals [P, B, HQ]) brings dPt_s and the per-shard gate sums to
their owners. Gate gradient: each softmax row's dS sums to zero, so dL/dG_j is minus the
column sum of dS at key j over all queries (`pathattn.ops.path.gates`), then a suffix sum over
the whole sequence.

Communication per call (shard length T/P, element counts, c = compute dtype size):
forward, per hop: B (T/P) H (D + Dv) elements (K, V, as ring attention for plain
softmax) + B H D^2 (Pt) + B (T/P) HQ + B HQ float64 (gate terms, PaTH-FoX only);
backward, per hop: the same again plus B (T/P) (H (D + Dv) + HQ) of accumulators, one
return message of that size per shard, and one all-reduce of P B (H D^2 + HQ) float64.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ...common.block_size import DEFAULT_BLOCK_SIZE
from ...common.heads import compute_dtype, default_scale, kv_tokens, row_blocks, rows_to_tokens
from ...common.layout import make_layout
from ...common.validation import check_block_size
from ..backends import keys_backend
from ..cpu import scan_forward, ut_forward
from ..function import blocks_backward
from ..gates import gate_grad
from ..stages import block_inputs, num_reflections, single_reflection
from ..validation import check_path_attn_inputs
from .ring import Ring, ShardMeta, exchange_meta
from .shard import (
    cross_backward,
    cross_forward,
    heads_to_rows,
    merge_partial,
    rows_to_heads,
    shard_gates,
    shard_terms,
)

__all__ = ["context_parallel_path_attn", "ContextParallelPaTHFunction"]

_TAG_FWD, _TAG_BWD, _TAG_ACC, _TAG_RET = 100, 200, 300, 400


def _local_forward(q, k, w, beta, v, g, scale: float, C: int, kernels: bool):
    """In-shard attention and shard terms (no autograd). Returns o, lse in token-head
    layout [B, H, Gr, T, Dv] / [B, H, Gr, T] and the detached `ShardTerms`."""
    B, T, HQ, _ = q.shape
    H, Dv = k.shape[2], v.shape[-1]
    lay = make_layout(B, T, C, None, q.device)
    bi = block_inputs(q, k, v, w, beta, g, lay)
    ut = ut_forward(*bi.ut, scale, kernels)
    terms = shard_terms(lay, ut, B, T, HQ)
    o_rows, lse_rows = scan_forward(lay, ut, bi.vb, bi.gates, bi.wb, bi.bb, kernels)
    o = rows_to_heads(rows_to_tokens(o_rows, lay, (B, T, HQ, Dv)), H)
    lse = rows_to_heads(rows_to_tokens(lse_rows[..., None], lay, (B, T, HQ, 1)), H)[..., 0]
    return o, lse, terms


def _payload(terms, v_heads, gate_terms):
    """Tensors a shard sends along the chain: Ks, V, Pt (+ gate key terms and total)."""
    out = [terms.ks, v_heads, terms.pt]
    if gate_terms is not None:
        out += [gate_terms[1], gate_terms[2]]
    return out


def _empty_payload(meta: ShardMeta, T: int, gates: bool, cd, device):
    B, H, D, Dv, Gr = meta.B, meta.H, meta.D, meta.Dv, meta.HQ // meta.H
    out = [torch.empty(B, H, T, D, dtype=cd, device=device),
           torch.empty(B, H, T, Dv, dtype=cd, device=device),
           torch.empty(B, H, D, D, dtype=cd, device=device)]
    if gates:
        f64 = dict(dtype=torch.float64, device=device)
        out += [torch.empty(B, H, Gr, T, **f64), torch.empty(B, H, Gr, **f64)]
    return out


def _empty_acc(meta: ShardMeta, T: int, gates: bool, cd, device):
    """Zero gradient accumulators of a shard: dKs, dV (+ gate column sums)."""
    B, H, D, Dv, Gr = meta.B, meta.H, meta.D, meta.Dv, meta.HQ // meta.H
    out = [torch.zeros(B, H, T, D, dtype=cd, device=device),
           torch.zeros(B, H, T, Dv, dtype=cd, device=device)]
    if gates:
        out.append(torch.zeros(B, H, Gr, T, dtype=cd, device=device))
    return out


class _Chain:
    """Receives shards r-1, r-2, ..., 0 from the left neighbour (prefetching one ahead)
    and forwards each to the right neighbour as soon as it arrives."""

    def __init__(self, ring: Ring, meta: ShardMeta, gates: bool, cd, device, tag: int):
        self.ring, self.meta, self.gates, self.cd, self.device = ring, meta, gates, cd, device
        self.tag, self.sent, self.pending = tag, [], None
        self.r = ring.rank
        self.forward_on = self.r + 1 < ring.size

    def start(self, own_payload) -> None:
        if self.forward_on:
            self.sent += self.ring.isend(own_payload, self.r + 1, self.tag)
        self._post(1)

    def _post(self, t: int) -> None:
        s = self.r - t
        if s < 0:
            self.pending = None
            return
        buf = _empty_payload(self.meta, self.meta.lengths[s], self.gates, self.cd, self.device)
        self.pending = (buf, self.ring.irecv(buf, self.r - 1, self.tag))

    def get(self, t: int, prefetch: bool = True):
        """Payload of shard r - t (step t >= 1); forwards it and prefetches the next."""
        buf, works = self.pending
        Ring.wait(works)
        if self.forward_on:
            self.sent += self.ring.isend(buf, self.r + 1, self.tag)
        if prefetch:
            self._post(t + 1)
        return buf

    def prefetch(self, t: int) -> None:
        self._post(t)

    def finish(self) -> None:
        Ring.wait(self.sent)
        self.sent = []


def _ring_forward(ring: Ring, meta: ShardMeta, terms, v_heads, gate_terms, o, lse, cd):
    """Add the attention to every earlier shard to (o, lse), in place."""
    gates = gate_terms is not None
    chain = _Chain(ring, meta, gates, cd, o.device, _TAG_FWD)
    chain.start(_payload(terms, v_heads, gate_terms))
    a = None if not gates else gate_terms[0].clone()  # query gate term [B, H, Gr, T]
    M = None  # accumulated transition of the shards passed (None = identity)
    for t in range(1, ring.rank + 1):
        ks, vs, pts, *gt = chain.get(t)
        Q = terms.qs if M is None else terms.qs @ M[:, :, None]
        o_part, lse_part = cross_forward(Q, ks, vs, a, gt[0] if gates else None)
        merge_partial(o, lse, o_part, lse_part)
        if t < ring.rank:
            M = pts if M is None else M @ pts
            if gates:
                a += gt[1][..., None]
    chain.finish()


def _ring_backward(ring: Ring, meta: ShardMeta, terms, v_heads, gate_terms, do, lse, delta,
                   cd):
    """Cross-shard backward. Returns (dQs, dKs, dV, dcol, dPt_parts) with dKs, dV, dcol
    the totals for this rank's own keys (summed over every later rank) and dPt_parts
    [P, B, H, D, D] this rank's contributions to the transitions of the shards in between."""
    r, P = ring.rank, ring.size
    gates = gate_terms is not None
    T = meta.lengths[r]
    B, H, D = meta.B, meta.H, meta.D
    dev = do.device
    own_acc = _empty_acc(meta, T, gates, cd, dev)
    ret = ring.irecv(own_acc, P - 1, _TAG_RET) if r < P - 1 else []
    chain = _Chain(ring, meta, gates, cd, dev, _TAG_BWD)
    chain.start(_payload(terms, v_heads, gate_terms))
    dqs = torch.zeros_like(terms.qs)
    a = None if not gates else gate_terms[0].clone()
    M, Ms, Pts, dMs = None, [], [], []
    sent = []
    for t in range(1, r + 1):
        s = r - t
        ks, vs, pts, *gt = chain.get(t, prefetch=False)
        acc = _empty_acc(meta, meta.lengths[s], gates, cd, dev)
        if t > 1:  # accumulators of ranks s+1 .. r-1 (the owner sends none)
            Ring.wait(ring.irecv(acc, r - 1, _TAG_ACC))
        chain.prefetch(t + 1)
        Q = terms.qs if M is None else terms.qs @ M[:, :, None]
        cg = cross_backward(Q, ks, vs, a, gt[0] if gates else None, do, lse, delta)
        acc[0] += cg.dk
        acc[1] += cg.dv
        if gates:
            acc[2] += cg.dcol
        if r + 1 < P:
            sent += ring.isend(acc, r + 1, _TAG_ACC)
        else:
            sent += ring.isend(acc, s, _TAG_RET)
        if M is None:
            dqs += cg.dq
            dMs.append(None)
        else:
            dqs += cg.dq @ M.transpose(-1, -2)[:, :, None]
            dMs.append((terms.qs.transpose(-1, -2) @ cg.dq).sum(2))  # [B, H, D, D]
        Ms.append(M)
        Pts.append(pts)
        if t < r:
            M = pts if M is None else M @ pts
            if gates:
                a += gt[1][..., None]
    chain.finish()
    Ring.wait(sent)
    Ring.wait(ret)
    # M_{t+1} = M_t Pt_{r-t}: reverse recursion on D x D matrices
    dpt_parts = torch.zeros(P, B, H, D, D, dtype=cd, device=dev)
    gM = None  # total gradient of M_{t+1}
    for t in range(r, 0, -1):
        i = t - 1
        if gM is not None:
            Mt = Ms[i]
            dpt_parts[r - t] += gM if Mt is None else Mt.transpose(-1, -2) @ gM
            g_t = gM @ Pts[i].transpose(-1, -2)
            gM = g_t if dMs[i] is None else g_t + dMs[i]
        else:
            gM = dMs[i]
    return dqs, own_acc[0], own_acc[1], own_acc[2] if gates else None, dpt_parts


class ContextParallelPaTHFunction(torch.autograd.Function):
    """o = ContextParallelPaTHFunction.apply(q, k, v, w, beta, g, scale, C, ring, meta,
    kernels); see `context_parallel_path_attn` (kernels: the "cpu" backend's C++ kernels
    where they apply, else PyTorch ops)."""

    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, scale: float, C: int, ring: Ring, meta: ShardMeta,
                kernels: bool = True):
        B, T, HQ, _ = q.shape
        H = k.shape[2]
        cd = compute_dtype(q.dtype)
        with torch.no_grad():
            o, lse, terms = _local_forward(q, k, w, beta, v, g, scale, C, kernels)
            gate_terms = None if g is None else shard_gates(g, H)
            v_heads = v.to(cd).transpose(1, 2)  # [B, H, T, Dv]
            if ring.size > 1:  # rank 0 only feeds the chain
                _ring_forward(ring, meta, terms, v_heads, gate_terms, o, lse, cd)
        out = heads_to_rows(o)  # [B, T, HQ, Dv]
        ctx.save_for_backward(q, k, v, w, beta, g, out, heads_to_rows(lse[..., None]))
        ctx.scale, ctx.C, ctx.ring, ctx.meta, ctx.kernels = scale, C, ring, meta, kernels
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, w, beta, g, o, lse = ctx.saved_tensors
        ring, meta, scale = ctx.ring, ctx.meta, ctx.scale
        B, T, HQ, _ = q.shape
        H = k.shape[2]
        cd = compute_dtype(q.dtype)
        lay = make_layout(B, T, ctx.C, None, q.device)
        with torch.no_grad():
            bi = block_inputs(q, k, v, w, beta, g, lay)
            blocks, vb, gates = bi.ut, bi.vb, bi.gates
            do = do.to(cd)
            delta = (do * o).sum(-1, keepdim=True)  # [B, T, HQ, 1] rowsum(dO * O), global O
        rows = lambda x: row_blocks(x, lay, H, cd).flatten(2, 3)  # noqa: E731
        found = {"dg": None, "dvs": None}

        def across_shards(ut, grads):
            """The ring's part (`blocks_backward`'s extra): shard terms from ut, their
            cotangents from every other rank, and the gate gradient's totals."""
            # in-shard part of the gate gradient (float64 [B, T, HQ])
            dg = None if g is None else gate_grad(grads.dgate_col, lay).view(g.shape)
            if ring.size == 1:
                found["dg"] = dg
                return [], []
            terms = shard_terms(lay, ut, B, T, HQ)
            with torch.no_grad():
                det = type(terms)(*(x.detach() for x in terms))
                gate_terms = None if g is None else shard_gates(g, H)
                dqs, dks, dvs, dcol, dpt_parts = _ring_backward(
                    ring, meta, det, v.to(cd).transpose(1, 2), gate_terms,
                    rows_to_heads(do, H), rows_to_heads(lse, H)[..., 0],
                    rows_to_heads(delta, H)[..., 0], cd)
                dpt, found["dg"] = _reduce_totals(ring, meta, dpt_parts, dcol, dg)
            found["dvs"] = dvs
            return [terms.qs, terms.ks, terms.pt], [dqs, dks, dpt]

        dqb, dkb, dwb, dbb, grads = blocks_backward(
            lay, *blocks, vb, gates, rows(do), rows(lse)[..., 0], rows(delta)[..., 0], scale,
            ctx.kernels, extra=across_shards)
        dg, dvs = found["dg"], found["dvs"]
        with torch.no_grad():
            dq = rows_to_tokens(dqb.flatten(2, 3), lay, q.shape)
            dk, dw, dv, dbeta = (kv_tokens(x, lay, ref.shape) for x, ref in (
                (dkb, k), (dwb, w), (grads.dv, v), (dbb, beta)))
            if dvs is not None:
                dv += dvs.transpose(1, 2)
            dg = None if g is None else dg.to(g.dtype)
        cast = lambda x, ref: x.to(ref.dtype)  # noqa: E731
        return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dw, w), cast(dbeta, beta), dg,
                None, None, None, None, None)


def _reduce_totals(ring: Ring, meta: ShardMeta, dpt_parts, dcol, dg_local):
    """One all-reduce of [dPt contributions (P, B, H, D, D) | gate totals (P, B, HQ)].

    dcol [B, H, Gr, T] the column sums of dS at this shard's keys from every later rank,
    dg_local [B, T, HQ] float64 the in-shard gate gradient (None without gates). Returns
    this shard's dPt [B, H, D, D] and its full gate gradient [B, T, HQ] float64 (or None):
    dL/dG_j = -(column sum of dS over every query), dL/dg_t = sum over s >= t of dL/dG_s
    along the whole sequence, so every token also gets the totals of all later shards."""
    P, r = ring.size, ring.rank
    parts = [dpt_parts.to(torch.float64).flatten()]
    dg = None
    if dg_local is not None:
        dG = -heads_to_rows(dcol.to(torch.float64)[..., None])[..., 0]  # [B, T, HQ]
        dg = dg_local + dG.flip(1).cumsum(1).flip(1)
        tots = dg.new_zeros(P, meta.B, meta.HQ)
        tots[r] = dg[:, 0]  # sum of dL/dG over the shard
        parts.append(tots.flatten())
    buf = torch.cat(parts)
    dist.all_reduce(buf, group=ring.group)
    n = dpt_parts.numel()
    dpt = buf[:n].view(dpt_parts.shape)[r].to(dpt_parts.dtype)
    if dg is not None:
        dg = dg + buf[n:].view(P, meta.B, meta.HQ)[r + 1:].sum(0)[:, None]
    return dpt, dg


def context_parallel_path_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               w: torch.Tensor, beta: torch.Tensor,
                               g: torch.Tensor | None = None, *, group=None,
                               scale: float | None = None,
                               block_size: int | None = None,
                               backend: str = "auto") -> torch.Tensor:
    """Context-parallel PaTH / PaTH-FoX attention: this rank's shard of `path_attn` on the
    sequence formed by the shards of every rank of `group`, in rank order.

    Args:
        q: [B, Tr, HQ, D] queries of this rank's contiguous shard (Tr tokens; shards may
            have different lengths, each at least one token).
        k: [B, Tr, H, D] keys (HQ a multiple of H: GQA / MQA as `path_attn`).
        v: [B, Tr, H, Dv] values.
        w: [B, Tr, H, D] Householder directions, or [B, Tr, H, R, D] with R reflections
            per token (as `path_attn`).
        beta: [B, Tr, H] Householder strengths, or [B, Tr, H, R].
        g: [B, Tr, HQ] log forget gates (PaTH-FoX) or None; None on every rank or on none.
        group: torch.distributed process group (default: the world); its rank order is the
            sequence order. Every rank of the group must call this function (and its
            backward) with the same B, HQ, H, D, Dv, dtype and scale.
        scale: logit scale, default D ** -0.5 (not applied to the gate term).
        block_size: block length C of the in-shard blockwise algorithm (default 128).
        backend: the in-shard algorithm, "cpu" or "torch" ("auto": "cpu" where it
            applies); "triton" is refused (the ring needs the blockwise terms).

    Returns o [B, Tr, HQ, Dv] in q's dtype: rows Tr of `path_attn` on the gathered
    sequence, differentiable in q, k, v, w, beta and g (the backward runs over the ring
    too). q, k, v, w on one device; gloo (CPU tensors) or NCCL (CUDA tensors). Communication
    per step: docs/context_parallel.md.
    """
    ring = Ring(group)
    local_error = None
    kernels = False
    try:
        check_path_attn_inputs(q, k, v, w, beta, g, scale, None)
        check_block_size(block_size)
        w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, Tr, H, D]
        kernels = keys_backend(backend, q, "context parallelism",
                               reflections=num_reflections(w)).name == "cpu"
        if q.shape[0] == 0:
            raise ValueError("q: batch size B must be positive for context-parallel attention")
    except ValueError as e:
        local_error = str(e)
    D = q.shape[-1] if local_error is None else 1
    scale = default_scale(D, None if local_error is not None else scale)
    meta = exchange_meta(ring, q, k, v, g, scale, local_error)
    C = DEFAULT_BLOCK_SIZE if block_size is None else int(block_size)
    return ContextParallelPaTHFunction.apply(q, k, v, w, beta, g, scale, C, ring, meta,
                                             kernels)
