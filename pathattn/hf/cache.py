"""`PaTHGenerationCache`: the `past_key_values` that `PaTHForCausalLM` returns and that
transformers' generate() threads through decoding.

It wraps the model's own decode state (`pathattn.models.ModelCache`: per layer, a PaTH
cache whose keys are updated in place by each new token's transform, paper section 3.4, or
a RoPE / FoX cache) and offers the part of transformers' `Cache` interface that generate()
calls on a model-supplied cache: `get_seq_length`, `is_linear`, `reorder_cache` (beam
search) and `crop` (assisted decoding; PaTH and FoX layers can go back to the start of the
last decode step only, because Householder transforms are not invertible). It is not a
`transformers.Cache` subclass: no static / compiled cache, no offloading.
"""

from __future__ import annotations

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
    is_croppable = False

    def __init__(self, model_cache: ModelCache | None = None):
        if model_cache is not None and not isinstance(model_cache, ModelCache):
            raise ValueError(f"model_cache must be a ModelCache or None, got "
                             f"{type(model_cache).__name__}")
        self.model_cache = model_cache

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

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """Positions held: prompt length (left padding included) plus decoded tokens."""
        return 0 if self.model_cache is None else len(self.model_cache)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row b becomes old row beam_idx[b] in every layer (beam search), in place."""
        if self.model_cache is not None:
            self.model_cache.reorder(beam_idx.to(torch.long))

    def crop(self, max_length: int) -> None:
        """Keep the first max_length positions (negative: drop the last -max_length)."""
        if self.model_cache is None:
            return
        n = len(self.model_cache)
        keep = n + max_length if max_length < 0 else min(max_length, n)
        if keep < n:
            self.model_cache.truncate(keep)
