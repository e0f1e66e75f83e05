"""The memory of one emulated kernel launch (`ptx_emulator`): its tensors, the block's
shared memory, and the check of every access against them.

Addresses are per thread (numpy uint64 arrays, one entry per thread of the block). Global
memory is the launch's tensors (`Region`); the bytes of integer tensors are kept, so the
kernel reads the values it computes addresses from. Shared memory holds the bytes stored
with known values, so that indices passed between threads through it stay known; a store
of unknown data forgets what it overwrote. wgmma operands are checked as whole tiles:
`tile_extent` decodes a matrix descriptor (start address, leading and stride byte offsets,
swizzle mode, in the PTX ISA's encoding) into the bytes one instruction reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Region", "Fault", "Memory", "tile_extent"]

U64 = np.uint64


@dataclass(frozen=True)
class Region:
    """A tensor of the launch: [base, base + size) bytes; data: its bytes when the kernel
    may compute addresses from its values (integer tensors), else None."""

    name: str
    base: int
    size: int
    data: bytes | None = None


@dataclass(frozen=True)
class Fault:
    """An access outside the launch's memory: statement index, its source line, opcode,
    space ("global", "shared", "wgmma A" / "wgmma B"), the first bad address (global:
    absolute; shared: offset in the block's shared memory; wgmma: one past the tile's last
    byte), threads affected, and for a global one the nearest region (name, offset from
    its base, its size)."""

    index: int
    loc: str
    op: str
    space: str
    address: int
    threads: int
    near: tuple | None = None


@dataclass
class Memory:
    """Regions and shared bytes of a launch; `faults` and the access counts grow as the
    emulator checks accesses. `where` arguments are (statement index, source line,
    opcode)."""

    regions: list
    shared: int
    faults: list = field(default_factory=list)
    global_accesses: int = 0
    shared_accesses: int = 0
    shared_writes: int = 0

    def __post_init__(self):
        self.regions = sorted(self.regions, key=lambda r: r.base)
        self.data = {r.name: np.frombuffer(r.data, np.uint8) for r in self.regions
                     if r.data is not None}
        self.reset_shared()

    def reset_shared(self) -> None:
        self.smem = np.zeros(self.shared + 64, dtype=np.uint8)
        self.known = np.zeros(self.shared + 64, dtype=bool)

    def forget_shared(self) -> None:
        self.shared_writes += 1
        self.known[:] = False

    def check_global(self, where, addrs, nbytes: int, lanes) -> Region | None:
        """The region holding every selected thread's access (lanes: bool per thread, or
        None for all), None when they fall in several regions; records a fault for any
        access inside none."""
        self.global_accesses += 1
        a = addrs if lanes is None else addrs[lanes]
        if a.size == 0:
            return None
        lo, hi = int(a.min()), int(a.max()) + nbytes
        for r in self.regions:
            if r.base <= lo and hi <= r.base + r.size:
                return r
        bad = [int(x) for x in a if not any(r.base <= int(x) and int(x) + nbytes <= r.base +
                                            r.size for r in self.regions)]
        if bad:
            near = min(((r.name, bad[0] - r.base, r.size) for r in self.regions),
                       key=lambda t: -t[1] if t[1] < 0 else max(0, t[1] - t[2]))
            self.faults.append(Fault(*where, "global", bad[0], len(bad), near))
        return None

    def check_shared(self, where, addrs, nbytes: int, lanes) -> bool:
        """Whether every selected thread's access lies in the block's shared memory
        (a fault is recorded otherwise)."""
        self.shared_accesses += 1
        a = addrs if lanes is None else addrs[lanes]
        if a.size == 0:
            return True
        out = (a.astype(np.int64) < 0) | (a + U64(nbytes) > U64(self.shared))
        if out.any():
            self.faults.append(Fault(*where, "shared", int(a[out][0]), int(out.sum())))
            return False
        return True

    def check_tile(self, where, operand: str, desc: int, mn: int, k: int, elem: int,
                   mn_major: bool) -> None:
        """A wgmma operand (mn x k elements of `elem` bytes) read through `desc`."""
        self.shared_accesses += 1
        lo, hi = tile_extent(desc, mn, k, elem, mn_major)
        if lo < 0 or hi > self.shared:
            self.faults.append(Fault(*where, f"wgmma {operand}", hi, 128))

    def read_global(self, region: Region, addrs, w: int, vec: int) -> list | None:
        """`vec` values of w bits at each thread's address in `region` (None: no bytes)."""
        data = self.data.get(region.name)
        if data is None:
            return None
        off, nb, out = (addrs - U64(region.base)).astype(np.int64), w // 8, []
        for j in range(vec):
            v = np.zeros(len(addrs), dtype=U64)
            for b in range(nb):
                v |= data[np.clip(off + j * nb + b, 0, len(data) - 1)].astype(U64) << U64(8 * b)
            out.append(v)
        return out

    def read_shared(self, addrs, w: int, vec: int, lanes) -> list | None:
        """Like `read_global` for shared memory; None unless every byte read is known."""
        nb, out = w // 8, []
        sel = slice(None) if lanes is None else lanes
        for j in range(vec):
            o = addrs.astype(np.int64) + j * nb
            v = np.zeros(len(addrs), dtype=U64)
            for b in range(nb):
                if not self.known[(o + b)[sel]].all():
                    return None
                v |= self.smem[o + b].astype(U64) << U64(8 * b)
            out.append(v)
        return out

    def write_shared(self, addrs, w: int, vec: int, vals, lanes) -> None:
        """Store `vec` values of w bits per selected thread (vals None: unknown data)."""
        self.shared_writes += 1
        nb = w // 8
        sel = slice(None) if lanes is None else lanes
        for j in range(vec):
            o = addrs.astype(np.int64)[sel] + j * nb
            for b in range(nb):
                if vals is None:
                    self.known[o + b] = False
                else:
                    self.smem[o + b] = ((vals[j][sel] >> U64(8 * b)) & U64(0xFF)).astype(
                        np.uint8)
                    self.known[o + b] = True


@functools.lru_cache(maxsize=4096)
def tile_extent(desc: int, mn: int, k: int, elem: int, mn_major: bool) -> tuple[int, int]:
    """[first, last + 1) byte offsets in shared memory of the 16-byte chunks one wgmma
    operand of mn rows (M or N) by k reads through matrix descriptor `desc`, K-major or,
    with mn_major, MN-major."""
    start = (desc & 0x3FFF) * 16
    lbo = ((desc >> 16) & 0x3FFF) * 16
    sbo = ((desc >> 32) & 0x3FFF) * 16
    swizzle = {0: 0, 1: 128, 2: 64, 3: 32}[(desc >> 62) & 3]
    width = swizzle or 16  # bytes of one row of a core-matrix group
    chunks = []
    if not mn_major:  # rows of the MN dimension, each k * elem bytes of K
        for r in range(mn):
            for c in range(k * elem // 16):
                chunks.append(start + r // 8 * sbo + r % 8 * width +
                              (c * 16 if swizzle else c * lbo))
    else:  # rows of the K dimension, each mn * elem bytes of MN
        per_row = max(1, width // 16)
        for r in range(k):
            for c in range(mn * elem // 16):
                chunks.append(start + r // 8 * sbo + r % 8 * width + c % per_row * 16 +
                              c // per_row * lbo)
    if swizzle:  # the swizzle permutes 16-byte chunks inside each `swizzle`-byte row
        span = {128: 7, 64: 3, 32: 1}[swizzle]
        chunks = [a ^ (((a >> 7) & span) << 4) for a in chunks]
    return min(chunks), max(chunks) + 16
