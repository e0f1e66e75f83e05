"""Theorem A.2 of the paper (appendix A): two PaTH layers solve flip-flop language
modelling for all inputs up to length n.

Vocabulary: that of `pathattn.tasks.flipflop`, ids w = 0, r = 1, i = 2, 0 = 3, 1 = 4, the
order of the paper's embedding e1 ... e5. The residual stream has the paper's 16
dimensions (paper dimension d is index d - 1 here):

    emb(u) = e_{u+1} + e6                          one-hot of the id, plus a constant e6

    layer 1   k = (h1 + h2 + h3) e1,  q = s h6 e1,  beta = 1,
              w = (h1 + h2 + h3) e1 + (h4 + h5) e2,  v -> h7, h8, h9 = (h1, h2, h3)
              H = I - e1 e1^T at instructions, I - e2 e2^T at bits, so a bit attends to
              the instruction just before it: h7 = "the previous token is w".
    FFN 1     h10 = 1{bit 0 after w},  h11 = 1{bit 1 after w},  h12 = 1 - h10 - h11
    layer 2   k = (h10 + h11) e1,  q = s h6 e1,  beta = 1,
              w = (h10 + h11) e1 + h12 e2,  v -> h13, h14 = (h10, h11)
              H kills e1 at every written bit, so every token attends to the last written
              bit at or before it: h13 / h14 = "the stored bit is 0 / 1".
    FFN 2     h15 = 1{token is r and h13 > h14},  h16 = 1{token is r and h14 > h13}
    LM head   c (h1 + h3) on both bits, c (h4 + h5) on the three instructions,
              c h15 on bit 0, c h16 on bit 1.

Why the attention is exact enough: in both layers the chosen key has logit s and every
other logit is 0, so it gets weight a = e^s / (e^s + i) at position i and each other key
1 / (e^s + i). With s >= n > i, a > 1/2 and the other keys' values sum below 1/2, so the
thresholds at 1/2 (FFN 1) and the comparison h13 > h14 (FFN 2) are exact. Every H is a
coordinate projection with beta = 1 and w in {e1, e2}, exact in every float format.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..tasks.flipflop import BIT0, VOCAB, W
from .handset import Threshold, handset_path_layer, pow2_at_least

__all__ = ["FlipFlopModel", "flipflop_model", "last_written_bit", "FLIPFLOP_WIDTH"]

FLIPFLOP_WIDTH = 16  # the paper's residual stream
HEAD_DIM = 4  # 3 value dims are needed; the default scale 4 ** -0.5 = 1/2 is exact
VOCAB_SIZE = len(VOCAB)  # 5


def last_written_bit(ids: torch.Tensor) -> torch.Tensor:
    """Plain-Python ground truth for ids [B, T] in the flip-flop vocabulary: LongTensor
    [B, T], at t the bit (0 / 1) of the last bit token that directly follows a `w`, at or
    before t; -1 before the first such bit."""
    rows = []
    for seq in ids.tolist():
        state, row = -1, []
        for t, u in enumerate(seq):
            if u >= BIT0 and t > 0 and seq[t - 1] == W:
                state = u - BIT0
            row.append(state)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long).view(ids.shape)


def check_flipflop_ids(ids: torch.Tensor, n: int) -> None:
    """ids must be an int tensor [B, T], 1 <= T <= n, in the flip-flop format: instructions
    (ids 0 to 2) at even positions, bits (ids 3, 4) at odd positions. The format is part
    of the theorem: layer 1 finds a bit's instruction as the last instruction before it,
    which is the token just before it only when instructions and bits alternate."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.ndim != 2:
        raise ValueError("ids must be an integer tensor [B, T]")
    if not 1 <= ids.shape[1] <= n:
        raise ValueError(f"sequence length must be in [1, n={n}], got {ids.shape[1]}")
    instr, bits = ids[:, 0::2], ids[:, 1::2]
    if bool((instr < 0).any()) or bool((instr >= BIT0).any()) or bool(
            (bits < BIT0).any()) or bool((bits >= VOCAB_SIZE).any()):
        raise ValueError(f"ids must alternate instruction (w r i = 0 1 2) and bit (0 1 = "
                         f"3 4), starting with an instruction (vocabulary {VOCAB.itos})")


def _threshold_ffn(rows: dict[int, tuple[dict[int, float], float]],
                   writes: dict[int, tuple[dict[int, float], float]]) -> nn.Sequential:
    """Linear -> 1{. > 0} -> Linear on the 16-dim stream. `rows[u] = ({dim: coef}, bias)`
    defines hidden unit u; `writes[d] = ({unit: coef}, bias)` the output dimension d."""
    up, down = nn.Linear(FLIPFLOP_WIDTH, len(rows)), nn.Linear(len(rows), FLIPFLOP_WIDTH)
    with torch.no_grad():
        for p in (*up.parameters(), *down.parameters()):
            p.zero_()
        for u, (coefs, bias) in rows.items():
            up.bias[u] = bias
            for d, c in coefs.items():
                up.weight[u, d] = c
        for d, (coefs, bias) in writes.items():
            down.bias[d] = bias
            for u, c in coefs.items():
                down.weight[d, u] = c
    return nn.Sequential(up, Threshold(), down)


class FlipFlopModel(nn.Module):
    """Theorem A.2's two-layer PaTH transformer with hand-set weights (module docstring).

    `layer1`, `layer2` are real `PaTHAttention` layers (one head, head dim 4, full-rank w
    projection, identity short convolution, beta = 2 sigmoid(0) = 1); `ffn1`, `ffn2` are
    threshold MLPs; `lm_head` a Linear(16, 5). Every block adds to the residual stream.

    Args:
        n: the longest sequence (tokens) the model is built for; the query scale s is the
            smallest power of two >= n (the paper uses n: s >= n is what the proof needs,
            a power of two keeps q exact in bf16), and the output confidence is
            c = 101 ln n + ln 3, so the wrong tokens get probability below n^-101.
    """

    def __init__(self, n: int):
        super().__init__()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        self.n = n
        s = pow2_at_least(n) * math.sqrt(HEAD_DIM)  # undoes the layer's scale D ** -0.5
        self.confidence = 101 * math.log(max(n, 2)) + math.log(3)
        emb = F.one_hot(torch.arange(VOCAB_SIZE), FLIPFLOP_WIDTH).float()  # [5, 16]
        emb[:, 5] = 1.0  # e6
        self.register_buffer("emb", emb, persistent=False)
        self.layer1 = self._attention(s, keys=(0, 1, 2), w_other=(3, 4), values=(0, 1, 2),
                                      out=(6, 7, 8))
        self.layer2 = self._attention(s, keys=(9, 10), w_other=(11,), values=(9, 10),
                                      out=(12, 13))
        self.ffn1 = _threshold_ffn(
            rows={0: ({3: 1.0, 6: 1.0}, -1.5), 1: ({4: 1.0, 6: 1.0}, -1.5)},
            writes={9: ({0: 1.0}, 0.0), 10: ({1: 1.0}, 0.0), 11: ({0: -1.0, 1: -1.0}, 1.0)})
        self.ffn2 = _threshold_ffn(
            rows={0: ({1: 1.0, 12: 1.0, 13: -1.0}, -1.0),
                  1: ({1: 1.0, 13: 1.0, 12: -1.0}, -1.0)},
            writes={14: ({0: 1.0}, 0.0), 15: ({1: 1.0}, 0.0)})
        self.lm_head = nn.Linear(FLIPFLOP_WIDTH, VOCAB_SIZE, bias=False)
        c = self.confidence
        with torch.no_grad():
            head = torch.zeros(VOCAB_SIZE, FLIPFLOP_WIDTH)  # [5, 16]
            head[3:5, 0] = head[3:5, 2] = c  # after w or i: either bit
            head[0:3, 3] = head[0:3, 4] = c  # after a bit: any instruction
            head[3, 14], head[4, 15] = c, c  # at r: the stored bit
            self.lm_head.weight.copy_(head)

    @staticmethod
    def _attention(s: float, keys, w_other, values, out):
        """One head: k = (sum of h[keys]) e1, q = s h6 e1, w = (sum h[keys]) e1 +
        (sum h[w_other]) e2, value dim r = h[values[r]] written to stream dim out[r]."""
        layer = handset_path_layer(FLIPFLOP_WIDTH, num_heads=1, head_dim=HEAD_DIM,
                                   beta_logit=0.0)  # beta = 2 sigmoid(0) = 1
        with torch.no_grad():
            layer.q_proj.weight[0, 5] = s
            for d in keys:
                layer.k_proj.weight[0, d] = layer.w_proj.weight[0, d] = 1.0
            for d in w_other:
                layer.w_proj.weight[1, d] = 1.0
            for r, (d_in, d_out) in enumerate(zip(values, out, strict=True)):
                layer.v_proj.weight[r, d_in] = 1.0
                layer.o_proj.weight[d_out, r] = 1.0
        return layer

    def stream(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> the residual stream h [B, T, 16] before the LM head (h[..., 12]
        and h[..., 13] are the paper's h13, h14: the stored bit as attention weights)."""
        check_flipflop_ids(ids, self.n)
        h = self.emb.to(self.lm_head.weight.dtype)[ids]  # [B, T, 16]
        h = h + self.layer1(h)
        h = h + self.ffn1(h)
        h = h + self.layer2(h)
        return h + self.ffn2(h)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] (int, flip-flop format, T <= n) -> next-token logits [B, T, 5];
        at every `r` after a write, the argmax is the last written bit (id 3 or 4)."""
        return self.lm_head(self.stream(ids))


def flipflop_model(n: int) -> FlipFlopModel:
    """Theorem A.2's model for sequences of up to n tokens, in float32 and eval mode (see
    `FlipFlopModel`; `.to(torch.bfloat16)` or `.double()` for other precisions)."""
    return FlipFlopModel(n).eval()
