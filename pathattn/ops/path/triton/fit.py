"""Ahead-of-time compilation of the Triton kernels for a GPU that need not be present.

Triton's compiler and ptxas ship in its wheel, so every kernel specialization the launcher
can pick is compiled here for an NVIDIA target (sm_80, sm_90, ...) on any machine, and its
shared memory per program checked against that device's limit. The interpreter that runs the
kernels on CPU hides these limits; this shows, without a GPU, that a configuration's shared
memory fits one (registers cannot stop a launch: ptxas caps them and spills the rest).

Stages of Triton's NVIDIA pipeline and what each one knows:

    AST -> TTIR -> TTGIR    layouts, software pipelining (num_stages) chosen    ~0.3 s
    shared-memory allocation pass on the TTGIR              `ttg.shared` known   ~0.05 s
    LLVM IR (make_llir)     the same `ttg.shared` as metadata["shared"], LLVM O3  2-15 s
    PTX, cubin (ptxas)      registers and spills                 20 s to minutes per kernel

`stage="shared"` runs the first stages and then only the passes of `make_llir` that precede
and perform the shared-memory allocation (warp-group allocation, scf -> cf, inlining,
allocation), and reads the module's `ttg.shared` attribute: the number `make_llir` stores as
`metadata["shared"]` and the driver checks at launch (checked equal in `stage="cubin"`).
`stage="cubin"` runs the whole pipeline and parses registers and spills from ptxas, and keeps
the PTX and the cubin for `inspect_kernels` (atomics, loops, matrix-unit instructions,
occupancy). `compile_jit` does the same for any `triton.jit` kernel.

This module is imported only by tools and tests; it must run with TRITON_INTERPRET unset or 0
(the interpreter replaces `triton.jit` kernels by Python functions that cannot be compiled).
"""

from __future__ import annotations

import functools
import inspect
import re
import subprocess
import tempfile
from dataclasses import dataclass, field, replace

import torch
import triton.language as tl
from triton._C.libtriton import ir, nvidia, passes
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import (
    CUDABackend,
    get_ptx_version_from_options,
    get_ptxas,
    sm_arch_from_capability,
)
from triton.compiler import ASTSource

from . import bwd, bwd_kv, crossings, fwd, segments, ut
from ._common import interpreting, reflection_tile, tile_kwargs, transition_dtype
from .config import (
    A100_SHARED,
    H100_SHARED,
    KERNELS,
    LaunchConfig,
    block_lengths,
    device_settings,
    launch_config,
)

__all__ = ["DEVICES", "Compiled", "KernelFit", "check", "compile_jit", "compile_kernel",
           "measure_shared_table"]

# name -> (compute capability, shared memory per block in bytes, opt-in maximum)
DEVICES = {"sm_80": (80, A100_SHARED), "sm_90": (90, H100_SHARED)}

_KERNEL_FN = {"ut_fwd": ut._ut_fwd_kernel, "fwd": fwd._fwd_kernel,
              "seg": segments._seg_kernel, "seg_bwd": segments._seg_bwd_kernel,
              "bwd": bwd._bwd_kernel, "ut_bwd": ut._ut_bwd_kernel,
              "pi": crossings._pi_kernel, "bwd_kv": bwd_kv._bwd_kv_kernel,
              "ut_bwd_q": ut._ut_bwd_q_kernel, "ut_bwd_dk": ut._ut_bwd_dk_kernel,
              "ut_bwd_inv": ut._ut_bwd_inv_kernel}
_TT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# pointers holding the caller's dtype, and those in the transitions' operand dtype
# (`_common.transition_dtype`); every other pointer is a float32 work buffer
_INPUT_PTRS = {"q_ptr", "k_ptr", "v_ptr", "w_ptr", "beta_ptr", "do_ptr", "o_ptr", "dq_ptr",
               "dk_ptr", "dw_ptr", "dbeta_ptr", "kt_ptr", "vc_ptr", "ks_ptr", "ysd_ptr",
               "yc_ptr", "dksc_ptr"}
_TRANSITION_PTRS = {"u_ptr", "e_ptr", "wt_ptr", "ms_ptr", "pi_ptr", "ysc_ptr", "gsc_ptr",
                    "xsc_ptr"}


@dataclass(frozen=True)
class KernelFit:
    """One compiled specialization: shared memory per program (bytes) and, after ptxas,
    registers per thread, spill stores+loads, the PTX, the cubin and the TTGIR (None when
    not compiled that far). R: the reflections per token it was compiled for."""

    kernel: str
    D: int
    dtype: torch.dtype
    gates: bool
    BT: int
    G: int
    num_warps: int
    num_stages: int
    capability: int
    shared: int
    limit: int
    regs: int | None = None
    spills: int | None = None
    R: int = 1
    ptx: str | None = field(default=None, repr=False, compare=False)
    cubin: bytes | None = field(default=None, repr=False, compare=False)
    ttgir: str | None = field(default=None, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit


@dataclass(frozen=True)
class Compiled:
    """One ahead-of-time compilation: shared memory per program (bytes); after ptxas also
    the PTX text, the cubin, registers per thread, spill bytes (stores + loads) and the
    TTGIR text (Triton's GPU dialect, with the layouts it chose)."""

    shared: int
    ptx: str | None = None
    cubin: bytes | None = None
    regs: int | None = None
    spills: int | None = None
    ttgir: str | None = None


def _signature(fn, dtype: torch.dtype, gates: bool, G: int = 1) -> tuple[dict, dict]:
    """Argument types of a kernel as the launcher calls it (GQA group G), and the
    divisibility attributes the JIT infers for 16-aligned pointers and head dims / head
    counts divisible by 16."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if i in fn.constexprs:
            sig[name] = "constexpr"
        elif name == "dvq_ptr":  # the finished dv without GQA, float32 parts with it
            sig[name] = "*" + (_TT[dtype] if G == 1 else "fp32")
        elif name == "g_ptr":
            sig[name] = "*fp64" if gates else "*fp32"
        elif name in ("table_ptr", "slot_ptr", "pbase_ptr"):
            sig[name] = "*i32"
        elif name.endswith("_ptr"):
            sig[name] = "*" + (_TT[dtype] if name in _INPUT_PTRS else
                               _TT[transition_dtype(dtype)] if name in _TRANSITION_PTRS
                               else "fp32")
        elif name == "scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        if sig[name].startswith("*") or name in ("D", "DV", "HQ", "H", "NTOK"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _constexprs(kernel: str, D: int, dtype, gates: bool, cfg: LaunchConfig, G: int) -> dict:
    """The compile-time arguments the launcher passes (see `op.py` and the kernels' files)."""
    tiles = tile_kwargs(D, D)
    prec = "tf32x3" if dtype == torch.float32 else "tf32"
    btr = reflection_tile(cfg.BT, cfg.R)
    c = {"BT": cfg.BT, "BD": tiles["BD"], "PREC": prec, "R": cfg.R, "BTR": btr}
    if kernel in ("fwd", "bwd", "bwd_kv"):
        c.update(G=G, HAS_G=gates, BDV=tiles["BDV"], DT=_TL[dtype],
                 TDT=_TL[transition_dtype(dtype)], EMULATE=False)
    if kernel in ("fwd", "bwd", "bwd_kv", "pi"):
        rows = {"fwd": cfg.m_rows, "bwd_kv": cfg.kv_rows}.get(kernel, cfg.e_rows)
        c.update(BK=rows(tiles["BD"]))
    if kernel == "bwd_kv":
        c.update(zip(("BKT", "BQ"), cfg.kv_tiles(), strict=True))
    # the compile-time arguments the launch settings carry (PIPE, KSTEP, HOIST, ...)
    c.update({k: v for k, v in cfg.launch_kwargs(kernel).items()
              if k not in ("num_warps", "num_stages", "maxnreg")})
    if kernel == "pi":
        c.update(BR=min(tiles["BD"], cfg.BT), TDT=_TL[transition_dtype(dtype)], EMULATE=False)
    if kernel in ("seg", "seg_bwd"):  # seg as the backward launches it (storing E)
        c.update(BR=(cfg.seg_bwd_rows(tiles["BD"]) if kernel == "seg_bwd"
                     else min(tiles["BD"], cfg.BT)), DT=_TL[dtype],
                 TDT=_TL[transition_dtype(dtype)], EMULATE=False,
                 **({"STORE_E": True, "WALK": cfg.seg_walk} if kernel == "seg" else {}))
    elif kernel == "ut_fwd":
        c.update(LOG_BTR=btr.bit_length() - 1, BDV=tiles["BDV"])
    elif kernel == "ut_bwd_q":
        c.update(G=G)
    names = set(_KERNEL_FN[kernel].arg_names)
    return {k: v for k, v in c.items() if k in names}


def _shared_after_allocation(mod, capability: int, options) -> int:
    """Run the head of `make_llir` up to shared-memory allocation; `ttg.shared` in bytes."""
    pm = ir.pass_manager(mod.context)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    try:
        passes.ttgpuir.add_allocate_warp_groups(pm, False)
    except TypeError:  # triton <= 3.6 takes no flag
        passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    if hasattr(passes, "gluon"):
        passes.gluon.add_inliner(pm)
    else:  # triton <= 3.6
        passes.common.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(
        pm, capability, get_ptx_version_from_options(options, capability))
    pm.run(mod, "pathattn_shared")
    return mod.get_int_attr("ttg.shared") or 0


@functools.cache
def ptxas_flags() -> tuple[str, ...]:
    """The register-allocation flags the installed Triton passes to ptxas: Triton 3.7 and
    later add --regAllocOptLevel=2 (with their ptxas 13), Triton 3.6 none (ptxas 12.8). The
    registers and spills reported are then those of a launch with this Triton."""
    src = inspect.getsource(CUDABackend.make_cubin)
    return ("--regAllocOptLevel=2",) if "--regAllocOptLevel=2" in src else ()


def _ptxas(ptx: str, arch: str, ptxas: str) -> tuple[int, int, bytes]:
    """Registers, spill bytes (stores + loads) from `ptxas -v`, and the cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-v", *ptxas_flags(), f"--gpu-name={arch}", src,
                              "-o", f"{tmp}/k.o"], capture_output=True, text=True, check=True)
        with open(f"{tmp}/k.o", "rb") as f:
            cubin = f.read()
    log = out.stderr + out.stdout
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return regs, spills, cubin


def compile_jit(fn, signature: dict, constexprs: dict, capability: int, num_warps: int = 4,
                num_stages: int = 1, stage: str = "shared", attrs: dict | None = None,
                maxnreg: int | None = None) -> Compiled:
    """Compile a `triton.jit` kernel with argument types `signature` (name -> "*fp32", "i32",
    "constexpr", ...) and compile-time values `constexprs` for sm_<capability>, to `stage`
    "shared" (shared memory only) or "cubin" (also PTX, cubin, registers and spills);
    maxnreg: Triton's launch option of that name (None: not set)."""
    if interpreting():
        raise RuntimeError("ahead-of-time compilation needs TRITON_INTERPRET unset")
    if stage not in ("shared", "cubin"):
        raise ValueError(f"stage must be 'shared' or 'cubin', got {stage!r}")
    src = ASTSource(fn, signature, constexprs, attrs or {})
    target = GPUTarget("cuda", capability, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages,
                                     **({"maxnreg": maxnreg} if maxnreg else {})})
    stage_fns: dict = {}
    backend.add_stages(stage_fns, options, src.language)

    def ttgir(metadata: dict):
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        mod = src.make_ir(target, options, backend.get_codegen_implementation(options),
                          backend.get_module_map(), context)
        return stage_fns["ttgir"](stage_fns["ttir"](mod, metadata), metadata)

    shared = _shared_after_allocation(ttgir({"target": target, **options.__dict__}),
                                      capability, options)
    if stage == "shared":
        return Compiled(shared)
    # the allocation passes changed that module: the full pipeline starts afresh
    metadata = {"target": target, **options.__dict__}
    mod = ttgir(metadata)
    ttgir_text = str(mod)
    ptx = stage_fns["ptx"](stage_fns["llir"](mod, metadata), metadata)
    if metadata["shared"] != shared:  # the early estimate must be the launch-time number
        raise RuntimeError(f"{fn.__name__}: shared memory {shared} after allocation but "
                           f"{metadata['shared']} after make_llir")
    regs, spills, cubin = _ptxas(ptx, sm_arch_from_capability(capability),
                                 get_ptxas(capability).path)
    return Compiled(shared, ptx, cubin, regs, spills, ttgir_text)


def compile_kernel(kernel: str, D: int, dtype: torch.dtype, gates: bool, cfg: LaunchConfig,
                   capability: int, stage: str = "shared", G: int = 1,
                   num_stages: int | None = None) -> KernelFit:
    """Compile one kernel (head dims D = Dv, GQA group G) with the block size, reflections
    per token, num_warps and num_stages of `cfg` (num_stages overrides the latter) for
    sm_<capability>, to `stage` "shared" (shared memory only) or "cubin" (also registers,
    spills, PTX and cubin)."""
    fn = _KERNEL_FN[kernel]
    if num_stages is not None:  # as the launcher's cfg would carry it (PIPE follows it)
        cfg = replace(cfg, stages=tuple({**dict(cfg.stages), kernel: num_stages}.items()))
    warps, stages = cfg.launch(kernel)
    sig, attrs = _signature(fn, dtype, gates, G)
    c = compile_jit(fn, sig, _constexprs(kernel, D, dtype, gates, cfg, G), capability, warps,
                    stages, stage, attrs, cfg.max_registers(kernel))
    return KernelFit(kernel=kernel, D=D, dtype=dtype, gates=gates, BT=cfg.BT, G=G,
                     num_warps=warps, num_stages=stages, capability=capability,
                     shared=c.shared, limit=cfg.shared_limit, regs=c.regs, spills=c.spills,
                     R=cfg.R, ptx=c.ptx, cubin=c.cubin, ttgir=c.ttgir)


def launched_kernels(kernel: str) -> tuple[int, ...]:
    """GQA groups G to compile a kernel for: G = 1 only, as no kernel loops over the query
    heads of a key head (G only maps a program's query head to its key head)."""
    return (1,)


def _kernel_groups() -> list[tuple[str, int]]:
    return [(k, G) for k in KERNELS for G in launched_kernels(k)]


def check(D: int, dtype: torch.dtype, gates: bool, device: str, stage: str = "shared",
          block_size: int | None = None, kernel: str | None = None,
          G: int | None = None, reflections: int = 1) -> list[KernelFit]:
    """Every kernel of a forward + backward (or only `kernel`, GQA group G) as the launcher
    configures it on `device` (a key of DEVICES) for head dim D = Dv, inputs of `dtype`,
    with or without gates, `reflections` per token."""
    capability, limit = DEVICES[device]
    cfg = launch_config(D, D, dtype, limit, block_size, (capability // 10, capability % 10),
                        reflections)
    return [compile_kernel(k, D, dtype, gates, cfg, capability, stage, G=g)
            for k, g in _kernel_groups() if kernel in (None, k) and G in (None, g)]


def measure_shared_table(capability: int, reflections: int = 1, progress=None) -> dict:
    """`config.SHARED_BYTES[arch]` (reflections=1) or `config.SHARED_BYTES_REFLECTIONS[R]
    [arch]` (R > 1, a power of two) measured afresh: padded head dim -> block length ->
    (float32 peak, float32 forward with 2 stages, bfloat16 peak, bfloat16 forward with 2
    stages), peaks over all kernels with 1 stage, for the block lengths
    the default may pick (`config.block_lengths`). progress(BD, BT, row) after each row."""
    table: dict = {}
    for BD in (16, 32, 64, 128, 256):
        table[BD] = {}
        for BT in block_lengths(reflections):
            row = []
            for dtype in (torch.float32, torch.bfloat16):
                cfg = LaunchConfig(BT, 0, **device_settings(capability // 10 * 10, BD, dtype,
                                                            BT, reflections))
                peak = max(compile_kernel(k, BD, dtype, True, cfg, capability, G=G).shared
                           for k in KERNELS for G in launched_kernels(k))
                fwd2 = compile_kernel("fwd", BD, dtype, True, cfg, capability,
                                      num_stages=2).shared
                row += [peak, fwd2]
            table[BD][BT] = tuple(row)
            if progress is not None:
                progress(BD, BT, table[BD][BT])
    return table


# reflections per token: 3 runs the tile shapes of 4 (compiled anyway: R is a constexpr)
QUICK = {"D": (64, 128, 256), "dtypes": (torch.float32, torch.bfloat16), "gates": (True,),
         "reflections": (1, 2, 4)}
# powers of two first: 48 runs the kernels of 64; 80 and 96 those of 128; 160, 192 of 256
FULL = {"D": (16, 32, 64, 128, 256, 48, 80, 96, 160, 192),
        "dtypes": (torch.float32, torch.bfloat16, torch.float16), "gates": (True, False),
        "reflections": (1, 2, 3, 4, 8)}


def fitting_block_sizes(D: int, dtype: torch.dtype, device: str,
                        reflections: int = 1) -> list[int]:
    """Block sizes `launch_config` accepts for D and R = `reflections` on `device` (the
    default first)."""
    capability, limit = DEVICES[device]
    out = []
    for bt in (None, 64, 32, 16):
        try:
            cfg = launch_config(D, D, dtype, limit, bt, (capability // 10, capability % 10),
                                reflections)
        except ValueError:
            continue
        if cfg.BT not in out:
            out.append(cfg.BT)
    return out


def run_checks(grid: dict, devices=tuple(DEVICES), stage: str = "shared",
               all_block_sizes: bool = False, progress=None,
               errors: list | None = None, refused: list | None = None) -> list[KernelFit]:
    """`check` over a grid of head dims, dtypes, gate settings and reflections per token
    (QUICK or FULL) on each device: the default block size, or every block size the
    launcher accepts. A kernel specialization shared by several head dims (same padded dim)
    is compiled once and reported under the first of them (QUICK and FULL list powers of
    two first). A compilation error is raised, or appended to `errors` as (description,
    exception) and the checks go on. Configurations the launcher refuses on a device (no
    block length fits) are appended to `refused` as (device, D, dtype, R)."""
    fits, seen = [], set()
    for device in devices:
        for R in grid.get("reflections", (1,)):
            for D in grid["D"]:
                for dtype in grid["dtypes"]:
                    sizes = fitting_block_sizes(D, dtype, device, R)
                    if not sizes and refused is not None:
                        refused.append((device, D, dtype, R))
                    for bt in sizes if all_block_sizes else sizes[:1]:
                        for gates in grid["gates"]:
                            key = (device, R, tile_kwargs(D, D)["BD"], dtype, gates, bt)
                            if key in seen:
                                continue
                            seen.add(key)
                            for kernel, G in _kernel_groups():
                                try:
                                    fit = check(D, dtype, gates, device, stage, bt, kernel, G,
                                                R)[0]
                                except Exception as e:
                                    if errors is None:
                                        raise
                                    errors.append((f"{kernel} (G={G}) {device} D={D} {dtype} "
                                                   f"gates={gates} BT={bt} R={R}", e))
                                    continue
                                fits.append(fit)
                                if progress is not None:
                                    progress(fit)
    return fits
