"""What each registered backend of the op supports here: `BackendSpec`, asked from the
backend itself (`Backend.refuses` on a probe tensor of each dtype and device), and `Limits`,
the block sizes and head dims it accepts, which the registry does not describe (`LIMITS`; a
backend without an entry gets the op's documented range: any block size in [1, 1024], any
head dim). The conformance suite and the fault tests parametrize by these.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pathattn import path_attn
from pathattn.ops.common.validation import MAX_BLOCK_SIZE
from pathattn.ops.path.backends import backend_names, get_backend

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LOW_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class Limits:
    """Block sizes and head dims a backend accepts.

    block_sizes: the block sizes the suite runs (besides None, the backend's default), a
        sample of those accepted: the smallest one of at least 16 is the suite's block size
        (short sequences then span several blocks).
    accepts_block_size: C -> whether `block_size=C` is accepted (others: ValueError).
    max_head_dim: the largest D / Dv (larger: ValueError), None for no limit.
    """

    block_sizes: tuple[int, ...]
    accepts_block_size: Callable[[int], bool]
    max_head_dim: int | None = None


# the op's documented range (`path_attn`'s block_size); unusual sizes on purpose: 1, 5, 24
# and 100 divide neither the sequence lengths nor each other
BLOCKWISE = Limits((1, 5, 16, 24, 100, 128), lambda c: 1 <= c <= MAX_BLOCK_SIZE)
LIMITS = {
    "triton": Limits((16, 32, 64, 128), lambda c: c in (16, 32, 64, 128), max_head_dim=256),
    # fla ignores block_size (it picks its own chunks); head dims 16, 32, 64, 128 only, so
    # cases with other head dims fail for it where fla-core and a GPU are present
    "fla": Limits((64,), lambda c: 1 <= c <= MAX_BLOCK_SIZE, max_head_dim=128),
}


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend as the suite sees it.

    device: where it runs (the first of cpu, cuda it takes float32 tensors on).
    dtypes: the input dtypes it takes on that device.
    skip: why it cannot run here, or None.
    """

    name: str
    device: torch.device | None
    dtypes: tuple[torch.dtype, ...]
    limits: Limits
    skip: str | None

    @property
    def block_size(self) -> int:
        """The suite's block size: the smallest listed one of at least 16."""
        sizes = self.limits.block_sizes
        return min((c for c in sizes if c >= 16), default=max(sizes))

    def takes(self, dtype: torch.dtype) -> bool:
        return dtype in self.dtypes

    def op(self, *inputs, cu_seqlens=None, **kwargs) -> torch.Tensor:
        """path_attn(*inputs, backend=name) on the backend's device, output on the CPU
        (differentiable: gradients reach the CPU leaves)."""
        xs = tuple(None if x is None else x.to(self.device) for x in inputs)
        cu = None if cu_seqlens is None else cu_seqlens.to(self.device)
        return path_attn(*xs, cu_seqlens=cu, backend=self.name, **kwargs).cpu()

    def __str__(self) -> str:
        return self.name


def _devices() -> list[torch.device]:
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


@functools.cache
def backend_spec(name: str) -> BackendSpec:
    """What backend `name` takes here, asked from its `refuses`."""
    impl = get_backend(name)
    limits = LIMITS.get(name, BLOCKWISE)
    reasons = []
    for device in _devices():
        probe = torch.empty(1, 1, 1, 16, device=device)  # [B, T, HQ, D]
        why = impl.refuses(probe)
        if why is None:
            dtypes = tuple(dt for dt in DTYPES if impl.refuses(probe.to(dt)) is None)
            return BackendSpec(name, device, dtypes, limits, None)
        reasons.append(f"{device}: {why}")
    return BackendSpec(name, None, (), limits,
                       f"backend {name!r} cannot run here ({'; '.join(reasons)})")


def backend_specs() -> list[BackendSpec]:
    """One spec per registered backend, in registration order: the suite's parameters."""
    return [backend_spec(name) for name in backend_names()]
