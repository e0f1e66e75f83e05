"""Theorem A.1 of the paper (appendix A): one PaTH layer with two heads decides whether a
sequence of swaps on 5 elements composes to the identity, an NC^1-complete problem.

Input: `# [a_1 <-> b_1] ... [a_m <-> b_m]`, ids [B, T] with T = m + 1:

* id 0 is the start token `#`,
* id 1 + s is the swap `SWAPS[s] = (x, y)`: exchange the elements at places x and y.
  `SWAPS` lists the 20 ordered pairs of distinct elements of {1, ..., 5} in lexicographic
  order: (1, 2), (1, 3), (1, 4), (1, 5), (2, 1), (2, 3), ..., (5, 4). `(x, y)` and
  `(y, x)` are the same permutation; the paper keeps both, so the vocabulary has 21 ids.

The construction (head dimension 6 in the paper, padded with zeros here, see `SwapModel`):

    head 1:  k[u] = 1{u = #} (e1 + 2 e2 + 3 e3 + 4 e4 + 5 e5 - e6)
             q[u] = s (e1 + 2 e2 + 3 e3 + 4 e4 + 5 e5 + 54.5 e6)      (every token)
             w[u] = (e_x - e_y) / sqrt(2) for u = [x <-> y],  0 for #
             v[u] = 1{u = #} e1,   beta = 2
    head 2:  k = q = w = 0, the same v
    output:  o_head1[0] - o_head2[0]

H[x <-> y] = I - 2 w w^T is the permutation matrix of the swap, so the start key reaches
query t as k_0^T H_1 ... H_t = sum_i i e_{pi(i)} - e6, pi the composed permutation, and

    s_0 = s (sum_i i pi(i) - 54.5)    (eq. of the proof; > 0 iff pi = id, rearrangement)

Every other key is zero (logit 0), so head 1 gives a_0 = e^{s_0} / (e^{s_0} + t) and the
uniform head 2 gives 1 / (t + 1): their difference has the sign of s_0.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import path_attn, path_attn_with_keys
from .handset import BETA_LOGIT_MAX, handset_path_layer, pow2_at_least

__all__ = ["SWAPS", "START", "SWAP_VOCAB_SIZE", "SwapModel", "swap_model",
           "compose_swaps", "swaps_identity", "worst_case_ids"]

SWAPS: tuple[tuple[int, int], ...] = tuple(
    (x, y) for x in range(1, 6) for y in range(1, 6) if x != y)
START = 0
SWAP_VOCAB_SIZE = 1 + len(SWAPS)  # 21

KEY = (1.0, 2.0, 3.0, 4.0, 5.0, -1.0)  # k[#] of head 1
QUERY = (1.0, 2.0, 3.0, 4.0, 5.0, 54.5)  # q of head 1, before the scale s
HEAD_DIM = 16  # the paper's 6 dims, padded so that the default scale 16 ** -0.5 is 1/4


def compose_swaps(ids: list[int]) -> list[int]:
    """Plain-Python ground truth: the list [1, 2, 3, 4, 5] after the swaps of `ids` (one
    sequence, `#` first), each swap exchanging the entries at places x and y."""
    items = [1, 2, 3, 4, 5]
    for u in ids[1:]:
        x, y = SWAPS[u - 1]
        items[x - 1], items[y - 1] = items[y - 1], items[x - 1]
    return items


def swaps_identity(ids: torch.Tensor) -> torch.Tensor:
    """Ground truth for ids [B, T]: BoolTensor [B, T], True at t when the swaps of
    positions 1..t compose to the identity (position 0, no swap, is True)."""
    rows = []
    for seq in ids.tolist():
        rows.append([compose_swaps(seq[: t + 1]) == [1, 2, 3, 4, 5]
                     for t in range(len(seq))])
    return torch.tensor(rows, dtype=torch.bool).view(ids.shape)


def check_swap_ids(ids: torch.Tensor, n: int) -> None:
    """ids must be an int tensor [B, T], 1 <= T <= n, `#` at position 0 and swaps (ids 1 to
    20) after it (ValueError otherwise)."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.ndim != 2:
        raise ValueError("ids must be an integer tensor [B, T]")
    if not 1 <= ids.shape[1] <= n:
        raise ValueError(f"sequence length must be in [1, n={n}], got {ids.shape[1]}")
    if ids.numel() and (bool((ids[:, 0] != START).any()) or bool((ids[:, 1:] < 1).any())
                        or bool((ids > len(SWAPS)).any())):
        raise ValueError("each sequence must be # (id 0) followed by swaps (ids 1 to 20)")


class SwapModel(nn.Module):
    """Theorem A.1's one-layer, two-head PaTH transformer with hand-set weights.

    Residual stream: the one-hot embedding of the 21 ids (width 21). `attn` is a real
    `PaTHAttention` layer (2 heads, head dim 16, full-rank w projection, identity short
    convolution) holding the weights of the module docstring; o_proj writes
    o_head1[0] - o_head2[0] into dimension 0 of the stream, where the one-hot of `#` adds
    1 at position 0 (an empty product is the identity, but there both heads give 1 and
    the difference is 0). The output is dimension 0 of the stream: the paper's value
    before its final sign(.) FFN.

    Args:
        n: the longest sequence (in tokens, `#` included) the model is built for; the
            query scale s is the smallest power of two >= n (the paper uses n; any s > 0
            gives the right sign, a larger s a larger margin, and a power of two keeps
            q exact in bf16).
        exact_reflections: the layer L2-normalises w and caps beta strictly below 2, so
            its H = I - beta w w^T is a reflection only up to rounding (beta |w|^2 =
            2 - 1.8e-7 in float32, 2 - 4.3e-4 in bf16, where w is rounded toward zero):
            each swap shrinks the start key's spread a little and long sequences that
            compose to the identity eventually read as non-identity (docs/theory.md).
            True feeds the op w = e_x - e_y unnormalised with beta = 1 instead (same q,
            k, v and output projection from the layer): beta |w|^2 = 2 exactly, H is
            the integer permutation matrix, and the construction is exact in bf16 too.
    """

    def __init__(self, n: int, exact_reflections: bool = False):
        super().__init__()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        self.n, self.exact_reflections = n, bool(exact_reflections)
        self.scale = pow2_at_least(n)
        D = HEAD_DIM
        self.attn = handset_path_layer(SWAP_VOCAB_SIZE, num_heads=2, head_dim=D,
                                       beta_logit=BETA_LOGIT_MAX)
        w_exact = torch.zeros(SWAP_VOCAB_SIZE, 2, D)  # [21, H, D], head 2 stays 0
        with torch.no_grad():
            a = self.attn
            a.q_proj.weight[:6, :] = torch.tensor(QUERY)[:, None] * self.scale * math.sqrt(D)
            a.k_proj.weight[:6, START] = torch.tensor(KEY)
            a.v_proj.weight[0, START] = 1.0  # head 1, dim 0
            a.v_proj.weight[D, START] = 1.0  # head 2, dim 0
            for s, (x, y) in enumerate(SWAPS):
                a.w_proj.weight[x - 1, 1 + s], a.w_proj.weight[y - 1, 1 + s] = 1.0, -1.0
                w_exact[1 + s, 0, x - 1], w_exact[1 + s, 0, y - 1] = 1.0, -1.0
            a.o_proj.weight[0, 0], a.o_proj.weight[0, D] = 1.0, -1.0
        self.register_buffer("w_exact", w_exact, persistent=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> one-hot x [B, T, 21] in the layer's dtype."""
        return F.one_hot(ids, SWAP_VOCAB_SIZE).to(self.attn.q_proj.weight.dtype)

    def op_inputs(self, ids: torch.Tensor):
        """The attention op's inputs (q, k, v, w, beta) for ids [B, T]: q [B, T, 2, 16],
        k, v, w [B, T, 2, 16], beta [B, T, 2]; the layer's own w and beta, or the exact
        ones (`exact_reflections`)."""
        x = self.embed(ids)
        if not self.exact_reflections:
            a = self.attn
            q, k, v, w, beta, _ = a.op_inputs(x, a.w_conv(a.w_proj(x)))
            return q, k, v, w, beta
        q, k, v = self.attn.qkv(x)
        w = self.w_exact.to(q.dtype)[ids]  # [B, T, 2, 16]
        beta = torch.ones(ids.shape + (2,), dtype=torch.float32, device=ids.device)
        return q, k, v, w, beta

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] (int, `#` then swaps, T <= n) -> float [B, T] in the layer's dtype:
        > 0 where the swaps so far compose to the identity, < 0 elsewhere."""
        check_swap_ids(ids, self.n)
        x = self.embed(ids)  # [B, T, 21]
        if self.exact_reflections:
            y = self.attn.out(path_attn(*self.op_inputs(ids)))
        else:
            y = self.attn(x)  # the PaTH layer's own forward
        return (x + y)[..., 0]  # [B, T]: residual stream, dimension 0

    @torch.no_grad()
    def rearrangement_sum(self, ids: torch.Tensor) -> torch.Tensor:
        """The proof's sum_i i pi(i) for the whole of each sequence ids [B, T], as the op
        computes it: (H_{T-1} ... H_1 k_0) . (1, 2, 3, 4, 5), float32 [B]. Exactly 55 for
        the identity, at most 54 otherwise; the model decides by comparing it with 54.5,
        so its distance to 54.5 is the margin that rounding eats."""
        check_swap_ids(ids, self.n)
        q, k, v, w, beta = self.op_inputs(ids)
        _, keys = path_attn_with_keys(q, k, v, w, beta)  # keys [B, T, 2, 16] float32
        return keys[:, 0, 0, :5] @ torch.tensor(QUERY[:5], dtype=keys.dtype)

    @torch.no_grad()
    def swap_eigenvalue(self) -> float:
        """lambda = 1 - beta |w|^2 of a swap token as the op receives it (the rounded w and
        beta, evaluated in float64): the eigenvalue of H along w, exactly -1 for a true
        reflection. Every swap has the same lambda (its w has entries +-1/sqrt(2))."""
        ids = torch.tensor([[START, 1]], device=self.w_exact.device)
        _, _, _, w, beta = self.op_inputs(ids)
        w1 = w[0, 1, 0].double()  # [16]
        return float(1 - beta[0, 1, 0].double() * (w1 @ w1))

    def failure_length(self, measure: bool = True) -> int | None:
        """The length T at which rounding first makes this model wrong on its worst-case
        input `worst_case_ids(T)`: `#` then m copies of [1 <-> 5], the swap with the
        largest component w^T k = -4/sqrt(2) on the start key. For even m the swaps
        compose to the identity, but the op's sum_i i pi(i) is 47 + 8 f^m with a per-swap
        factor f < 1, and the output turns negative once f^m <= 15/16.

        measure=True measures f with the op itself over the longest even number of swaps
        the model takes (m <= n - 1, `rearrangement_sum`), which also counts the op's own
        rounding (in float32 on the CPU backend it adds ~17% to the drift);
        measure=False takes f = |`swap_eigenvalue`|, the rounding of w and beta alone.
        Returns T = m + 1 for the first even m that fails, None without drift.
        """
        probe = (self.n - 1) - (self.n - 1) % 2
        if measure and probe >= 2:
            ids = worst_case_ids(probe + 1).to(self.w_exact.device)
            f = ((float(self.rearrangement_sum(ids)[0]) - 47) / 8) ** (1 / probe)
        else:
            f = abs(self.swap_eigenvalue())
        if f >= 1.0:
            return None
        m = math.ceil(math.log(15 / 16) / math.log(f))
        return m + m % 2 + 1


def worst_case_ids(T: int) -> torch.Tensor:
    """ids [1, T]: `#` then T - 1 copies of the swap [1 <-> 5], the input on which a drifting
    reflection loses the margin fastest (`SwapModel.failure_length`)."""
    ids = torch.full((1, T), 1 + SWAPS.index((1, 5)), dtype=torch.long)
    ids[0, 0] = START
    return ids


def swap_model(n: int, exact_reflections: bool = False) -> SwapModel:
    """Theorem A.1's model for sequences of up to n tokens, in float32 and eval mode (see
    `SwapModel`; `.to(torch.bfloat16)` or `.double()` for other precisions)."""
    return SwapModel(n, exact_reflections).eval()
