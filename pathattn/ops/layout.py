"""Block layout of a (possibly packed, variable-length) batch for the blockwise algorithm.

Every sequence is cut into blocks of C tokens (paper section 3.3, block size "B"); its last
block is padded with tokens whose transform is the identity (w = 0, beta = 0), which never
influence a real token because they come after every real token of their sequence. Blocks
never straddle two sequences, so no attention and no Householder product crosses a sequence
boundary.

Blocks are numbered sequence-major (block id = first block of its sequence + local index l).
The right-to-left scan of section 3.3 pairs query block l with key block l - d at step d.
Query-side tensors are kept in `order`: block ids sorted by local index, descending, so that
the query blocks still active at step d (those with l >= d) are the prefix
`order[:counts[d]]`, and their key blocks are `key_index[d] = order[:counts[d]] - d`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BlockLayout", "make_layout"]


@dataclass
class BlockLayout:
    """Index maps between tokens [B * T] and block slots [NB * C]; see the module docstring."""

    C: int  # block size
    NB: int  # number of blocks, all sequences together
    n_tokens: int  # B * T
    slot_token: torch.Tensor  # [NB * C] token index of each slot, n_tokens for padding
    token_slot: torch.Tensor  # [B * T] slot of each token
    seq_first_block: torch.Tensor  # [NB] id of the first block of the block's sequence
    token_seq_end: torch.Tensor  # [B * T] one past the last token of the token's sequence
    order: torch.Tensor  # [NB] block ids, local index descending
    inverse_order: torch.Tensor  # [NB] position of each block id in `order`
    counts: list[int]  # counts[d] = number of blocks with local index >= d, d < n_max
    key_index: list[torch.Tensor]  # key_index[d] [counts[d]] key block of each active row

    @property
    def n_max(self) -> int:
        """Largest number of blocks in one sequence (number of scan steps + 1)."""
        return len(self.counts)


def make_layout(B: int, T: int, C: int, cu_seqlens: torch.Tensor | None,
                device: torch.device) -> BlockLayout:
    """Build the layout for B sequences of length T, or packed sequences (B == 1).

    cu_seqlens: None or an int tensor [N + 1] of boundaries (validated by the caller).
    Built on the CPU with vectorised index arithmetic, then moved to `device`.
    """
    if cu_seqlens is None:
        starts = torch.arange(B, dtype=torch.long) * T
        ends = starts + T
    else:
        cs = cu_seqlens.detach().to("cpu", torch.long)
        starts, ends = cs[:-1], cs[1:]
        keep = ends > starts  # empty sequences own no block
        starts, ends = starts[keep], ends[keep]
    n_tokens = B * T
    lengths = ends - starts  # [N]
    n_blocks = (lengths + C - 1) // C  # [N]
    NB = int(n_blocks.sum())
    first_block = n_blocks.cumsum(0) - n_blocks  # [N]
    seq_of_block = torch.repeat_interleave(torch.arange(len(n_blocks)), n_blocks)  # [NB]
    local = torch.arange(NB) - first_block[seq_of_block]  # [NB]
    block_start = starts[seq_of_block] + local * C  # [NB]
    slot_token = block_start[:, None] + torch.arange(C)  # [NB, C]
    slot_token = torch.where(slot_token < ends[seq_of_block][:, None], slot_token, n_tokens)
    slot_token = slot_token.reshape(-1)
    token_slot = torch.full((n_tokens,), -1, dtype=torch.long)
    real = slot_token < n_tokens
    token_slot[slot_token[real]] = torch.arange(NB * C)[real]
    token_seq_end = torch.zeros(n_tokens, dtype=torch.long)
    token_seq_end[slot_token[real]] = ends[seq_of_block].repeat_interleave(C)[real]
    order = torch.sort(-local, stable=True).indices  # local index descending
    inverse_order = torch.empty_like(order)
    inverse_order[order] = torch.arange(NB)
    n_max = int(local.max()) + 1 if NB else 0
    per_local = torch.bincount(local, minlength=n_max)  # blocks with local index == d
    counts = per_local.flip(0).cumsum(0).flip(0).tolist()  # blocks with local index >= d
    key_index = [(order[: counts[d]] - d).to(device) for d in range(n_max)]
    to = lambda x: x.to(device)  # noqa: E731
    return BlockLayout(
        C=C, NB=NB, n_tokens=n_tokens, slot_token=to(slot_token), token_slot=to(token_slot),
        seq_first_block=to(first_block[seq_of_block]), token_seq_end=to(token_seq_end),
        order=to(order), inverse_order=to(inverse_order), counts=counts, key_index=key_index,
    )


def to_blocks(x: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Tokens [B * T, *F] -> slots [NB, C, *F]; padding slots are zero. Differentiable."""
    padded = torch.cat([x, x.new_zeros((1,) + tuple(x.shape[1:]))], dim=0)  # [B*T + 1, *F]
    return padded.index_select(0, lay.slot_token).view((lay.NB, lay.C) + tuple(x.shape[1:]))


def from_blocks(xb: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Slots [NB, C, *F] -> tokens [B * T, *F], dropping padding. Differentiable."""
    flat = xb.reshape((lay.NB * lay.C,) + tuple(xb.shape[2:]))
    return flat.index_select(0, lay.token_slot)
