"""PaTH and PaTH-FoX attention (paper sections 2-3).

Layers: the float64 references (`reference`); the blockwise algorithm (`stages`, `ut`,
`blockwise`, `gates`) with its autograd custom ops (`function`); the fused C++ CPU kernels
(`cpu`) and Triton kernels (`triton`); the backend registry (`backends`); the public op
(`api`), inference over a key cache (`inference`, `cache`) and context parallelism (`cp`).
"""

from .api import path_attn, path_attn_with_keys
from .backends import (
    Backend,
    backend_names,
    get_backend,
    register_backend,
    select_backend,
    unregister_backend,
)
from .cache import PaTHCache
from .inference import path_attn_prefill, path_attn_step
from .reference import path_attn_full_matrix, path_attn_naive, path_attn_weights

__all__ = ["path_attn", "path_attn_with_keys", "path_attn_prefill", "path_attn_step",
           "PaTHCache", "path_attn_naive", "path_attn_full_matrix", "path_attn_weights", "Backend",
           "register_backend", "unregister_backend", "get_backend", "backend_names",
           "select_backend"]
