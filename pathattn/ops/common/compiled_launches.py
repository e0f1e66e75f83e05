"""The Triton ops' kernels compiled for a GPU and checked on a machine without one.

    with record_launches(capability=90) as launches:
        ...  # call an op on CPU tensors (its host code runs, no kernel does)
    reports = [memcheck(x) for x in launches]

Inside `record_launches`, every kernel launch of the Triton ops (they all go through
`triton_launch.launch_kernel`) is compiled by Triton's JIT for exactly its arguments, as
on a GPU of that compute capability (a stand-in for the CUDA driver names one), and
recorded as a `CompiledLaunch` (PTX, shared memory, warps, grid, the arguments' memory)
instead of being launched. Kernels then see the op's real block tables and strides; their
outputs stay unwritten, so only what the host computes itself (tables, slots, strides)
is real in later launches, which is all the addresses depend on. `memcheck` runs every
program of a launch in `ptx_emulator` and reports each access outside the launch's
tensors or its shared memory. The stand-in replaces Triton's active driver for the block:
use it where no GPU is in use (it is meant for CPU machines and tests).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .ptx_emulator import Emulator, Fault, Region
from .ptx_parse import entry_params
from .triton_launch import recording

__all__ = ["CompiledLaunch", "MemcheckReport", "record_launches", "memcheck"]


@dataclass(frozen=True)
class CompiledLaunch:
    """One kernel launch as compiled: kernel name, grid (3 dims), PTX, shared memory per
    program (bytes), num_warps, the launch's tensors as `Region`s (integer ones with their
    bytes) and the PTX parameter values (None for floats)."""

    name: str
    grid: tuple[int, int, int]
    ptx: str
    shared: int
    num_warps: int
    regions: tuple[Region, ...]
    params: dict


@dataclass(frozen=True)
class MemcheckReport:
    """`memcheck` of one launch: programs run, faults (`ptx_emulator.Fault`), accesses whose
    address could not be evaluated ((source line, opcode) per instruction), the number of
    global and shared accesses checked (instructions executed, all threads at once) and of
    PTX instructions executed."""

    name: str
    programs: int
    faults: tuple[Fault, ...]
    unknown: tuple[tuple[str, str], ...]
    global_accesses: int
    shared_accesses: int
    steps: int


class _StandIn:
    """What Triton's JIT asks the CUDA driver before it compiles: a device, a stream and
    the target."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def _region(name: str, t: torch.Tensor) -> Region:
    """The bytes a kernel may touch through tensor argument t, with their values for an
    integer tensor."""
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    n = t.element_size() * (1 + span) if t.numel() else 0
    data = None
    if not t.dtype.is_floating_point and t.dtype != torch.bool and n:
        off = t.storage_offset() * t.element_size()
        data = bytes(t.untyped_storage())[off:off + n]
    return Region(name, t.data_ptr(), n, data)


def _launch(kernel, grid, args: tuple, kwargs: dict) -> CompiledLaunch:
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    names = kernel.arg_names
    values = list(args) + [kwargs.get(n) for n in names[len(args):]]
    constants = {k[0] if isinstance(k, tuple) else k for k in compiled.src.constants}
    signature = list(compiled.src.signature.items())
    ptx = compiled.asm["ptx"]
    ptx_names = entry_params(ptx)
    params, regions, i = {}, [], 0
    for idx, (name, kind) in enumerate(signature):
        if kind == "constexpr" or idx in constants:
            continue
        v = values[idx]
        if isinstance(v, torch.Tensor):
            regions.append(_region(name, v))
            params[ptx_names[i]] = v.data_ptr()
        else:
            params[ptx_names[i]] = None if isinstance(v, float) else int(v)
        i += 1
    if len(ptx_names) - i > 2:  # beyond the arguments, only Triton's scratch pointers
        raise RuntimeError(f"{kernel.fn.__name__}: {len(ptx_names)} PTX parameters for {i} "
                           "arguments")
    params.update({n: 0 for n in ptx_names[i:]})
    g = tuple(grid) + (1,) * (3 - len(grid))
    return CompiledLaunch(kernel.fn.__name__, g, ptx, compiled.metadata.shared,
                          compiled.metadata.num_warps, tuple(regions), params)


@contextlib.contextmanager
def record_launches(capability: int = 90):
    """Yields the list of `CompiledLaunch` that the block's kernel launches append to;
    nothing is launched. capability: 90 (H100) or 80 (A100), the GPU compiled for."""
    from triton.runtime.driver import driver

    launches: list[CompiledLaunch] = []

    def recorder(kernel, grid):
        def call(*args, **kwargs):
            launches.append(_launch(kernel, grid, args, kwargs))
        return call

    previous = getattr(driver, "_active", None)
    driver.set_active(_StandIn(capability))
    try:
        with recording(recorder):
            yield launches
    finally:
        driver.set_active(previous)


def memcheck(launch: CompiledLaunch, programs=None) -> MemcheckReport:
    """Run `programs` ((x, y, z) program ids; default all of the grid) of `launch` in the
    PTX emulator."""
    em = Emulator(launch.ptx, launch.shared, launch.num_warps, launch.regions, launch.params)
    gx, gy, gz = launch.grid
    ids = programs if programs is not None else [(x, y, z) for z in range(gz)
                                                 for y in range(gy) for x in range(gx)]
    for c in ids:
        em.run(tuple(c), launch.grid)
    return MemcheckReport(launch.name, len(ids), tuple(em.faults), tuple(em.unknown.values()),
                          em.global_accesses, em.shared_accesses, em.steps)
