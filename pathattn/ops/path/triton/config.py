"""Launch configuration of the Triton kernels: block length, num_warps and num_stages.

`launch_config` picks the largest block length whose eleven kernels fit the device's shared
memory, from `SHARED_BYTES` (per architecture, measured by compiling every kernel ahead of
time; `fit.measure_shared_table` remeasures it), at most `register_cap` (where longer
blocks spill registers), and caps the UT tile at `MAX_REFLECTION_TILE` rows with several
reflections per token. Without a CUDA device the
H100 figures are used. The tables of block lengths picked, and why: docs/ops.md,
"Triton launch configuration".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["KERNELS", "SHARED_BYTES", "SHARED_BYTES_REFLECTIONS", "LaunchConfig",
           "launch_config", "device_launch_config", "device_limits", "block_lengths",
           "padded_reflections", "H100_SHARED", "A100_SHARED", "MAX_REFLECTION_TILE",
           "KV_TILES", "KV_WARPS", "kv_tiles", "register_cap", "PIPELINED", "PIPE_STAGES",
           "STEPPED", "KEY_STEPS", "step_table", "SEG_BWD_ROWS", "SEG_BWD_WIDE", "SEG_WALK",
           "TWO_WARPS",
           "WALK_HOIST", "OWN_HOIST", "pipe_table",
           "MAX_REGISTERS", "MAXNREG_KERNELS", "MAXNREG_ARCH", "UT_KERNELS",
           "UT_FOUR_WARPS",
           "UT_FOUR_WARPS_R1", "ut_warps",
           "device_settings"]

KERNELS = ("ut_fwd", "seg", "fwd", "pi", "bwd", "bwd_kv", "seg_bwd", "ut_bwd_q", "ut_bwd_dk",
           "ut_bwd", "ut_bwd_inv")
H100_SHARED = 232448  # bytes per block (opt-in maximum), sm_90
A100_SHARED = 166912  # sm_80
_E_ROWS = 32  # rows of a segment product read at a time past BD = 64 (`LaunchConfig.e_rows`)
MAX_REFLECTION_TILE = 64  # rows of a block's reflection tile the default block length allows

# architecture -> padded head dim BD -> block length BT -> shared bytes per program:
# (float32: peak over kernels, forward scan with 2 stages,
#  16-bit:  peak over kernels, forward scan with 2 stages)
# Upper bounds: an entry a kernel has grown past is raised to the fresh measurement
# (`triton_fit.py --table`), one above it is left (2026-12-02: sm_90 D 128 bf16 peaks at
# BT 16 and 32, the key kernel's 128-key tiles; sm_80 D 128 and sm_90 D 256 bf16 at BT 16,
# their 32-key tiles; four BT 16 entries at D 64 found below)
SHARED_BYTES = {
    80: {
        16: {
            64: (65536, 16648, 77824, 16384),
            32: (16384, 8328, 22528, 6144),
            16: (4096, 4168, 7168, 2048),
        },
        32: {
            64: (65536, 33032, 90112, 24576),
            32: (16384, 16520, 28672, 12288),
            16: (12288, 12360, 10240, 5120),
        },
        64: {
            64: (65536, 65800, 114688, 49152),
            32: (40960, 49288, 40960, 22800),
            16: (40960, 24648, 16384, 10896),
        },
        128: {
            64: (147456, 196872, 163840, 81920),
            32: (81920, 98440, 65536, 40960),
            16: (49152, 49224, 40960, 20480),
        },
        256: {
            64: (294912, 393480, 262144, 163840),
            32: (163840, 196744, 114688, 81920),
            16: (98304, 98376, 53248, 40960),
        },
    },
    90: {
        16: {
            64: (73728, 32768, 81920, 43008),
            32: (16384, 8328, 22528, 6144),
            16: (4096, 4168, 7168, 2048),
        },
        32: {
            64: (81920, 49416, 114688, 69632),
            32: (16384, 16520, 28672, 12288),
            16: (12288, 12360, 10240, 5120),
        },
        64: {
            64: (122880, 98568, 180224, 122880),
            32: (32768, 49288, 40960, 20480),
            16: (32768, 24648, 24576, 10240),
        },
        128: {
            64: (204800, 196872, 311296, 229376),
            32: (81920, 98440, 98304, 83456),  # fwd: 4 key blocks a step
            16: (49152, 49224, 98304, 20480),
        },
        256: {
            64: (401408, 393480, 573440, 442368),
            32: (163840, 196744, 114688, 81920),
            16: (98304, 98376, 81920, 40960),
        },
    },
}


# R > 1 reflections per token: R padded to a power of two RP -> the layout of SHARED_BYTES,
# for the block lengths the default may pick (`block_lengths`), measured as SHARED_BYTES
SHARED_BYTES_REFLECTIONS = {
    2: {
        80: {
            16: {
                32: (65536, 12424, 32768, 8192),
                16: (16384, 6216, 9216, 3072),
            },
            32: {
                32: (65536, 24712, 36864, 16384),
                16: (12288, 16456, 13312, 7168),
            },
            64: {
                32: (40960, 65672, 53248, 28672),
                16: (40960, 32840, 21504, 14336),
            },
            128: {
                32: (98304, 131208, 86016, 57344),
                16: (49152, 65608, 40960, 28672),
            },
            256: {
                32: (163840, 262280, 151552, 114688),
                16: (98304, 131144, 70656, 57344),
            },
        },
        90: {
            16: {
                32: (65536, 12424, 57344, 8192),
                16: (16384, 6216, 9216, 3072),
            },
            32: {
                32: (65536, 24712, 65536, 16384),
                16: (12288, 16456, 13312, 7168),
            },
            64: {
                32: (65536, 65672, 81920, 28672),
                16: (32768, 32840, 24576, 14336),
            },
            128: {
                32: (81920, 131208, 122880, 57344),
                16: (49152, 65608, 98304, 28672),
            },
            256: {
                32: (163840, 262280, 221184, 114688),
                16: (98304, 131144, 81920, 57344),
            },
        },
    },
    4: {
        80: {
            16: {
                16: (65536, 10312, 32768, 5120),
            },
            32: {
                16: (32768, 28744, 32768, 12288),
            },
            64: {
                16: (40960, 49224, 32768, 22528),
            },
            128: {
                16: (98304, 98376, 56320, 45056),
            },
            256: {
                16: (163840, 196680, 105472, 90112),
            },
        },
        90: {
            16: {
                16: (65536, 10312, 57344, 5120),
            },
            32: {
                16: (65536, 28744, 65536, 12288),
            },
            64: {
                16: (65536, 49224, 81920, 22528),
            },
            128: {
                16: (65536, 98376, 114688, 45056),
            },
            256: {
                16: (131072, 196680, 200704, 90112),
            },
        },
    },
}


# (architecture, padded head dim, 16-bit inputs) -> (BKT, BQ) of the backward's key-parallel
# kernel: keys per program and queries per step, each a divisor of the block length or a
# multiple of it (several whole blocks of one segment: `bwd_kv.py`). At 4 warps, unless
# KV_WARPS says otherwise: the largest tiles whose kernel keeps 0 spills, or the fewest
# (compiled ahead of time; 8 warps spill less but leave one block per SM). Head dims not
# listed take whole blocks. sm_90, D 128, bf16: 128 keys (four 32-token blocks) by 64
# queries at 8 warps, wgmma with 64-row slices (m64n64 and m64n128) instead of mma.sync:
# per key-query pair of the query steps 0.53-0.58x the instructions of whole 32-token
# blocks at 4 warps, with 1,248-1,420 B of spills, 0-9 spill loads / stores per step
# (Triton 3.6 and 3.9, gates on and off; `benchmarks/static_vs_fla.py`); one block per SM.
# sm_80, D 128, bf16: whole 32-token blocks, 0-52 B of spills and none in the loops (K'
# read from memory), 0.42-0.44x the instructions per pair of 16 x 16 tiles. sm_90, D 256,
# bf16: whole 32-token blocks at 8 warps (mma.sync), no spills, 0.61-0.64x the
# instructions per pair of 16 x 16 at 4 warps; at 4 warps they spill 17 per step.
KV_TILES = {
    (90, 64, True): (64, 64), (90, 128, True): (128, 64), (90, 256, True): (32, 32),
    (90, 64, False): (16, 32), (90, 128, False): (16, 16), (90, 256, False): (16, 16),
    (80, 64, True): (32, 32), (80, 128, True): (32, 32), (80, 256, True): (16, 16),
    (80, 64, False): (32, 16), (80, 128, False): (16, 16), (80, 256, False): (16, 16),
}
# (architecture, padded head dim, 16-bit inputs) -> num_warps of the key-parallel kernel
# where not 4 (`KV_TILES`)
KV_WARPS = {(90, 128, True): 8, (90, 256, True): 8}


# kernels whose loop over earlier segments' blocks (the forward's and the query kernel's
# plain-attention blocks, the key kernel's query steps) takes its own pipeline depth, the
# compile-time argument PIPE (`LaunchConfig.pipe_stages`)
PIPELINED = ("fwd", "bwd", "bwd_kv")
# (architecture, padded head dim) -> kernel -> PIPE for 16-bit inputs, where it differs from
# the kernel's num_stages. Chosen ahead of time: the depth with no spill traffic in loops
# and two resident blocks per SM (`benchmarks/triton_fit.py --report --loops`);
# `benchmarks/gpu_check.py`'s "pipelining" section times the alternatives.
PIPE_STAGES = {(80, 64): {"fwd": 3}}
# kernels whose loop over earlier segments' blocks (the forward's, the query kernel's walk)
# meets KSTEP blocks a step, the compile-time argument KSTEP (`LaunchConfig.key_steps`;
# the last SEG % KSTEP blocks of a segment one at a time)
STEPPED = ("fwd", "bwd")
# (architecture, padded head dim, block length) -> kernel -> KSTEP for 16-bit inputs and
# one reflection per token, where not 1: on sm_90 at D = 128 with the default 32-token
# blocks (mma.sync), chosen ahead of time by the instructions `benchmarks/static_vs_fla.py`
# counts (per block of the walk, Triton 3.9 [3.6]: forward 332 [354] -> 176 [179], query
# kernel 336 [356] -> 290 [311]; fwd 4 / bwd 4 spill more and issue no fewer). With wgmma
# (D = 64) a step of two blocks would put an m64n128 product beside m64n64 ones
# (`test_compiled.py`, one wgmma width); with R > 1 (16-token blocks) four blocks spill.
KEY_STEPS = {(90, 128, 32): {"fwd": 4, "bwd": 2}}
# architecture -> rows of a segment's products E per program of the segment backward
# (`segments.segment_grads`), where not min(BD, BT) (and at most BT): at 64 rows on sm_80
# it spills 5.6 KB per thread (1,103 spill loads / stores per block at D = 64); at 32
# rows, 1.6 KB (302 per block, two programs per block)
SEG_BWD_ROWS = {80: 32}
# (architecture, padded head dim, 16-bit inputs) -> (rows of E per program, num_warps) of
# the segment backward where they differ from `SEG_BWD_ROWS` and 4 warps. sm_90, D 128,
# bf16: 64 rows at 8 warps, no spills (Triton 3.6 and 3.9), 0.75-0.77x the instructions
# per block of 32 rows at 4 warps (which spill 0-144 B, 19 spill loads / stores per block
# with Triton 3.9; `benchmarks/static_vs_fla.py`)
SEG_BWD_WIDE = {(90, 128, True): (64, 8)}
# (architecture, padded head dim, 16-bit inputs) where the segment keys walk each segment
# (`segments._seg_kernel` WALK: one transition product per block, against sqrt(blocks) / 2
# per block in the per-block form; D 128, T 8192: 9.97 -> 2.91 M instructions per head,
# `benchmarks/static_vs_fla.py`). The walk uses each E in the step that forms it, so its
# loop carries E in one layout (sm_90, D 128, bf16, Triton 3.9 [3.6]: 660 [680] -> 510
# [515] instructions per block and warp, 97 [86] -> 0 spill loads / stores). sm_80 at D 64
# and 128 (bf16): 465 and 540 instructions per block, against 248 and 228 per later block
# of the segment in the per-block form (sqrt(blocks) / 2 of them on average). Elsewhere
# the walk's loop holds more than the per-block form: at D = 256 it spills 1.7 KB (262
# spill loads / stores per block; the per-block form none), float32 inputs at D 64 take
# 2,372 instructions per block against 688 per later block (and spilled 5-17 KB per
# thread before the walk carried one layout; without maxnreg ptxas fell back to 32
# registers).
SEG_WALK = {(90, 64, True), (90, 128, True), (80, 64, True), (80, 128, True)}
# (architecture, padded head dim, 16-bit inputs, block length) -> kernels that take 2 warps
# instead of 4. With 32- or 16-row tiles Triton lays chained products out with 4 warps along
# the rows (warpsPerCTA [4, 1]) or columns, so that two warps repeat the other two's work
# (`inspect_kernels.repeated_products`); 2 warps do it once. Per block of the loop, bf16,
# gates, SASS instructions x warps, Triton 3.9 [3.6]:
# - the segment keys (`segments._seg_kernel`, its walk; 32 or 16 rows of E per program):
#   D 128 (32-token blocks) sm_90 510 x 4 [515 x 4] -> 641 x 2 [644 x 2], sm_80 540 x 4 ->
#   664 x 2 [679 x 2]; R = 2: D 64 (32-token blocks) sm_90 378 x 4 -> 481 x 2, sm_80 386 x
#   4 -> 492 x 2, D 128 (16) sm_90 439 x 4 -> 545 x 2, sm_80 446 x 4 -> 538 x 2; D 64 with
#   32-token blocks and R = 1 sm_90 287 x 4 -> 364 x 2, sm_80 301 x 4 -> 375 x 2. No spills
#   at 2 warps but 120 B at D 128 R 2 on sm_90 (4 spill loads / stores per block; 40 B at 4
#   warps); 1 warp spills everywhere. At D = 256 (the per-block form) 2 warps spill 2.7 KB.
# - the forward at D 128 with 16-token blocks (R = 2), its [16, 16] logits: walk over
#   earlier segments sm_90 206 x 4 [207 x 4] -> 243 x 2 [256 x 2], sm_80 192 x 4 -> 231 x
#   2, own segment sm_90 342 x 4 -> 449 x 2, sm_80 338 x 4 -> 457 x 2; no spills at 2 warps
#   (sm_80 with Triton 3.6: 16 B at 4). The query kernel at 2 warps spills 0.6-4 KB.
TWO_WARPS = {(a, BD, True, BT): kernels for a in (90, 80)
             for BD, BT, kernels in ((64, 32, ("seg",)), (128, 32, ("seg",)),
                                     (128, 16, ("seg", "fwd")))}
# (architecture, padded head dim, 16-bit inputs) where the query kernel's walk over earlier
# segments' blocks loads keys and values through loop-invariant offsets (`bwd._bwd_kernel`
# HOIST, `_common.load_block`: one address per block instead of one per element), as the
# forward does everywhere. bf16, gates on / off, per block of the walk (SASS, Triton 3.9
# [3.6]): sm_90 D 64 464 [451] -> 439 [413] and 356 -> 321 instructions, sm_80 D 64 599 ->
# 564 and 503 -> 463, no spill loads / stores in the walk either way. Elsewhere the held
# offsets cost more than they save: sm_90 D 128 579 -> 505 instructions but 5 -> 18 spill
# loads / stores per step (33 -> 48 per segment crossed); float32 at D 64 no fewer
# instructions and more spills.
WALK_HOIST = {(90, 64, True), (80, 64, True)}
# the same for the query kernel's loop over its own segment's blocks (keys, values and
# reflections: `bwd._bwd_kernel` HOIST_OWN). bf16, per block of that loop, SASS instructions
# / spill loads and stores, Triton 3.9 [3.6]: sm_90 D 64 1,650 / 11 -> 1,583 / 7 with gates,
# 1,410 / 14 -> 1,349 / 18 without; sm_90 D 128 1,586 / 62 -> 1,563 / 56 [1,669 / 24 ->
# 1,590 / 2] with gates, 1,416 / 10 -> 1,398 / 6 without. On sm_80 at D 64 the walk's
# blocks cost 22-24 instructions more (599 -> 586 with gates), more than the own loop saves
# over a long sequence; float32 changes little either way.
OWN_HOIST = {(90, 64, True), (90, 128, True)}
# the UT transform's kernels: one program per block and head, no loop, and with TF32 /
# 3xTF32 operands held in registers. 8 warps halve each thread's share of their tiles and
# spill less than 4 (compiled ahead of time with Triton 3.6 and 3.9: sm_90, D 128, bf16,
# ut_bwd 600 -> 120 B; float32, D 64, ut_bwd_q 1,972 -> 800 B), except where
# UT_FOUR_WARPS lists a kernel: (architecture, padded head dim, 16-bit inputs, rows of the
# UT tile BTR = BT * R rounded up to a power of two) -> kernels that keep 4 warps. sm_90,
# D 64, bf16: ut_fwd spills 0 B at 4 warps, 392 B at 8, ut_bwd 0 B and 88 B; ut_bwd_q,
# ut_bwd_dk and ut_bwd_inv issue 0.53-0.67x the warp-instructions of 8 per program (R 1
# and 2, Triton 3.6 and 3.9; a program's work is the same, 8 warps repeat its index and
# address arithmetic) with no spills (ut_bwd_q at R = 2: 128 B). sm_80, D 64, bf16: every UT
# kernel spills at either count, and 4 warps issue 0.51-0.72x the warp-instructions of 8
# with at most as many spill loads / stores per program (ut_fwd at R = 1: 8,840 x 4
# against 8,120 x 8 instructions, 530 x 4 against 357 x 8 of them spill operations).
# sm_80, D 128, bf16, BTR 32 (R 1 and 2): every UT kernel at 0.57-0.70x the
# warp-instructions of 8 (Triton 3.9), with 0-360 B of spills (0-80 B at R = 2).
# sm_80, D 256, float32, BTR 64: ut_bwd_q and ut_bwd need more shared memory at 8 warps
# than an A100 has.
# sm_90, D 128, bf16, BTR 32 (R 1 and 2): at 4 warps ut_bwd_q, ut_bwd_dk and ut_bwd_inv
# issue 0.57-0.73x the instructions of 8 (per block, Triton 3.6 and 3.9,
# `benchmarks/static_vs_fla.py`), with 0-112 B of spills at R = 1 (none at R = 2; these
# kernels have no loop); ut_bwd 0.59-0.63x (R 1: 2,672 x 4 against 2,120 x 8 warp-
# instructions, Triton 3.9; 2,640 x 4 against 2,104 x 8 with 3.6), with 328-600 B of
# spills, 72-136 spill loads / stores per program against 30-38 at 8. UT_FOUR_WARPS_R1: the
# same, with one reflection per token only: sm_90, D 128, bf16, ut_fwd at 4 warps issues
# 0.60-0.61x the instructions of 8 with 72-80 B of spills (40 B at 8); with R = 2 (16-token
# blocks) it spills 56 B at 4 warps and none at 8.
UT_KERNELS = ("ut_fwd", "ut_bwd_q", "ut_bwd_dk", "ut_bwd", "ut_bwd_inv")
UT_FOUR_WARPS = {(90, 64, True, 64): UT_KERNELS,
                 (80, 64, True, 64): UT_KERNELS,
                 (80, 128, True, 32): UT_KERNELS,
                 (90, 128, True, 32): ("ut_bwd_q", "ut_bwd_dk", "ut_bwd", "ut_bwd_inv"),
                 (80, 256, False, 64): ("ut_bwd_q", "ut_bwd")}
UT_FOUR_WARPS_R1 = {(90, 128, True, 32): ("ut_fwd",)}
# registers per thread ptxas may allocate (the PTX directive .maxnreg: Triton's launch
# option maxnreg), stated at the launches of `MAXNREG_KERNELS`. Without it ptxas (12.8 of
# Triton 3.6 as 13.4 of Triton 3.9) compiles some UT kernels to 32 registers and tens of KB
# of spills (bf16: `ut_bwd` for sm_90 at D 256, 21,026 B, with it 255 registers and
# 3,580 B; float32, sm_80, D 128: `ut_bwd_q` 37,132 B, with it 3,884 B); 255 is what 4 or
# 8 warps may use anyway (it costs `ut_bwd_q` at D 128 on sm_90 280 B, 0 B without). The
# other kernels compile as well or
# better without it (sm_90, D 64, no gates, Triton 3.9: `bwd` 644 B of spills without,
# 912 B with; `seg` 128 registers without, 148 with; `seg_bwd` met the same fallback at
# 64 rows of E on sm_80, which `SEG_BWD_ROWS` avoids).
MAX_REGISTERS = 255
MAXNREG_KERNELS = UT_KERNELS
# architecture -> the kernels that also state maxnreg there (`LaunchConfig.maxnreg_kernels`).
# sm_80, the query kernel: with Triton 3.6, D 128, bf16 and gates ptxas gave it 168
# registers and 4,872 B of spills, 582 spill loads / stores in its loops (2,834
# instructions and 537 of them per own-segment block, 407 and 20 per block of the walk);
# with maxnreg 255, 2,492 B and 396 (2,399 and 389, 365 and 7). Every other sm_80 setting
# (D 64, 128 and 256, gates on and off, R 1 and 2, float32 at D 64 and 128, Triton 3.6 and
# 3.9) compiles to the same SASS either way; on sm_90 the query kernel's spills move both
# ways with it (D 128, gates, Triton 3.6: 340 -> 508 B).
MAXNREG_ARCH = {80: ("bwd",)}


def ut_warps(arch: int, BD: int, dtype: torch.dtype, BT: int, R: int = 1) -> tuple:
    """(kernel, num_warps) pairs of the UT kernels on architecture `arch` for padded head dim
    BD, inputs of `dtype`, block length BT and R reflections per token (`UT_KERNELS`,
    `UT_FOUR_WARPS`, `UT_FOUR_WARPS_R1`)."""
    key = (arch, BD, dtype != torch.float32, BT * padded_reflections(R))
    four = UT_FOUR_WARPS.get(key, ()) + (UT_FOUR_WARPS_R1.get(key, ()) if R == 1 else ())
    return tuple((k, 4 if k in four else 8) for k in UT_KERNELS)


def pipe_table(arch: int, BD: int, dtype: torch.dtype) -> tuple:
    """`LaunchConfig.pipe` on architecture `arch` for padded head dim BD and inputs of
    `dtype` (`PIPE_STAGES`; float32 inputs keep the kernels' num_stages)."""
    if dtype == torch.float32:
        return ()
    return tuple(PIPE_STAGES.get((arch, BD), {}).items())


@dataclass(frozen=True)
class LaunchConfig:
    """Block length BT, the shared-memory limit it was chosen for (bytes), num_warps and
    num_stages per kernel as (kernel name, value) pairs (kernels not named take 4 warps and 1
    stage), BK, the rows of a segment product the backward scan reads at a time, R, the
    reflections per token it was chosen for, and kv, the (BKT, BQ) tiles of the key-parallel
    backward kernel and the rows of Pi it reads at a time (empty: whole blocks, and
    `m_rows`; see `kv_tiles`), pipe, (kernel name, depth) pairs of `PIPELINED` kernels'
    loops over earlier segments (`pipe_stages`), steps, (kernel name, key blocks per step)
    pairs of `STEPPED` kernels' loops over earlier segments (`key_steps`), seg_rows, the
    rows of E per program of
    the segment backward (0: min(BD, BT); `seg_bwd_rows`), maxnreg, the registers per
    thread the launches of the kernels in maxnreg_kernels allow (`max_registers`;
    `MAXNREG_KERNELS`, and per architecture `MAXNREG_ARCH`), seg_walk, whether
    the segment keys walk each segment (`SEG_WALK`), and walk_hoist and own_hoist, whether
    the query kernel's walk over earlier segments and its loop over its own segment load
    keys and values through loop-invariant offsets (`WALK_HOIST`, `OWN_HOIST`)."""

    BT: int
    shared_limit: int
    warps: tuple = ()
    stages: tuple = ()
    BK: int = _E_ROWS
    R: int = 1
    kv: tuple = ()
    pipe: tuple = ()
    steps: tuple = ()
    seg_rows: int = 0
    maxnreg: int = MAX_REGISTERS
    maxnreg_kernels: tuple = MAXNREG_KERNELS
    seg_walk: bool = False
    walk_hoist: bool = False
    own_hoist: bool = False

    def kv_tiles(self) -> tuple[int, int]:
        """(BKT, BQ) of the backward's key-parallel kernel: keys per program and queries per
        step (`kv`, else the whole block for both)."""
        return tuple(self.kv[:2]) if self.kv else (self.BT, self.BT)

    def kv_rows(self, BD: int) -> int:
        """Rows of a multi-segment transition Pi the key-parallel kernel reads at a time
        (`kv`, else `m_rows`)."""
        return self.kv[2] if self.kv else self.m_rows(BD)

    def launch(self, kernel: str) -> tuple[int, int]:
        """(num_warps, num_stages) of `kernel`."""
        return dict(self.warps).get(kernel, 4), dict(self.stages).get(kernel, 1)

    def seg_bwd_rows(self, BD: int) -> int:
        """Rows of E per program of the segment backward: min(BD, `seg_rows`), else
        min(BD, BT)."""
        return min(BD, self.seg_rows or self.BT)

    def pipe_stages(self, kernel: str) -> int:
        """Pipeline depth of the loop over earlier segments' blocks of a `PIPELINED` kernel
        (`pipe`, else its num_stages)."""
        return dict(self.pipe).get(kernel, self.launch(kernel)[1])

    def key_steps(self, kernel: str) -> int:
        """Key blocks per step of the loop over earlier segments' blocks of a `STEPPED`
        kernel (`steps`, else 1)."""
        return dict(self.steps).get(kernel, 1)

    def seg_multiple(self) -> int:
        """Blocks a default segment length is a multiple of: the key steps of the `STEPPED`
        kernels and the blocks per key tile and per query step of the key-parallel kernel,
        so that no step or tile is cut short at a segment's end."""
        BKT, BQ = self.kv_tiles()
        counts = [self.key_steps(k) for k in STEPPED] + [x // self.BT for x in (BKT, BQ)
                                                         if x > self.BT]
        return math.lcm(1, *counts)

    def max_registers(self, kernel: str) -> int | None:
        """Triton's launch option maxnreg for `kernel` (None: not stated)."""
        return self.maxnreg if kernel in self.maxnreg_kernels and self.maxnreg else None

    def launch_kwargs(self, kernel: str) -> dict:
        """num_warps / num_stages keyword arguments of a kernel launch, maxnreg where
        `max_registers` states it, PIPE for the `PIPELINED` kernels, KSTEP for the
        `STEPPED` ones and HOIST / HOIST_OWN (`walk_hoist`, `own_hoist`) for the query
        kernel."""
        warps, stages = self.launch(kernel)
        pipe = {"PIPE": self.pipe_stages(kernel)} if kernel in PIPELINED else {}
        if kernel in STEPPED:
            pipe["KSTEP"] = self.key_steps(kernel)
        if kernel == "bwd":
            pipe.update(HOIST=self.walk_hoist, HOIST_OWN=self.own_hoist)
        regs = self.max_registers(kernel)
        return {"num_warps": warps, "num_stages": stages, **pipe,
                **({"maxnreg": regs} if regs else {})}

    def e_rows(self, BD: int) -> int:
        """Rows of a segment product (M, Pi) the backward's query kernel and the Pi kernel
        read at a time for padded head dim BD: all of them up to BD = 64 (one product per
        segment crossed), else min(BD, BK) (`segments.times_e_sliced`)."""
        return BD if BD <= 64 else min(BD, self.BK)

    def m_rows(self, BD: int) -> int:
        """Rows of a whole-segment transition M the forward reads at a time (as `e_rows`)."""
        return self.e_rows(BD)


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


def register_cap(BD: int, dtype: torch.dtype, R: int = 1) -> int:
    """Longest block the default picks for padded head dim BD, inputs of `dtype` and R
    reflections per token, whatever the shared memory allows: past it the kernels' tiles
    no longer fit the registers. 16 for R > 1 at BD >= 128; 32 at BD >= 128 and for float32
    inputs (3xTF32 products) at BD >= 64, where 64-token blocks spill 4-24 KB per thread
    and the float32 kernels of one step compile in over two minutes; 64 elsewhere. An
    explicit block_size is not capped."""
    if padded_reflections(R) > 1 and BD >= 128:
        return 16
    if BD >= 128 or (dtype == torch.float32 and BD >= 64):
        return 32
    return 64


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

    block_size None: the largest BT of `block_lengths(R)` that fits and is at most
    `register_cap` (see the module docstring); an int: that BT, or a ValueError when its
    kernels do not fit (on a GPU, block sizes not in the tables are not measured and are
    refused). Raises a ValueError
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

    cap = register_cap(BD, dtype, reflections)
    fitting = [bt for bt in block_lengths(reflections) if fits(bt) and bt <= cap]
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
    # 2 pipeline stages for the forward scan only where two of its thread blocks still fit
    # an SM: a second resident block hides load latency at no shared-memory cost
    fwd_stages = 2 if (block_size in table
                       and table[block_size][col + 1] <= shared_limit // 2) else 1
    arch = 90 if interpreter or capability[0] >= 9 else 80
    return LaunchConfig(block_size, shared_limit, stages=(("fwd", fwd_stages),),
                        **device_settings(arch, BD, dtype, block_size, reflections))


def device_settings(arch: int, BD: int, dtype: torch.dtype, BT: int, R: int = 1) -> dict:
    """The `LaunchConfig` fields set per architecture (80 or 90) from the tables above, for
    padded head dim BD, inputs of `dtype`, block length BT and R reflections per token:
    warps (`ut_warps`, `KV_WARPS`, `TWO_WARPS`, `SEG_BWD_WIDE`), R, kv (`kv_tiles`), pipe
    (`pipe_table`), steps (`step_table`), seg_rows (`SEG_BWD_ROWS`, `SEG_BWD_WIDE`),
    maxnreg_kernels (`MAXNREG_KERNELS`, `MAXNREG_ARCH`), seg_walk (`SEG_WALK`), walk_hoist
    (`WALK_HOIST`), own_hoist (`OWN_HOIST`)."""
    key = (arch, BD, dtype != torch.float32)
    kv_warps = KV_WARPS.get(key)
    wide = SEG_BWD_WIDE.get(key)
    warps = (ut_warps(arch, BD, dtype, BT, R) + ((("bwd_kv", kv_warps),) if kv_warps else ())
             + tuple((k, 2) for k in TWO_WARPS.get(key + (BT,), ()))
             + ((("seg_bwd", wide[1]),) if wide else ()))
    return {"warps": warps, "R": R,
            "kv": kv_tiles(arch, BD, dtype, BT), "pipe": pipe_table(arch, BD, dtype),
            "steps": step_table(arch, BD, dtype, BT, R),
            "seg_rows": wide[0] if wide else min(SEG_BWD_ROWS.get(arch, BT), BT),
            "maxnreg_kernels": MAXNREG_KERNELS + MAXNREG_ARCH.get(arch, ()),
            "seg_walk": key in SEG_WALK, "walk_hoist": key in WALK_HOIST,
            "own_hoist": key in OWN_HOIST}


def step_table(arch: int, BD: int, dtype: torch.dtype, BT: int, R: int = 1) -> tuple:
    """`LaunchConfig.steps` on architecture `arch` for padded head dim BD, inputs of
    `dtype`, block length BT and R reflections per token (`KEY_STEPS`; float32 inputs and
    R > 1 take one block a step)."""
    if dtype == torch.float32 or R > 1:
        return ()
    return tuple(KEY_STEPS.get((arch, BD, BT), {}).items())


def kv_tiles(arch: int, BD: int, dtype: torch.dtype, BT: int) -> tuple:
    """`LaunchConfig.kv` on architecture `arch` (80 or 90) for padded head dim BD, inputs
    of `dtype` and block length BT: (BKT, BQ) of `KV_TILES` (whole blocks for head dims it
    does not list) and the rows of Pi read at a time: all up to BD = 64, past
    that 32, or 16 for float32 inputs (whose 3xTF32 operands take three times the shared
    memory: 16 rows keep BD = 256 within an sm_86 / sm_89 card's 99 KiB)."""
    kv = KV_TILES.get((arch, BD, dtype != torch.float32), (BT, BT))
    rows = BD if BD <= 64 else 16 if dtype == torch.float32 else _E_ROWS
    return (kv[0], kv[1], rows)


def device_launch_config(D: int, Dv: int, dtype: torch.dtype, device: torch.device,
                         block_size: int | None = None, reflections: int = 1) -> LaunchConfig:
    """`launch_config` for the shared memory and compute capability of `device`."""
    limit, capability = device_limits(device)
    return launch_config(D, Dv, dtype, limit, block_size, capability, reflections)
