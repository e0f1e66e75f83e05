"""Short causal depthwise convolution: the "short convolution layer (filter size 3)" that
PaTH applies to the low-rank projection before the L2 normalisation of w (paper section
2.2, footnote on w_t and beta_t).

    y_t[c] = sum_{s=0}^{K-1} weight[c, K-1-s] * x_{t-s}[c]      (x_{t-s} = 0 before the start)

over C channels with kernel size K. The paper names no activation after this convolution,
so none is applied by default (fla's `ShortConvolution`, used by the reference code, defaults
to SiLU; pass activation="silu" to get that).

Three paths, one per use:
    forward(x, cu_seqlens)   training: F.conv1d with K-1 zeros on the left (under
                             torch.compile the same sum of K shifted inputs, which compiles
                             once for all lengths), or, for packed sequences, that sum
                             restarting at every boundary (both round as F.conv1d);
    prefill(x, mask)         a prompt and the decode state; a masked token (mask 0,
                             anywhere) is removed: every real token convolves the real
                             inputs before it, as if the masked ones were deleted;
    step(x, state, mask)     m >= 1 new tokens from the state (the last K-1 real inputs): a
                             multiply-and-sum over each output's window (F.conv1d's
                             setup, tens of microseconds per call on CPU, costs more than
                             the arithmetic of a few columns).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops.common.padding import MaskedRows

__all__ = ["ShortConv"]

_ACTIVATIONS = {None: None, "silu": F.silu}


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


class ShortConv(nn.Module):
    """Depthwise causal conv1d over the last dim of x [B, T, C].

    Args:
        channels: C.
        kernel_size: K >= 1 (PaTH: 3).
        bias: add a learnable bias per channel.
        activation: None (default, the paper's text) or "silu".

    Parameters: weight [C, 1, K] (nn.Conv1d's depthwise layout, so the last tap multiplies
    the current token), bias [C] or None.
    """

    def __init__(self, channels: int, kernel_size: int = 3, bias: bool = False,
                 activation: str | None = None):
        super().__init__()
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"channels must be a positive int, got {channels!r}")
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise ValueError(f"kernel_size (conv_size) must be a positive int, got "
                             f"{kernel_size!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be None or 'silu', got {activation!r}")
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Conv1d's initialisation: U(-1/sqrt(K), 1/sqrt(K)) (fan_in = K, depthwise)."""
        bound = 1 / math.sqrt(self.kernel_size)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (f"{self.channels}, kernel_size={self.kernel_size}, bias={self.bias is not None}"
                f", activation={self.activation}")

    def _finish(self, y: torch.Tensor) -> torch.Tensor:
        act = _ACTIVATIONS[self.activation]
        return y if act is None else act(y)

    # ------------------------------------------------------------------------- training

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, C] -> y [B, T, C]. cu_seqlens [N + 1] (with B == 1): packed sequences;
        no output mixes inputs of two sequences."""
        if cu_seqlens is None:
            return self._conv(x)
        return self._finish(self._packed_conv(x, cu_seqlens))

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        """Every row is one sequence: F.conv1d with K-1 zeros on the left (T = 0: an empty
        output, which conv1d would reject for K > 1)."""
        if x.shape[1] == 0:
            return self._finish(x * self.weight[:, 0, -1] if self.bias is None
                                else x * self.weight[:, 0, -1] + self.bias)
        if torch.compiler.is_compiling():
            return self._finish(self._shifted_sum(x))
        xc = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))  # [B, C, K-1+T]
        y = F.conv1d(xc, self.weight, self.bias, groups=self.channels)  # [B, C, T]
        return self._finish(y.transpose(1, 2))

    def _shifted_sum(self, x: torch.Tensor, since_start: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """The convolution as a sum of K shifted inputs: y_t = sum_s weight[:, K-1-s] *
        x_{t-s} (+ bias), x [B, T, C], a tap zero where t - s < 0 or, with since_start [T]
        (t minus the first token of t's sequence, packed inputs), where s > since_start[t].

        Rounds as F.conv1d: under autocast in the autocast dtype, 16-bit inputs summed in
        float32. Used for packed sequences, and for every input under torch.compile:
        inductor's lowering of the convolution's backward fixes the sequence length (torch
        2.13), so a model compiled with dynamic shapes would compile again for every length;
        this sum is elementwise code that it fuses for any length."""
        T, K = x.shape[1], self.kernel_size
        dt = x.dtype
        if dt.is_floating_point and torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)  # conv1d runs in it
        acc = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
        xa = _cast(_cast(x, dt), acc)
        weight = _cast(_cast(self.weight, dt), acc)[:, 0]  # [C, K]
        y = xa * weight[:, K - 1]
        for s in range(1, min(K, T)):
            term = F.pad(xa, (0, 0, s, 0))[:, :T] * weight[:, K - 1 - s]  # x_{t-s} [B, T, C]
            if since_start is not None:
                term = term * (since_start >= s).to(acc)[None, :, None]  # [1, T, 1]
            y = y + term
        if self.bias is not None:
            y = y + _cast(_cast(self.bias, dt), acc)
        return _cast(y, dt)

    def _packed_conv(self, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """`_shifted_sum` restarting at every sequence start of cu_seqlens (B == 1)."""
        B, T, _ = x.shape
        if B != 1:
            raise ValueError(f"cu_seqlens needs packed inputs with B == 1, got B={B}")
        cu = cu_seqlens.to(device=x.device, dtype=torch.long)
        pos = torch.arange(T, device=x.device)
        start = cu[torch.searchsorted(cu, pos, right=True) - 1]  # [T] start of t's sequence
        return self._shifted_sum(x, pos - start)

    # ------------------------------------------------------------------------ inference

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """A prompt x [B, T, C]; attention_mask [B, T] (1 = token, 0 = masked, anywhere) or
        None.

        Masked tokens are removed: each row's real inputs are convolved as one sequence
        (the masked ones moved in front as zeros, `MaskedRows`), so every row equals its real
        tokens alone (outputs at masked positions are meaningless). Returns (y [B, T, C],
        state [B, K-1, C]): the last K-1 real inputs of every row (zeros before its
        start), detached.
        """
        if attention_mask is None:
            return self._conv(x), self._last_inputs(x.detach())
        if tuple(attention_mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"attention_mask must have shape [B, T] = "
                             f"{tuple(x.shape[:2])}, got {tuple(attention_mask.shape)}")
        keep = attention_mask != 0
        rows = MaskedRows(keep)
        xc = rows.compact(x * keep.to(x.dtype)[..., None])  # [B, T, C], real inputs last
        return rows.restore(self._conv(xc)), self._last_inputs(xc.detach())

    def step(self, x: torch.Tensor, state: torch.Tensor, mask: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """m new tokens x [B, m, C] after the inputs held in state [B, K-1, C] (m = 0: an
        empty output and the state itself); mask: None or bool [B, m], False at masked
        tokens (removed, as in `prefill`; their outputs are meaningless).

        Returns (y [B, m, C], history [B, K-1+m, C]): the state followed by x, detached
        (with a mask: the masked inputs, zeroed, moved in front); its last K-1 rows are the
        next state (`history[:, -(K-1):]`, empty when K == 1).
        """
        if mask is not None:
            return self._masked_step(x, state, mask)
        if state.shape != (x.shape[0], self.kernel_size - 1, x.shape[2]):
            raise ValueError(f"state must have shape [B, K-1, C] = "
                             f"{(x.shape[0], self.kernel_size - 1, x.shape[2])}, got "
                             f"{tuple(state.shape)}")
        hist = torch.cat([_cast(state, x.dtype), x], dim=1)  # [B, K-1+m, C]
        if x.shape[1] == 0:
            return self._conv(x), hist.detach()
        # y_t = sum_s weight[:, s] * hist[t + s]: a multiply and a sum over the K taps of
        # each output's window, summed in float32 for 16-bit x as F.conv1d does (the casts
        # are skipped when nothing changes: a decode step is latency bound)
        acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        windows = _cast(hist.unfold(1, self.kernel_size, 1), acc)  # [B, m, C, K]
        weight = _cast(_cast(self.weight, x.dtype), acc)
        y = (windows * weight[:, 0]).sum(-1)  # [B, m, C]
        if self.bias is not None:
            y = y + _cast(_cast(self.bias, x.dtype), acc)
        if hist.requires_grad:
            hist = hist.detach()
        return self._finish(_cast(y, x.dtype)), hist

    def _masked_step(self, x: torch.Tensor, state: torch.Tensor, mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step` with masked tokens: the state and the real inputs as one sequence, the
        masked inputs (zeroed) in front of it."""
        B, m, C = x.shape
        K1 = self.kernel_size - 1
        keep = torch.cat([mask.new_ones(B, K1), mask], dim=1)  # [B, K-1+m]
        rows = MaskedRows(keep)
        xz = x * mask.to(x.dtype)[..., None]
        hist = rows.compact(torch.cat([_cast(state, x.dtype), xz], dim=1))  # [B, K-1+m, C]
        y, _ = self.step(hist[:, K1:], hist[:, :K1])  # the outputs of compacted positions
        y = rows.restore(torch.cat([y.new_zeros(B, K1, C), y], dim=1))[:, K1:]  # [B, m, C]
        return y, hist.detach()

    def _last_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Last K-1 rows of x [B, T, C] along time, zeros before the start: [B, K-1, C]."""
        K1 = self.kernel_size - 1
        hist = F.pad(x, (0, 0, max(K1 - x.shape[1], 0), 0))  # [B, max(T, K-1), C]
        return hist[:, hist.shape[1] - K1:].clone()
