"""`PaTHGenerationCache`: the cache that `PaTHForCausalLM` returns (`output.cache`) and that
transformers' generate() threads through decoding.

It wraps the model's own decode state (`pathattn.models.ModelCache`: per layer, a PaTH
cache whose keys are updated in place by each new token's transform, paper section 3.4, or
a RoPE / FoX / SBA cache) and offers the part of transformers' `Cache` interface that
generate() calls on a model-supplied cache: `get_seq_length`, `is_linear`, `reorder_cache`
(beam search), `activate_past_recording`, `is_croppable` and `crop` (assisted decoding and
prompt lookup). Householder transforms are not invertible, so a PaTH or FoX layer goes back
only to the start of its pending window, unless the prefill kept every position's raw
inputs: `activate_past_recording()` before the prefill asks for that (about twice the key
cache's memory). It is not a `transformers.Cache` subclass: no static / compiled cache, no
offloading. Why: docs/hf_contract.md.
"""

from __future__ import annotations

import numbers

import torch

from ..models import ModelCache

__all__ = ["PaTHGenerationCache"]


class PaTHGenerationCache:
    """Decode state of a `PaTHForCausalLM` (module docstring).

    Args:
        model_cache: the ModelCache of a prefill, or None for an empty cache (pass an empty
            one to generate() to get the filled cache back).
    """

    is_compileable = False

    def __init__(self, model_cache: ModelCache | None = None):
        if model_cache is not None and not isinstance(model_cache, ModelCache):
            raise ValueError(f"model_cache must be a ModelCache or None, got "
                             f"{type(model_cache).__name__}")
        self.model_cache = model_cache
        self.record_past = False  # the next prefill keeps its raw inputs (crop anywhere)

    def __len__(self) -> int:
        return self.get_seq_length()

    def __repr__(self) -> str:
        return f"PaTHGenerationCache(seq_len={self.get_seq_length()})"

    @property
    def is_linear(self) -> list[bool]:
        """Per layer, False: every layer keeps one entry per position (keys, values), not a
        fixed-size recurrent state, so generate() (transformers >= 5.24) slices a prompt
        that restarts from this cache by its length, as for attention caches."""
        return [False] * (1 if self.model_cache is None else len(self.model_cache.layers))

    @property
    def is_empty(self) -> bool:
        return self.model_cache is None

    @property
    def min_len(self) -> int:
        """Smallest length `crop` can go back to (0 for an empty cache)."""
        return 0 if self.model_cache is None else self.model_cache.min_len

    @property
    def is_croppable(self) -> bool:
        """Whether `crop` can go back to any length: every layer keeps what it needs (RoPE
        and SBA always; PaTH and FoX when prefilled after `activate_past_recording`)."""
        return self.model_cache is not None and self.model_cache.min_len == 0

    def activate_past_recording(self) -> None:
        """Make the next prefill into this (empty) cache keep every position's raw inputs, so
        that `crop` can go back to any length (transformers calls this before assisted
        decoding). On a filled cache it changes nothing; `crop` then reports its limit."""
        self.record_past = True

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """Positions held: prompt length (masked tokens included) plus decoded tokens."""
        return 0 if self.model_cache is None else len(self.model_cache)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row b becomes old row beam_idx[b] in every layer (beam search), in place."""
        if self.model_cache is not None:
            self.model_cache.reorder(beam_idx.to(torch.long))

    def crop(self, max_length: int) -> None:
        """Drop the last -max_length positions (max_length <= 0, transformers 5), or keep
        the first max_length (> 0, the older convention). ValueError naming the limit when
        the cache cannot go back that far (`min_len`)."""
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral):
            raise ValueError(f"crop: max_length must be an int, got {max_length!r}")
        if self.model_cache is None:
            return
        n = len(self.model_cache)
        keep = max(n + int(max_length), 0) if max_length <= 0 else min(int(max_length), n)
        if keep == n:
            return
        if keep < self.min_len:
            raise ValueError(
                f"crop: cannot go back to {keep} positions; this cache goes back to "
                f"{self.min_len} at the earliest (PaTH keys before it already carry the "
                "transforms of later tokens, which are not invertible). Call "
                "activate_past_recording() before the prefill to crop anywhere.")
        self.model_cache.truncate(keep)
