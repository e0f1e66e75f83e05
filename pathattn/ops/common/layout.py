"""Block layout of a (possibly packed, variable-length) batch for the blockwise algorithm.

Every sequence is cut into blocks of C tokens (paper section 3.3, block size "B"); its last
block is padded with tokens whose transform is the identity (w = 0, beta = 0) and which come
after every real token of the sequence, so they never influence a real token. Blocks never
straddle two sequences: no attention and no Householder product crosses a sequence boundary.

The right-to-left scan of section 3.3 pairs the query block with local index l (its position
inside its sequence) with the key block l - d at step d. Blocks are stored in *scan order*:
sorted by local index, descending (ties in sequence order). The query blocks still active at
step d, those with l >= d, are then the first `counts[d]` rows, and `key_rows[d]` gives the
row of each one's key block. For a dense batch (and whenever all sequences have the same
number of blocks) the key rows of a step are a contiguous range, so the scan slices instead
of gathering (`key_lo`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["BlockLayout", "make_layout", "to_blocks", "from_blocks", "to_head_blocks",
           "from_head_blocks", "block_starts", "sequence_bounds", "token_bounds"]


@dataclass
class BlockLayout:
    """Index maps between tokens [B * T] and block slots [NB * C]; see the module docstring."""

    C: int  # block size
    NB: int  # number of blocks, all sequences together
    n_tokens: int  # B * T
    slot_token: torch.Tensor  # [NB * C] token of each slot; n_tokens for padding
    slot_source: torch.Tensor  # [NB * C] token of each slot; padding -> last real token
    pad_slots: torch.Tensor  # [number of padding slots] their indices
    token_slot: torch.Tensor  # [B * T] slot of each token
    token_seq_start: torch.Tensor  # [B * T] first token of the token's sequence
    token_seq_end: torch.Tensor  # [B * T] one past the last token of the token's sequence
    counts: list[int]  # counts[d] = number of blocks with local index >= d, d < n_max
    key_rows: list[torch.Tensor]  # key_rows[d] [counts[d]] key block row of each active row
    key_lo: list[int | None]  # key_rows[d] == range(lo, lo + counts[d]) when not None
    row_length: int | None = None  # T for a dense [B, T] batch, None for packed sequences
    # head-major gather indices per number of heads (`head_major_index`), built on first use
    _head_major: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_max(self) -> int:
        """Largest number of blocks in one sequence (number of scan steps + 1)."""
        return len(self.counts)

    def take(self, x: torch.Tensor, d: int, cnt: int | None = None) -> torch.Tensor:
        """x[key rows of the first cnt active query rows at step d] (a view when possible)."""
        cnt = self.counts[d] if cnt is None else cnt
        lo = self.key_lo[d]
        if lo is not None:
            return x[lo: lo + cnt]
        return x.index_select(0, self.key_rows[d][:cnt])

    def put_add(self, x: torch.Tensor, d: int, src: torch.Tensor) -> None:
        """x[key rows of step d] += src, src holding the first src.shape[0] active rows."""
        cnt = src.shape[0]
        lo = self.key_lo[d]
        if lo is not None:
            x[lo: lo + cnt] += src
        else:
            x.index_add_(0, self.key_rows[d][:cnt], src)

    def put_addmm(self, x: torch.Tensor, d: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """x[key rows of step d] += a @ b for the first a.shape[0] active rows.

        x [NB, H, M, N]; a [cnt, H, M, K]; b [cnt, H, K, N]. Accumulates in place (one
        batched GEMM, no temporary) when the key rows are a contiguous range.
        """
        cnt = a.shape[0]
        lo = self.key_lo[d]
        if lo is None:
            x.index_add_(0, self.key_rows[d][:cnt], a @ b)
            return
        M, N = x.shape[-2:]
        out = x[lo: lo + cnt].view(-1, M, N)
        out.baddbmm_(a.reshape(-1, M, a.shape[-1]), b.reshape(-1, b.shape[-2], N))


def make_layout(B: int, T: int, C: int, cu_seqlens: torch.Tensor | None,
                device: torch.device) -> BlockLayout:
    """Build the layout for B sequences of length T, or packed sequences (B == 1).

    cu_seqlens: None or an int tensor [N + 1] of boundaries (validated by the caller).
    Built on the CPU with vectorised index arithmetic, then moved to `device`.
    """
    starts, ends = sequence_bounds(B, T, cu_seqlens)
    n_tokens = B * T
    n_blocks = (ends - starts + C - 1) // C  # [N]
    NB = int(n_blocks.sum())
    # blocks in sequence-major order first ...
    seq = torch.repeat_interleave(torch.arange(len(n_blocks)), n_blocks)  # [NB]
    local = torch.arange(NB) - (n_blocks.cumsum(0) - n_blocks)[seq]  # [NB]
    # ... then in scan order: local index descending, ties in sequence order
    order = torch.sort(-local, stable=True).indices  # scan row -> sequence-major id
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(NB)  # sequence-major id -> scan row
    seq, local = seq[order], local[order]
    block_start = starts[seq] + local * C  # [NB]
    slot = block_start[:, None] + torch.arange(C)  # [NB, C]
    end = ends[seq][:, None]
    slot_token = torch.where(slot < end, slot, n_tokens).reshape(-1)
    slot_source = torch.minimum(slot, end - 1).reshape(-1)
    real = slot_token < n_tokens
    token_slot = torch.full((n_tokens,), -1, dtype=torch.long)
    token_slot[slot_token[real]] = torch.arange(NB * C)[real]
    token_seq_start = torch.zeros(n_tokens, dtype=torch.long)
    token_seq_end = torch.zeros(n_tokens, dtype=torch.long)
    token_seq_start[slot_token[real]] = starts[seq].repeat_interleave(C)[real]
    token_seq_end[slot_token[real]] = ends[seq].repeat_interleave(C)[real]
    n_max = int(local.max()) + 1 if NB else 0
    counts = torch.bincount(local, minlength=n_max).flip(0).cumsum(0).flip(0).tolist()
    key_rows, key_lo = [], []
    for d in range(n_max):
        rows = row_of[order[: counts[d]] - d]  # key block: same sequence, local index - d
        lo = int(rows[0])
        key_lo.append(lo if torch.equal(rows, torch.arange(lo, lo + len(rows))) else None)
        key_rows.append(rows.to(device))
    to = lambda x: x.to(device)  # noqa: E731
    return BlockLayout(
        C=C, NB=NB, n_tokens=n_tokens, slot_token=to(slot_token), slot_source=to(slot_source),
        pad_slots=to(torch.nonzero(~real).flatten()),
        token_slot=to(token_slot), token_seq_start=to(token_seq_start),
        token_seq_end=to(token_seq_end), counts=counts, key_rows=key_rows, key_lo=key_lo,
        row_length=T if cu_seqlens is None else None,
    )


def to_blocks(x: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Tokens [B * T, *F] -> slots [NB, C, *F]; padding slots are zero.

    A gather plus an in-place zeroing of the padding slots: not meant for autograd (the op
    differentiates with respect to the block tensors and maps gradients back with
    `from_blocks`).
    """
    out = x.index_select(0, lay.slot_source)  # [NB*C, *F], padding repeats a real token
    if lay.pad_slots.numel():
        out.index_fill_(0, lay.pad_slots, 0)
    return out.view((lay.NB, lay.C) + tuple(x.shape[1:]))


def from_blocks(xb: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Slots [NB, C, *F] -> tokens [B * T, *F], dropping padding. Differentiable."""
    flat = xb.reshape((lay.NB * lay.C,) + tuple(xb.shape[2:]))
    return flat.index_select(0, lay.token_slot)


class HeadMajorIndex:
    """Row indices between tokens [B * T, H, M] and head-major blocks [NB, H, C, M], both
    seen as rows of M entries (`to_head_blocks`, `from_head_blocks`)."""

    def __init__(self, lay: BlockLayout, H: int):
        heads = torch.arange(H, device=lay.slot_source.device)
        C = lay.C
        src = lay.slot_source.view(lay.NB, 1, C) * H + heads.view(1, H, 1)  # [NB, H, C]
        self.gather = src.reshape(-1)  # block row (n, h, c) <- token row
        pad = lay.pad_slots  # slots n * C + c
        rows = ((pad // C)[:, None] * H + heads) * C + (pad % C)[:, None]  # [P, H]
        self.pad_rows = rows.reshape(-1)
        slot = lay.token_slot  # [B * T]
        back = ((slot // C)[:, None] * H + heads) * C + (slot % C)[:, None]  # [B * T, H]
        self.scatter = back.reshape(-1)  # token row (t, h) <- block row


def head_major_index(lay: BlockLayout, H: int) -> HeadMajorIndex:
    """The layout's `HeadMajorIndex` for H heads (built once per layout and H)."""
    if H not in lay._head_major:
        lay._head_major[H] = HeadMajorIndex(lay, H)
    return lay._head_major[H]


def _dense_blocks(lay: BlockLayout) -> tuple[int, int] | None:
    """(B, blocks per sequence) when the layout is B rows of T tokens with T a multiple of C
    (no padding slot), else None. Scan row (n_b - 1 - l) * B + s then holds block l of
    sequence s: a reshape of the tokens up to the order of the blocks."""
    if lay.row_length is None or lay.NB * lay.C != lay.n_tokens or lay.NB == 0:
        return None
    return lay.n_tokens // lay.row_length, lay.row_length // lay.C


def _reversed(n: int, device) -> torch.Tensor:
    return torch.arange(n - 1, -1, -1, device=device)


def to_head_blocks(x: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Tokens [B * T, H, *F] -> head-major blocks [NB, H, C, *F] (contiguous; zero in the
    padding slots) in one gather, the same numbers as `to_blocks` then a transpose of the
    first two block dimensions. Dense layouts without padding gather whole blocks (a copy
    of a strided view, several times faster than a gather of rows)."""
    H, F = x.shape[1], tuple(x.shape[2:])
    dense = _dense_blocks(lay)
    if dense is not None:
        B, nbs = dense
        xv = x.reshape(B, nbs, lay.C, H, -1).permute(1, 0, 3, 2, 4)  # [nbs, B, H, C, M]
        return xv.index_select(0, _reversed(nbs, x.device)).view((lay.NB, H, lay.C) + F)
    idx = head_major_index(lay, H)
    out = x.reshape(x.shape[0] * H, -1).index_select(0, idx.gather)  # [NB * H * C, M]
    if idx.pad_rows.numel():
        out.index_fill_(0, idx.pad_rows, 0)
    return out.view((lay.NB, H, lay.C) + F)


def from_head_blocks(xb: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Head-major blocks [NB, H, C, *F] -> tokens [B * T, H, *F] (padding dropped) in one
    gather; the inverse of `to_head_blocks`."""
    H, F = xb.shape[1], tuple(xb.shape[3:])
    dense = _dense_blocks(lay)
    if dense is not None:
        B, nbs = dense
        out = xb.new_empty(B, nbs, lay.C, H, xb[0, 0, 0].numel())
        out.permute(1, 0, 3, 2, 4).index_copy_(  # written in place through the view
            0, _reversed(nbs, xb.device), xb.reshape(nbs, B, H, lay.C, -1))
        return out.view((lay.n_tokens, H) + F)
    idx = head_major_index(lay, H)
    rows = xb.reshape(lay.NB * H * lay.C, -1).index_select(0, idx.scatter)  # [B*T*H, M]
    return rows.view((lay.n_tokens, H) + F)


def block_starts(lay: BlockLayout) -> torch.Tensor | None:
    """[NB] int64: the first token of every block (in scan order) when no block has a padding
    slot, so that each block is C consecutive tokens of one sequence (dense batches and
    packed sequences whose lengths are multiples of C); None otherwise. The fused CPU
    kernels then read and write the token tensors in place (`pathattn.ops.path.cpu`)."""
    if lay.NB == 0 or lay.pad_slots.numel():
        return None
    return lay.slot_token.view(lay.NB, lay.C)[:, 0].contiguous()


def sequence_bounds(B: int, T: int, cu_seqlens: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends): int64 CPU tensors [N] of each non-empty sequence's first token and one
    past its last, in the flattened [B * T] token axis (B rows of T, or cu_seqlens)."""
    if cu_seqlens is None:
        starts = torch.arange(B, dtype=torch.long) * T
        return starts, starts + T
    cs = cu_seqlens.detach().to("cpu", torch.long)
    starts, ends = cs[:-1], cs[1:]
    keep = ends > starts  # empty sequences own no block
    return starts[keep], ends[keep]


def token_bounds(B: int, T: int, cu_seqlens: torch.Tensor | None, device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of the flattened [B * T] axis: the first token of its sequence and one past
    its last ([B * T] int64 each, on `device`; no value is read back to the host)."""
    if cu_seqlens is None:
        starts = torch.arange(B, device=device).repeat_interleave(T) * T
        return starts, starts + T
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lengths = cu[1:] - cu[:-1]
    return (cu[:-1].repeat_interleave(lengths, output_size=B * T),
            cu[1:].repeat_interleave(lengths, output_size=B * T))
