"""Launch configuration of the Triton kernels: block length, num_warps and num_stages.

A GPU gives each program (thread block) a fixed amount of shared memory: 227 KiB on H100
(sm_90), 163 KiB on A100 (sm_80), 99 KiB on the sm_86 / sm_89 cards. Triton stages `tl.dot`
operands and pipelined loads there, so a kernel's need grows with the block length BT, the
padded head dim BD, the dtype (on sm_90 the bfloat16 / float16 tensor-core path keeps its
operands in shared memory), num_stages (each extra stage double-buffers the loads of the
scans' loops) and, for the backward UT kernel, a loop over the query heads of a key head
(GQA). A kernel that needs more than the device has fails to launch.

`launch_config` picks the largest block length whose five kernels all fit the device, from
`SHARED_BYTES`: per architecture (sm_80 for compute capability 8.x, sm_90 for 9.0 and
above, measured on sm_90 only), the shared memory per program of the most demanding kernel,
measured by compiling every kernel ahead of time with Triton 3.9, with num_stages = 1, GQA
groups 1 and 2, and that of the forward scan with num_stages = 2 (it takes 2 when that fits
too; the other kernels gain nothing from pipelining and keep 1). All kernels run 4 warps.
`pathattn.ops.triton.fit.measure_shared_table` remeasures the table;
`python benchmarks/triton_fit.py` compiles the configurations picked and checks them (CI
does so for D in {64, 128, 256}).

Block length picked (float32 | bfloat16 / float16 inputs):

    padded D   H100 (sm_90, 227 KiB)   A100 (sm_80, 163 KiB)   sm_86 / sm_89 (99 KiB)
    16         64 | 64                 64 | 64                 64 | 64
    32         64 | 64                 64 | 64                 32 | 64
    64         64 | 64                 64 | 64                 32 | 32
    128        64 | 32                 32 | 32                 16 | 32
    256        32 | 32                 16 | 32                 16 | 16

The forward scan runs 2 stages in every cell. Head dims pad to the next power of two
(48 -> 64, 80 and 96 -> 128, 160 and 192 -> 256); packed sequences (cu_seqlens) run the same
kernels as dense batches. Without a CUDA device (the CPU interpreter) the H100 column is
used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KERNELS", "SHARED_BYTES", "LaunchConfig", "launch_config", "device_launch_config",
           "device_limits", "H100_SHARED", "A100_SHARED"]

KERNELS = ("ut_fwd", "fwd", "seg", "bwd", "ut_bwd")
H100_SHARED = 232448  # bytes per block (opt-in maximum), sm_90
A100_SHARED = 166912  # sm_80
_E_ROWS = 32  # rows of a segment product E the backward scan reads at a time

# architecture -> padded head dim BD -> block length BT -> shared bytes per program:
# (float32: peak over kernels, forward scan with 2 stages,
#  16-bit:  peak over kernels, forward scan with 2 stages)
SHARED_BYTES = {
    80: {
        16: {
            64: (98304, 40960, 77824, 24576),
            32: (28672, 12416, 24576, 8192),
            16: (10240, 5120, 8192, 3072),
        },
        32: {
            64: (122880, 49408, 90112, 32768),
            32: (36864, 20480, 32768, 12288),
            16: (15360, 10240, 13312, 8192),
        },
        64: {
            64: (155648, 81920, 131072, 49152),
            32: (61440, 40960, 49152, 32768),
            16: (29696, 20480, 21504, 16384),
        },
        128: {
            64: (229376, 163840, 188416, 131072),
            32: (106496, 81920, 81920, 65536),
            16: (52224, 40960, 40960, 32768),
        },
        256: {
            64: (425984, 327680, 319488, 262144),
            32: (204800, 163840, 147456, 131072),
            16: (101376, 81920, 81920, 65536),
        },
    },
    90: {
        16: {
            64: (98304, 40960, 126976, 53248),
            32: (28672, 12416, 24576, 8192),
            16: (10240, 5120, 8192, 3072),
        },
        32: {
            64: (122880, 49408, 155648, 90112),
            32: (36864, 20480, 32768, 12288),
            16: (14336, 10240, 13312, 8192),
        },
        64: {
            64: (155648, 81920, 212992, 163840),
            32: (61440, 40960, 49152, 32768),
            16: (26624, 20480, 21504, 16384),
        },
        128: {
            64: (229376, 163840, 344064, 311296),
            32: (110592, 81920, 81920, 65536),
            16: (58368, 40960, 40960, 32768),
        },
        256: {
            64: (425984, 327680, 606208, 606208),
            32: (204800, 163840, 147456, 131072),
            16: (103424, 81920, 81920, 65536),
        },
    },
}


@dataclass(frozen=True)
class LaunchConfig:
    """Block length BT, the shared-memory limit it was chosen for (bytes), num_warps and
    num_stages per kernel as (kernel name, value) pairs (kernels not named take 4 warps and 1
    stage), and BK, the rows of a segment product the backward scan reads at a time."""

    BT: int
    shared_limit: int
    warps: tuple = ()
    stages: tuple = ()
    BK: int = _E_ROWS

    def launch(self, kernel: str) -> tuple[int, int]:
        """(num_warps, num_stages) of `kernel`."""
        return dict(self.warps).get(kernel, 4), dict(self.stages).get(kernel, 1)

    def launch_kwargs(self, kernel: str) -> dict:
        """num_warps / num_stages keyword arguments of a kernel launch."""
        warps, stages = self.launch(kernel)
        return {"num_warps": warps, "num_stages": stages}

    def e_rows(self, BD: int) -> int:
        """Rows of E read at a time for padded head dim BD (all of them when BD <= BK)."""
        return min(BD, self.BK)


def device_limits(device: torch.device) -> tuple[int | None, tuple[int, int]]:
    """(shared memory per block in bytes, opt-in maximum; compute capability) of a CUDA
    device, (None, (9, 0)) for any other device (the CPU interpreter has no limit)."""
    if device.type != "cuda":
        return None, (9, 0)
    props = torch.cuda.get_device_properties(device)
    limit = int(getattr(props, "shared_memory_per_block_optin", 0)
                or props.shared_memory_per_block)
    return limit, (props.major, props.minor)


def _padded(D: int) -> int:
    return max(16, 1 << (max(D, 1) - 1).bit_length())


def launch_config(D: int, Dv: int, dtype: torch.dtype, shared_limit: int | None,
                  block_size: int | None = None,
                  capability: tuple[int, int] = (9, 0)) -> LaunchConfig:
    """The launch configuration for head dims D (q, k, w) and Dv (v), inputs of `dtype`
    (float32, bfloat16 or float16), `shared_limit` bytes of shared memory per block (None:
    no limit, the interpreter; block lengths are then chosen as for an H100) and a device of
    compute `capability` (major, minor).

    block_size None: the largest BT in (64, 32, 16) that fits (see the module docstring);
    an int: that BT, or a ValueError when its kernels do not fit (on a GPU, block sizes
    above 64 are not in the table and are refused). Raises a ValueError when no block
    length fits or the head dim exceeds 256.
    """
    BD = _padded(max(D, Dv))
    if BD > 256:
        raise ValueError(f"backend='triton' supports head dims up to 256, got {max(D, Dv)}")
    interpreter = shared_limit is None
    shared_limit = H100_SHARED if interpreter else shared_limit
    table = SHARED_BYTES[90 if interpreter or capability[0] >= 9 else 80][BD]
    col = 0 if dtype == torch.float32 else 2
    fitting = [bt for bt in (64, 32, 16) if table[bt][col] <= shared_limit]
    largest = fitting[0] if fitting else None
    where = f"at head dim {max(D, Dv)} ({dtype}) with {shared_limit} bytes of shared memory"
    if block_size is None:
        if largest is None:
            raise ValueError(f"backend='triton': no block length fits {where} per block; "
                             "use backend='torch' or bfloat16 / float16 inputs")
        block_size = largest
    elif not interpreter and block_size not in fitting:
        need = f"needs {table[block_size][col]} bytes" if block_size in table else "is untested"
        raise ValueError(f"block_size={block_size} {need} {where} per block; largest that "
                         f"fits: {largest}")
    fwd_stages = 2 if block_size in table and table[block_size][col + 1] <= shared_limit else 1
    return LaunchConfig(block_size, shared_limit, stages=(("fwd", fwd_stages),))


def device_launch_config(D: int, Dv: int, dtype: torch.dtype, device: torch.device,
                         block_size: int | None = None) -> LaunchConfig:
    """`launch_config` for the shared memory and compute capability of `device`."""
    limit, capability = device_limits(device)
    return launch_config(D, Dv, dtype, limit, block_size, capability)
