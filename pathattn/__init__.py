"""pathattn: PaTH attention (data-dependent Householder position encoding) for PyTorch."""

from .ops import path_attn

__version__ = "0.1.0"
__all__ = ["path_attn", "__version__"]
