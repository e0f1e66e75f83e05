"""Launch configuration of the Triton kernels: block length, num_warps and num_stages.

`launch_config` picks the largest block length whose five kernels fit the device's shared
memory, from `SHARED_BYTES` (per architecture, measured by compiling every kernel ahead of
time; `fit.measure_shared_table` remeasures it), and caps the UT tile at
`MAX_REFLECTION_TILE` rows with several reflections per token. Without a CUDA device the
H100 figures are used. The tables of block lengths picked, and why: docs/ops.md,
"Triton launch configuration".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KERNELS", "SHARED_BYTES", "SHARED_BYTES_REFLECTIONS", "LaunchConfig",
           "launch_config", "device_launch_config", "device_limits", "block_lengths",
           "padded_reflections", "H100_SHARED", "A100_SHARED", "MAX_REFLECTION_TILE"]

KERNELS = ("ut_fwd", "fwd", "seg", "bwd", "ut_bwd")
H100_SHARED = 232448  # bytes per block (opt-in maximum), sm_90
A100_SHARED = 166912  # sm_80
_E_ROWS = 32  # rows of a segment product E the backward scan reads at a time
MAX_REFLECTION_TILE = 64  # rows of a block's reflection tile the default block length allows

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


# R > 1 reflections per token: R padded to a power of two RP -> the layout of SHARED_BYTES,
# for the block lengths the default may pick (`block_lengths`), measured as SHARED_BYTES
SHARED_BYTES_REFLECTIONS = {
    2: {
        80: {
            16: {
                32: (55296, 24576, 36864, 14336),
                16: (19456, 8192, 10240, 5120),
            },
            32: {
                32: (73728, 32768, 40960, 20480),
                16: (21504, 15424, 16384, 11264),
            },
            64: {
                32: (94208, 61568, 61440, 45056),
                16: (40960, 29696, 26624, 22528),
            },
            128: {
                32: (143360, 118784, 102400, 90112),
                16: (68608, 58432, 47104, 45056),
            },
            256: {
                32: (274432, 233600, 184320, 180224),
                16: (134144, 115776, 90112, 90112),
            },
        },
        90: {
            16: {
                32: (55296, 24576, 71680, 14336),
                16: (19456, 8192, 10240, 5120),
            },
            32: {
                32: (73728, 32768, 94208, 20480),
                16: (21504, 15424, 16384, 11264),
            },
            64: {
                32: (94208, 61568, 139264, 45056),
                16: (41984, 29696, 26624, 22528),
            },
            128: {
                32: (143360, 118784, 229376, 90112),
                16: (74752, 58432, 47104, 45056),
            },
            256: {
                32: (274432, 233600, 409600, 180224),
                16: (136192, 115776, 90112, 90112),
            },
        },
    },
    4: {
        80: {
            16: {
                16: (41984, 14336, 32768, 9216),
            },
            32: {
                16: (53248, 24576, 32768, 19456),
            },
            64: {
                16: (74752, 46080, 36864, 34816),
            },
            128: {
                16: (115712, 91200, 65536, 69632),
            },
            256: {
                16: (205824, 181312, 124928, 139264),
            },
        },
        90: {
            16: {
                16: (41984, 14336, 53248, 9216),
            },
            32: {
                16: (53248, 24576, 71680, 19456),
            },
            64: {
                16: (74752, 46080, 99328, 34816),
            },
            128: {
                16: (115712, 91200, 168960, 69632),
            },
            256: {
                16: (205824, 181312, 321536, 139264),
            },
        },
    },
}


@dataclass(frozen=True)
class LaunchConfig:
    """Block length BT, the shared-memory limit it was chosen for (bytes), num_warps and
    num_stages per kernel as (kernel name, value) pairs (kernels not named take 4 warps and 1
    stage), BK, the rows of a segment product the backward scan reads at a time, and R, the
    reflections per token it was chosen for."""

    BT: int
    shared_limit: int
    warps: tuple = ()
    stages: tuple = ()
    BK: int = _E_ROWS
    R: int = 1

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


def padded_reflections(R: int) -> int:
    """R rounded up to a power of two: the kernels of R reflections per token are those of
    this many (a block's BT * R reflections fill a tile of BT * padded_reflections(R) rows)."""
    return 1 << (max(R, 1) - 1).bit_length()


def block_lengths(R: int = 1) -> tuple[int, ...]:
    """Block lengths the default may pick for R reflections per token, longest first: every
    BT in (64, 32, 16) for R = 1; for R > 1 those whose tile of reflections has at most
    MAX_REFLECTION_TILE rows (16 when none has), as the UT kernels' triangular solve over
    the tile costs O(tile^4) per block and its [tile, tile] matrices live in registers."""
    RP = padded_reflections(R)
    if RP == 1:
        return (64, 32, 16)
    return tuple(bt for bt in (64, 32, 16) if bt * RP <= MAX_REFLECTION_TILE) or (16,)


def _shared_table(arch: int, BD: int, R: int) -> dict:
    """Block length -> shared bytes (`SHARED_BYTES` layout) for R reflections per token."""
    RP = padded_reflections(R)
    if RP == 1:
        return SHARED_BYTES[arch][BD]
    return SHARED_BYTES_REFLECTIONS.get(RP, {}).get(arch, {}).get(BD, {})


def launch_config(D: int, Dv: int, dtype: torch.dtype, shared_limit: int | None,
                  block_size: int | None = None,
                  capability: tuple[int, int] = (9, 0), reflections: int = 1) -> LaunchConfig:
    """The launch configuration for head dims D (q, k, w) and Dv (v), inputs of `dtype`
    (float32, bfloat16 or float16), `shared_limit` bytes of shared memory per block (None:
    no limit, the interpreter; block lengths are then chosen as for an H100), a device of
    compute `capability` (major, minor) and `reflections` (R) reflections per token.

    block_size None: the largest BT of `block_lengths(R)` that fits (see the module
    docstring); an int: that BT, or a ValueError when its kernels do not fit (on a GPU,
    block sizes not in the tables are not measured and are refused). Raises a ValueError
    when no block length fits or the head dim exceeds 256.
    """
    BD = _padded(max(D, Dv))
    if BD > 256:
        raise ValueError(f"backend='triton' supports head dims up to 256, got {max(D, Dv)}")
    interpreter = shared_limit is None
    shared_limit = H100_SHARED if interpreter else shared_limit
    table = _shared_table(90 if interpreter or capability[0] >= 9 else 80, BD, reflections)
    col = 0 if dtype == torch.float32 else 2
    if not interpreter and not table:
        most = max(SHARED_BYTES_REFLECTIONS, default=1)
        raise ValueError(f"backend='triton' runs at most {most} reflections per token on a GPU "
                         f"(the measured kernels), got R={reflections}; backend='torch' "
                         "takes any number")

    def fits(bt: int) -> bool:  # the interpreter runs what the tables do not list
        return table[bt][col] <= shared_limit if bt in table else interpreter

    fitting = [bt for bt in block_lengths(reflections) if fits(bt)]
    if interpreter and not fitting:  # no limit: the shortest block, as on a GPU that fits it
        fitting = list(block_lengths(reflections)[-1:])
    largest = fitting[0] if fitting else None
    where = f"at head dim {max(D, Dv)} ({dtype}) with {shared_limit} bytes of shared memory"
    if reflections > 1:
        where += f" and R={reflections} reflections per token"
    if block_size is None:
        if largest is None:
            other = " or bfloat16 / float16 inputs" if dtype == torch.float32 else ""
            raise ValueError(f"backend='triton': no block length fits {where} per block; "
                             f"use backend='torch'{other}")
        block_size = largest
    elif not interpreter and not fits(block_size):
        need = f"needs {table[block_size][col]} bytes" if block_size in table else "is untested"
        raise ValueError(f"block_size={block_size} {need} {where} per block; largest that "
                         f"fits: {largest}")
    fwd_stages = 2 if block_size in table and table[block_size][col + 1] <= shared_limit else 1
    return LaunchConfig(block_size, shared_limit, stages=(("fwd", fwd_stages),),
                        R=reflections)


def device_launch_config(D: int, Dv: int, dtype: torch.dtype, device: torch.device,
                         block_size: int | None = None, reflections: int = 1) -> LaunchConfig:
    """`launch_config` for the shared memory and compute capability of `device`."""
    limit, capability = device_limits(device)
    return launch_config(D, Dv, dtype, limit, block_size, capability, reflections)
