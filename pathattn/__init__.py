"""pathattn: PaTH attention (data-dependent Householder position encoding) for PyTorch."""

from . import _hf_autoregister, models, nn, tasks
from .ops import PaTHCache, path_attn, path_attn_prefill, path_attn_step

__version__ = "0.1.0"
__all__ = ["path_attn", "path_attn_prefill", "path_attn_step", "PaTHCache", "nn", "models",
           "tasks", "PaTHConfig", "PaTHForCausalLM", "PaTHModel", "__version__"]

_HF_NAMES = ("PaTHConfig", "PaTHForCausalLM", "PaTHModel")


def __getattr__(name: str):
    """pathattn.PaTHConfig / PaTHForCausalLM / PaTHModel, imported on first use (they need
    transformers >= 5; `pip install "pathattn[hf]"`)."""
    if name in _HF_NAMES:
        try:
            from . import hf
        except ImportError as e:
            raise ImportError(f"pathattn.{name} needs transformers >= 5 "
                              f"(pip install 'transformers>=5'): {e}") from e
        return getattr(hf, name)
    raise AttributeError(f"module 'pathattn' has no attribute {name!r}")


_hf_autoregister.install()
