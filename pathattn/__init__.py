"""pathattn: PaTH attention (data-dependent Householder position encoding) for PyTorch."""

from . import models, nn, tasks
from .ops import PaTHCache, path_attn, path_attn_prefill, path_attn_step

__version__ = "0.1.0"
__all__ = ["path_attn", "path_attn_prefill", "path_attn_step", "PaTHCache", "nn", "models",
           "tasks", "__version__"]
