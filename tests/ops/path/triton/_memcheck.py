"""Memory checks of Triton kernels on the CPU interpreter, for what a GPU would do with them:

- out of bounds: every unmasked element of a load, store or atomic must fall inside one of
  the launch's tensor arguments;
- races between programs: within one launch, an address stored to (or added to with an
  atomic) by one program must not be read, stored to or added to by another, unless every
  access to it is an atomic. The interpreter runs programs one after another, so such a
  race gives right numbers here and wrong ones on a GPU.

`interpreter_memcheck()` patches the interpreter for the duration of a `with` block and
yields a `Findings`. Only meaningful with TRITON_INTERPRET=1 (the kernels must run on the
interpreter); races inside one program (between its warps) are not seen.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Findings:
    out_of_bounds: list = field(default_factory=list)  # (kernel, kind, count, first address)
    races: list = field(default_factory=list)  # (kernel, count, first address)
    launches: int = 0


@dataclass
class _Launch:
    name: str
    ranges: list
    grid: tuple = (1, 1, 1)
    plain: list = field(default_factory=list)  # [addresses, program, is_write]
    atomic: list = field(default_factory=list)  # [addresses, program]


def _addresses(ptrs, mask) -> np.ndarray:
    p = np.asarray(ptrs.data).astype(np.uint64)
    m = np.broadcast_to(np.asarray(mask.data).astype(bool), p.shape)
    return p[m]


def _races(launch: _Launch) -> tuple[int, int]:
    """(number of racing addresses, the first one) of a finished launch."""
    if not launch.plain and not launch.atomic:
        return 0, 0
    rows = [(a, np.full(a.shape, pid, np.int64), np.full(a.shape, kind, np.int8))
            for a, pid, kind in launch.plain]
    rows += [(a, np.full(a.shape, pid, np.int64), np.full(a.shape, 2, np.int8))
             for a, pid in launch.atomic]
    addr = np.concatenate([r[0] for r in rows])
    pid = np.concatenate([r[1] for r in rows])
    kind = np.concatenate([r[2] for r in rows])  # 0 read, 1 write, 2 atomic
    if addr.size == 0:
        return 0, 0
    order = np.lexsort((pid, addr))
    addr, pid, kind = addr[order], pid[order], kind[order]
    starts = np.flatnonzero(np.r_[True, addr[1:] != addr[:-1]])
    n_pids = np.add.reduceat(np.r_[1, (pid[1:] != pid[:-1]) | (addr[1:] != addr[:-1])]
                             .astype(np.int64), starts)
    written = np.maximum.reduceat(kind, starts) >= 1  # a store or an atomic
    all_atomic = np.minimum.reduceat(kind, starts) == 2
    racing = (n_pids >= 2) & written & ~all_atomic
    hits = addr[starts][racing]
    return int(hits.size), int(hits[0]) if hits.size else 0


@contextlib.contextmanager
def interpreter_memcheck():
    import triton.runtime.interpreter as interp

    found = Findings()
    stack: list[_Launch] = []
    executor, builder = interp.GridExecutor, interp.InterpreterBuilder
    saved = (executor.__call__, builder.create_masked_load, builder.create_masked_store,
             builder.create_atomic_rmw, builder.create_atomic_cas)

    def call(self, *args, **kwargs):
        ranges = []
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                s = a.untyped_storage()
                ranges.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
        stack.append(_Launch(getattr(self.fn, "__name__", str(self.fn)), ranges))
        try:
            return saved[0](self, *args, **kwargs)
        finally:
            launch = stack.pop()
            found.launches += 1
            n, first = _races(launch)
            if n:
                found.races.append((launch.name, n, hex(first)))

    def program(b) -> int:
        x, y, z = b.grid_idx
        gx, gy, _ = b.grid_dim
        return int(x + gx * (y + gy * z))

    def check(b, ptrs, mask, kind: str) -> np.ndarray:
        addr = _addresses(ptrs, mask)
        if not stack or addr.size == 0:
            return addr
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        inside = np.zeros(addr.shape, bool)
        for lo, hi in stack[-1].ranges:
            inside |= (addr >= lo) & (addr + size <= hi)
        if not inside.all():
            bad = addr[~inside]
            found.out_of_bounds.append((stack[-1].name, kind, int(bad.size), hex(int(bad[0]))))
        return addr

    def load(self, ptrs, mask, other, *a):
        if stack:
            stack[-1].plain.append((check(self, ptrs, mask, "load"), program(self), 0))
        return saved[1](self, ptrs, mask, other, *a)

    def store(self, ptrs, value, mask, *a):
        if stack:
            stack[-1].plain.append((check(self, ptrs, mask, "store"), program(self), 1))
        return saved[2](self, ptrs, value, mask, *a)

    def rmw(self, op, ptr, val, mask, *a):
        if stack:
            stack[-1].atomic.append((check(self, ptr, mask, "atomic"), program(self)))
        return saved[3](self, op, ptr, val, mask, *a)

    def cas(self, ptr, cmp, val, *a):
        if stack:
            ones = type(ptr)(np.ones_like(np.asarray(ptr.data), dtype=bool), None)
            stack[-1].atomic.append((check(self, ptr, ones, "atomic"), program(self)))
        return saved[4](self, ptr, cmp, val, *a)

    executor.__call__ = call
    builder.create_masked_load, builder.create_masked_store = load, store
    builder.create_atomic_rmw, builder.create_atomic_cas = rmw, cas
    try:
        yield found
    finally:
        (executor.__call__, builder.create_masked_load, builder.create_masked_store,
         builder.create_atomic_rmw, builder.create_atomic_cas) = saved


@contextlib.contextmanager
def poisoned_allocations():
    """torch.empty, empty_like and Tensor.new_empty return NaN-filled floats and large
    integers, so a kernel that reads memory nobody wrote gives non-finite results."""
    empty, empty_like, new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype in (torch.int16, torch.int32, torch.int64):
            t.fill_(1 << 14)
        return t

    torch.empty = lambda *a, **k: fill(empty(*a, **k))
    torch.empty_like = lambda *a, **k: fill(empty_like(*a, **k))
    torch.Tensor.new_empty = lambda self, *a, **k: fill(new_empty(self, *a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty
