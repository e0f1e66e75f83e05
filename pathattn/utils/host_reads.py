"""`HostReads`: records every operation that makes the host wait for a tensor's values, on
any device, the CPU included (where `torch.cuda.set_sync_debug_mode` sees nothing).

On a GPU these are the calls that synchronise the host with the device: reading a value
(`.item()`, `bool(t)`, `int(t)`, `if t: ...`, `.tolist()`, `.numpy()`), ops whose output
shape depends on the values (`nonzero`, boolean indexing, `masked_select`, `unique`, ...),
copies between devices, and tensors built from host data (`torch.tensor(...)`, which on a
GPU is a copy from pageable memory). A decode step that records none of them on the CPU
runs the same Python on a GPU without waiting for the device.
"""

from __future__ import annotations

import contextlib
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostReads"]

_aten = torch.ops.aten
# ops that read values to the host or whose output shape depends on values
_READS = {
    _aten._local_scalar_dense.default: "value read (item / bool / int / float / if)",
    _aten.is_nonzero.default: "value read (bool)",
    _aten.equal.default: "value read (torch.equal)",
    _aten.nonzero.default: "nonzero (value-dependent shape)",
    _aten.masked_select.default: "masked_select (value-dependent shape)",
    _aten._unique2.default: "unique (value-dependent shape)",
    _aten.unique_consecutive.default: "unique_consecutive (value-dependent shape)",
    _aten.unique_dim.default: "unique (value-dependent shape)",
    _aten.lift_fresh.default: "tensor from host data (torch.tensor / as_tensor)",
}
_INDEX = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default}
_TRANSFER = {_aten._to_copy.default, _aten.copy_.default}


def _devices(args, kwargs) -> set[torch.device]:
    found = set()
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, torch.Tensor):
            found.add(a.device)
    return found


class HostReads(TorchDispatchMode):
    """Context manager recording host reads (module docstring) in `events`: one
    (what, where) pair per read, where the innermost frame outside torch and this module.
    Also wraps `Tensor.tolist`, `Tensor.numpy` and `Tensor.__array__`, which do not go
    through the dispatcher.

        with HostReads() as reads:
            model.decode(tok, cache)
        assert not reads.events, reads.report()
    """

    _PY_READS = ("tolist", "numpy", "__array__")

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, str]] = []
        self._patched: dict[str, object] = {}

    def _record(self, what: str) -> None:
        where = "?"
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/torch/" not in frame.filename and frame.filename != __file__:
                where = f"{frame.filename}:{frame.lineno} ({frame.name})"
                break
        self.events.append((what, where))

    def report(self) -> str:
        return "\n".join(f"{what} at {where}" for what, where in self.events) or "none"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS:
            self._record(_READS[func])
        elif func in _INDEX:
            index = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in index or ()):
                self._record(f"{func} with a boolean index (value-dependent shape)")
        elif func in _TRANSFER:
            target = kwargs.get("device")
            devs = _devices(args, None)
            if (target is not None and any(d != torch.device(target) for d in devs)) or (
                    func is _aten.copy_.default and len(devs) > 1):
                self._record(f"{func} between devices")
        elif func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._record("repeat_interleave without output_size (value-dependent shape)")
        return func(*args, **kwargs)

    def __enter__(self):
        for name in self._PY_READS:
            original = getattr(torch.Tensor, name)
            self._patched[name] = original

            def wrapper(t, *a, _original=original, _name=name, **k):
                self._record(f"Tensor.{_name}")
                return _original(t, *a, **k)

            setattr(torch.Tensor, name, wrapper)
        try:
            return super().__enter__()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc):
        with contextlib.ExitStack() as stack:
            stack.callback(self._restore)
            return super().__exit__(*exc)

    def _restore(self) -> None:
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        self._patched.clear()
