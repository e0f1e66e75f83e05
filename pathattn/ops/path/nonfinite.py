"""Non-finite inputs stay where the definition puts them.

By the definition of PaTH attention, token t's inputs reach only outputs i >= t of its own
sequence: k_t, v_t, w_t, beta_t and g_t enter logit(i, j) and o_i for i >= t only, and q_i
only o_i. A NaN or inf there makes those outputs NaN, as in the float64 reference, and
nothing else. The blockwise and fused algorithms would spread it further: they multiply
whole blocks of tokens, and a masked-out entry still gives 0 * NaN = NaN in a GEMM, so a
NaN at t would reach the earlier tokens of its block.

`isolate_nonfinite` therefore replaces every non-finite input entry by 0 (beta = 0 is the
identity transform, g = 0 keeps the gate open) and reports the output rows that the
definition makes non-finite: for each sequence and query head, every row from the first
token with a non-finite k, v, w, beta or g on, and every row whose q is non-finite. The
public ops set those rows to NaN after computing the rest from the cleaned inputs.

On the CPU the check is one sum over each input (a finite sum: every entry is finite) and
the common all-finite case returns the inputs untouched; on other devices and under
torch.compile the masks are built without reading anything back to the host (no
synchronisation, no graph break): one max-abs reduction per input. A backend whose kernels
read every non-finite input entry as 0 themselves (`Backend.sanitizes`) is given the inputs
as they are, so no input is copied.
"""

from __future__ import annotations

import torch

from ..common.layout import token_bounds
from .gates import sequence_cumsum

__all__ = ["isolate_nonfinite", "poison_rows", "poison_keys"]


def _peak(x: torch.Tensor, feature_dims: int) -> torch.Tensor:
    """The largest |entry| of each token's features, [B, T, H]: inf or NaN exactly when an
    entry is (NaN propagates through max). One pass over x."""
    if not feature_dims:
        return x.abs()
    return torch.linalg.vector_norm(x.flatten(-feature_dims), ord=float("inf"), dim=-1)


def _bad(peak: torch.Tensor) -> torch.Tensor:
    """True where a peak (>= 0, or NaN) is inf or NaN: two elementwise operations
    (torch.isfinite is four)."""
    return ~(peak < float("inf"))


def _bad_rows(x: torch.Tensor, feature_dims: int) -> torch.Tensor:
    """True where any entry of a token's features is non-finite: [B, T, H]."""
    return _bad(_peak(x, feature_dims))


def _kv_bad(k, v, w, beta) -> torch.Tensor:
    """[B, T, H] True where a token's k, v, w or beta has a non-finite entry (w [B, T, H, D]
    or [B, T, H, R, D], beta [B, T, H] or [B, T, H, R]). The four peaks are combined before
    the one test (torch.maximum propagates NaN)."""
    peak = torch.maximum(torch.maximum(_peak(k, 1), _peak(v, 1)),
                         torch.maximum(_peak(w, w.ndim - 3), _peak(beta, beta.ndim - 3)))
    return _bad(peak)


def _surely_finite(x: torch.Tensor) -> bool:
    """True only when every entry of x is finite: its sum is finite (a NaN or inf anywhere
    makes the sum NaN or inf; an overflowing sum of finite entries answers False, and the
    caller then takes the exact path). One vectorised pass, no bool temporary: cheaper
    than torch.isfinite(x).all() by several times on the CPU."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return bool(torch.isfinite(x.sum(dtype=acc)))


def isolate_nonfinite(q, k, v, w, beta, g, cu_seqlens, clean: bool = True):
    """Clean inputs and the rows the definition makes non-finite.

    Shapes as `pathattn.path_attn`. Returns ((q, k, v, w, beta, g), rows) with rows
    [B, T, HQ] bool (True: the output row must be NaN), or rows None when every input is
    finite (the inputs are then returned as they are). clean=False returns the inputs as
    they are in every case (for kernels that read non-finite entries as 0).
    """
    inputs = (q, k, v, w, beta, g)
    if q.device.type == "cpu" and not torch.compiler.is_compiling() and all(
            _surely_finite(x) for x in inputs if x is not None):
        return inputs, None
    B, T, HQ, _ = q.shape
    H = k.shape[2]
    bad = _kv_bad(k, v, w, beta)
    if HQ != H:
        bad = bad.repeat_interleave(HQ // H, dim=2)  # [B, T, HQ]
    if g is not None:
        bad = bad | _bad_rows(g, 0)
    start, end = token_bounds(B, T, cu_seqlens, q.device)
    seen = sequence_cumsum(bad.reshape(B * T, HQ).to(torch.int32), start, end,
                           row_length=T if cu_seqlens is None else None)
    rows = (seen > 0).view(B, T, HQ) | _bad_rows(q, 1)
    if not clean:
        return inputs, rows
    cleaned = tuple(None if x is None else x.masked_fill(~torch.isfinite(x), 0)
                    for x in inputs)
    return cleaned, rows


def poison_rows(o: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """o [B, T, HQ, Dv] with the rows marked in rows [B, T, HQ] set to NaN."""
    if rows is None:
        return o
    # as [B * T * HQ, Dv] rows: with a [B, T, HQ, 1] mask inductor (torch 2.13) compares
    # symbolic strides of its size-1 dimension and fails under dynamic shapes
    Dv = o.shape[-1]
    return o.reshape(-1, Dv).masked_fill(rows.reshape(-1, 1), float("nan")).view(o.shape)


def poison_keys(keys: torch.Tensor, k, v, w, beta, cu_seqlens) -> torch.Tensor:
    """Transformed keys [B, T, H, D] of `path_attn_with_keys` with NaN where the definition
    puts it: key j carries H_t for every later t of its sequence, so it is NaN when a token
    t >= j has a non-finite k, v, w or beta (original inputs, shapes as `path_attn`)."""
    B, T, H, _ = keys.shape
    start, end = token_bounds(B, T, cu_seqlens, keys.device)
    later = sequence_cumsum(_kv_bad(k, v, w, beta).reshape(B * T, H).to(torch.int32),
                            start, end, reverse=True,
                            row_length=T if cu_seqlens is None else None)
    return keys.masked_fill((later > 0).view(B, T, H, 1), float("nan"))
