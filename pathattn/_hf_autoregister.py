"""Register pathattn's Hugging Face classes (`pathattn.hf.register`) once transformers is
imported, without importing transformers ourselves (it takes seconds).

`install()` registers at once when transformers is already imported; otherwise it puts a
one-shot finder on `sys.meta_path` that lets the normal import of "transformers" run and then
registers. Without transformers installed nothing happens. A failing registration (e.g. an
unsupported transformers version) warns instead of breaking transformers' import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["install"]


def _register() -> None:
    hf = sys.modules.get("pathattn.hf")
    if hf is not None and not getattr(hf, "_READY", False):
        return  # pathattn.hf is importing transformers itself and registers when done
    try:
        from .hf import register

        register()
    except Exception as e:  # noqa: BLE001 - never break the user's `import transformers`
        warnings.warn(f"pathattn: could not register the Hugging Face classes with "
                      f"transformers ({type(e).__name__}: {e}); pathattn.hf needs "
                      f"transformers >= 5", stacklevel=2)


class _AfterTransformersImport(importlib.abc.MetaPathFinder):
    """Finds "transformers" with the other finders, then wraps its loader's exec_module so
    that registration runs right after the package's own code."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps find_spec below from recursing
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _register()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Register now or after transformers' import (module docstring)."""
    if "transformers" in sys.modules:
        _register()
    elif importlib.util.find_spec("transformers") is not None and not any(
            isinstance(f, _AfterTransformersImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformersImport())
