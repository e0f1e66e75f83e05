"""What the compiled Triton kernels do on the hardware, read from their PTX and SASS.

Per kernel specialization compiled ahead of time (`fit.compile_kernel`, stage "cubin"):
registers per thread and spill bytes (ptxas -v), shared memory per program, num_warps,
thread blocks per SM that fit, atomics, memory fences and matrix-unit instructions, each
placed in or out of a loop.

Loops are natural loops of the control-flow graph (basic blocks split at branch targets
and after branches; a back edge is a branch to a block that dominates it), so rotated loops
whose latch is placed before the header, loops spread over non-contiguous code and labels
scoped inside inline-assembly braces are handled. Each loop has its own instructions (in
none of its nested loops) and its static ones (nested loops' bodies counted once).

Matrix-unit instructions (MMA): PTX `mma.sync` (sm_80: one warp, e.g. m16n8k16 for 16-bit
inputs, m16n8k8 for tf32), `wgmma.mma_async` (sm_90: one warpgroup of 4 warps, a 64 x N x K
tile, K = 16 for 16-bit inputs, 8 for tf32, N up to 256), `wmma.mma`, `tcgen05.mma`; SASS
`HMMA`, `HGMMA` and the other `*MMA` opcodes (`nvdisasm`, shipped with Triton). Counts are
raw instructions of the per-thread code, executed once by every warp (mma.sync) or
warpgroup (wgmma): they compare kernels of one architecture and tile shape, not sm_80 with
sm_90. `wgmma_widths` lists the widths N of a kernel's wgmma instructions.

MMA per block pair: the block-pair loop is the loop with the most MMA instructions of its
own (ties: the most static ones, then the first in the code); per block pair counts its
static instructions, i.e. one iteration of it and of each loop nested in it. In a scan
kernel this is the loop over key blocks (or the query blocks of a key block); its source
line (from the PTX line table) is reported with it.

Atomics: `atom.*` / `red.*` with their semantics and scope, PTX's defaults (.relaxed,
.gpu) filled in. Fences: memory fences `membar.*` / `fence.{sc,acq_rel,acquire,release}`
(not the proxy or wgmma fences, which order no global memory), and in SASS `MEMBAR.*.GPU`
/ `.SYS` (what an ordered GPU-scope atomic compiles to: a fence before it).

Occupancy (`blocks_per_sm`): the smallest of the limits from registers (allocated per warp
in units of 256, to groups of 4 warps), shared memory (128-byte units, plus 1 KiB the
runtime reserves per block), threads and blocks per SM (`SM_LIMITS`), as CUDA's occupancy
calculator counts them.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass

from ...common.ptx_parse import statements

__all__ = ["SM_LIMITS", "KernelReport", "LoopInfo", "SassLoop", "analyze", "atomic_order",
           "blocks_per_sm", "disassemble", "grid_configs", "inspect_kernel", "inspect_jit",
           "mma_fma", "narrow_beside_wide", "ordered_atomics_in_loops", "repeated_products"]


@dataclass(frozen=True)
class SMLimits:
    """Per-SM resources of an architecture (bytes for shared memory)."""

    regs: int
    shared: int  # per SM
    shared_block: int  # per block, opt-in maximum
    threads: int
    blocks: int
    reg_unit: int = 256  # registers are allocated per warp in units of this many
    warp_unit: int = 4  # warps are given registers in groups of this many
    shared_unit: int = 128
    shared_reserved: int = 1024  # per block, for the runtime


SM_LIMITS = {80: SMLimits(65536, 164 * 1024, 163 * 1024, 2048, 32),
             90: SMLimits(65536, 228 * 1024, 227 * 1024, 2048, 32)}


def blocks_per_sm(regs: int, num_warps: int, shared: int, capability: int) -> tuple[int, str]:
    """Thread blocks of `num_warps` warps, `regs` registers per thread and `shared` bytes of
    shared memory that fit one SM of sm_<capability> at once, and the limiting resource
    ("regs", "shared", "threads" or "blocks"); 0 when one block does not fit."""
    lim = SM_LIMITS[capability]
    reg_warp = -(-regs * 32 // lim.reg_unit) * lim.reg_unit
    shared_block = -(-shared // lim.shared_unit) * lim.shared_unit + lim.shared_reserved
    warps = lim.regs // reg_warp // lim.warp_unit * lim.warp_unit if regs else lim.threads // 32
    by = {"regs": warps // num_warps,
          "shared": lim.shared // shared_block if shared <= lim.shared_block else 0,
          "threads": lim.threads // (32 * num_warps), "blocks": lim.blocks}
    limiter = min(by, key=by.get)
    return by[limiter], limiter


# ----------------------------------------------------------------- instructions, blocks


@dataclass
class _Inst:
    op: str  # opcode with modifiers ("bra.uni", "atom.global.gpu.acq_rel.add.f32", "HGMMA...")
    target: str | None = None  # branch target, resolved to a unique label
    cond: bool = False  # guarded by a predicate: may fall through
    ends: bool = False  # a branch, exit or return: ends a basic block
    loc: str = ""  # source location from the line table ("fwd.py:111"), PTX only


def _ptx_insts(ptx: str) -> list[_Inst | str]:
    """Statements of the entry function (`pathattn.ops.common.ptx_parse`): `_Inst`, or a
    label's unique name, in code order."""
    stmts, labels = statements(ptx)
    at: dict[int, list[str]] = {}
    for name, i in labels.items():
        at.setdefault(i, []).append(name)
    out: list[_Inst | str] = []
    for i, st in enumerate(stmts):
        out.extend(at.get(i, ()))
        guarded = st.guard is not None
        if st.op.startswith("brx"):
            raise ValueError("indirect branch (brx) in the PTX: its targets are not known")
        if st.op.startswith("bra"):
            out.append(_Inst(st.op, st.args[-1], guarded, True, st.loc))
        else:
            out.append(_Inst(st.op, None, guarded,
                             st.op in ("ret", "exit", "trap") and not guarded, st.loc))
    out.extend(at.get(len(stmts), ()))
    return out


# the opcode keeps its modifiers, the lowercase x of a shape included (HGMMA.64x64x16.F32)
_SASS_LINE = re.compile(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]*)\s*([^;]*);")


def _sass_insts(sass: str) -> list[_Inst | str]:
    """Instructions and labels of `nvdisasm -c` output."""
    out: list[_Inst | str] = []
    for line in sass.splitlines():
        if m := re.match(r"^(\.L_x_\d+):", line):
            out.append(m.group(1))
        elif m := _SASS_LINE.search(line):
            guard, op, args = m.groups()
            guarded = bool(guard) and guard.strip() not in ("@PT",)
            base = op.split(".")[0]
            if base in ("BRX", "JMX"):
                raise ValueError("indirect branch in the SASS: its targets are not known")
            if base in ("BRA", "JMP"):
                t = re.search(r"`\((\.L_x_\d+)\)", args)
                if t is None:
                    raise ValueError(f"branch without a label in the SASS: {line.strip()}")
                conditional = guarded or bool(args[:t.start()].strip())  # BRA.U !UP0, ...
                out.append(_Inst(op, t.group(1), conditional, True))
            else:
                out.append(_Inst(op, None, guarded, base in ("EXIT", "RET") and not guarded))
    return out


def _blocks(insts: list[_Inst | str]) -> tuple[list[list[_Inst]], list[set[int]]]:
    """Basic blocks (instruction lists) and successors; block 0 is the entry."""
    targets = {i.target for i in insts if isinstance(i, _Inst) and i.target}
    blocks: list[list[_Inst]] = [[]]
    label_block: dict[str, int] = {}
    for i in insts:
        if isinstance(i, str):
            if i in targets:
                if blocks[-1]:
                    blocks.append([])
                label_block[i] = len(blocks) - 1
            continue
        blocks[-1].append(i)
        if i.ends or (i.target and i.cond):
            blocks.append([])
    succ: list[set[int]] = []
    for b, body in enumerate(blocks):
        last = body[-1] if body else None
        s = set()
        if last is None or not last.ends or last.cond:
            if b + 1 < len(blocks):
                s.add(b + 1)
        if last is not None and last.target:
            if last.target not in label_block:
                raise ValueError(f"branch to an unknown label {last.target}")
            s.add(label_block[last.target])
        succ.append(s)
    return blocks, succ


# ------------------------------------------------------------------------------ loops


@dataclass(frozen=True)
class LoopInfo:
    """One natural loop: source line of its latch branch ("" without a line table), nesting
    depth (1 = outermost), whether it nests no loop, MMA instructions of its own and
    static (see the module docstring), and atomics static (its nested loops' included)."""

    loc: str
    depth: int
    innermost: bool
    mma_own: int
    mma_static: int
    atomics_static: int = 0


def _loops(succ: list[set[int]]) -> list[tuple[int, set[int]]]:
    """(header, body blocks) of the natural loops of the blocks reachable from block 0."""
    order, seen, stack = [], {0}, [(0, iter(sorted(succ[0])))]
    while stack:  # reverse post-order
        b, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            order.append(b)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(sorted(succ[nxt]))))
    order.reverse()
    pred: dict[int, set[int]] = {b: set() for b in order}
    for b in order:
        for s in succ[b]:
            pred[s].add(b)
    full = (1 << len(succ)) - 1
    dom = {b: full for b in order}
    dom[0] = 1
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            d = full
            for p in pred[b]:
                d &= dom[p]
            d |= 1 << b
            if d != dom[b]:
                dom[b], changed = d, True
    bodies: dict[int, set[int]] = {}
    for b in order:
        for h in succ[b]:
            if dom[b] >> h & 1:  # back edge b -> h
                body, work = bodies.setdefault(h, {h}), [b]
                while work:
                    x = work.pop()
                    if x not in body:
                        body.add(x)
                        work.extend(pred[x])
    return sorted(bodies.items())


# ---------------------------------------------------------------------- the analysis

_PTX_MMA = re.compile(r"^(mma\.sync|wgmma\.mma_async|wmma\.mma|tcgen05\.mma)")
_WGMMA_SHAPE = re.compile(r"^wgmma\.mma_async\.\S*?\bm\d+n(\d+)k\d+")
_PTX_FENCE = re.compile(r"^(membar\.|fence\.(sc|acq_rel|acquire|release)\b)")
_SEMS = ("relaxed", "acquire", "release", "acq_rel", "sc", "volatile")
_SCOPES = ("cta", "cluster", "gpu", "sys")


def atomic_order(op: str) -> tuple[str, str]:
    """(semantics, scope) of a PTX `atom` / `red` opcode, PTX's defaults filled in."""
    parts = op.split(".")
    sem = next((p for p in parts if p in _SEMS), "relaxed")
    return sem, next((p for p in parts if p in _SCOPES), "gpu")


def _is_mma_sass(op: str) -> bool:
    return op.split(".")[0].endswith("MMA")


# mma.sync shapes of the SASS (HMMA.<m><n><k>) -> multiply-adds per warp
_HMMA_FMA = {"16816": 16 * 8 * 16, "1688": 16 * 8 * 8, "16832": 16 * 8 * 32, "884": 8 * 8 * 4}


def mma_fma(op: str) -> int:
    """Multiply-adds one warp's issue of a SASS MMA instruction stands for, a TF32 one
    counted twice (half the rate of 16-bit operands): HGMMA.MxNxK is a warpgroup's
    M x N x K product, a quarter of it per warp; HMMA.<shape> one warp's. 0 for any other
    instruction; a ValueError for an MMA shape not known here."""
    if not _is_mma_sass(op):
        return 0
    parts = op.split(".")
    if parts[0] == "HGMMA" and (m := re.fullmatch(r"(\d+)x(\d+)x(\d+)", parts[1])):
        fma = int(m.group(1)) * int(m.group(2)) * int(m.group(3)) // 4
    elif parts[0] == "HMMA" and len(parts) > 1 and parts[1] in _HMMA_FMA:
        fma = _HMMA_FMA[parts[1]]
    else:
        raise ValueError(f"MMA instruction of unknown shape: {op}")
    return fma * (2 if "TF32" in parts else 1)


def _loop_stats(insts, is_mma) -> tuple[list[LoopInfo], int, LoopInfo | None, list, frozenset]:
    """Loops, total MMA, the block-pair loop (None: no loop has MMA), the basic blocks and
    the set of those inside a loop."""
    blocks, succ = _blocks(insts)
    loops = _loops(succ)
    mma = [sum(map(is_mma, (i.op for i in b))) for b in blocks]
    atomic = [sum(i.op.startswith(("atom.", "red.", "ATOM", "RED")) for i in b) for b in blocks]
    infos = []
    for h, body in loops:
        inner = [other for g, other in loops if g != h and g in body]
        own = body - set().union(*inner)
        depth = sum(h in other for _, other in loops)
        latches = [b for b in body if h in succ[b] and blocks[b]]
        locs = [blocks[b][-1].loc for b in latches if blocks[b][-1].loc]
        infos.append(LoopInfo(min(locs, default=""), depth, not inner,
                              sum(mma[b] for b in own), sum(mma[b] for b in body),
                              sum(atomic[b] for b in body)))
    in_loops = frozenset().union(*(body for _, body in loops))
    pair = max(infos, key=lambda x: (x.mma_own, x.mma_static), default=None)
    return infos, sum(mma), pair if pair and pair.mma_static else None, blocks, in_loops


@dataclass(frozen=True)
class KernelReport:
    """One compiled kernel: resources, occupancy, atomics (opcode -> count, in / outside
    loops), memory fences in loops (PTX; SASS GPU-scope MEMBARs), MMA instructions in all
    and per block pair (PTX; SASS, None without it), and the loops (see `analyze`)."""

    name: str
    capability: int
    num_warps: int
    shared: int
    regs: int
    spills: int
    blocks_per_sm: int
    limiter: str
    atomics_in_loops: dict
    atomics_outside_loops: dict
    fences_in_loops: int
    mma_total: int
    mma_per_block_pair: int
    pair_loop: str
    loops: tuple
    sass_membar_gpu_in_loops: int | None = None
    sass_mma_total: int | None = None
    sass_mma_per_block_pair: int | None = None
    sass_local_in_loops: int | None = None  # LDL / STL (spill traffic) inside loops
    config: dict | None = None  # the pathattn launch it stands for (kernel, D, dtype, ...)
    sass_loops: tuple | None = None  # SassLoop per SASS loop, in code order
    wgmma_widths: tuple = ()  # the N of the kernel's wgmma instructions (m64nNk*), sorted
    sass_instructions: int | None = None  # in the whole kernel, each counted once
    sass_fma: int | None = None  # `mma_fma` of the whole kernel's MMA, each counted once
    repeated_products: tuple = ()  # `repeated_products` of its TTGIR

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> KernelReport:
        d = dict(d, loops=tuple(LoopInfo(**x) for x in d["loops"]),
                 wgmma_widths=tuple(d.get("wgmma_widths", ())),
                 repeated_products=tuple(tuple(x) for x in d.get("repeated_products", ())))
        if d.get("sass_loops") is not None:
            d["sass_loops"] = tuple(SassLoop(**x) for x in d["sass_loops"])
        return cls(**d)


@dataclass(frozen=True)
class SassLoop:
    """One loop of the SASS (no source lines there; code order matches the PTX loops' in
    practice): nesting depth, and its own instructions, spill loads / stores (LDL / STL)
    and MMA instructions (its nested loops' not included): the issue cost per iteration."""

    depth: int
    instructions: int
    local: int
    mma: int
    fma: int = 0  # multiply-adds of its MMA instructions per warp (`mma_fma`)


def analyze(ptx: str, sass: str | None = None) -> dict:
    """Atomics, fences, MMA and loops of one kernel's PTX (and SASS): the `KernelReport`
    fields that do not come from ptxas."""
    insts = _ptx_insts(ptx)
    loops, total, pair, blocks, in_loops = _loop_stats(
        insts, lambda op: bool(_PTX_MMA.match(op)))
    atomics: tuple[dict, dict] = ({}, {})
    fences = 0
    for b, body in enumerate(blocks):
        for i in body:
            if i.op.startswith(("atom.", "red.")):
                d = atomics[b not in in_loops]
                d[i.op] = d.get(i.op, 0) + 1
            fences += b in in_loops and bool(_PTX_FENCE.match(i.op))
    widths = {int(m.group(1)) for i in insts
              if isinstance(i, _Inst) and (m := _WGMMA_SHAPE.match(i.op))}
    out = {"atomics_in_loops": atomics[0], "atomics_outside_loops": atomics[1],
           "fences_in_loops": fences, "mma_total": total,
           "mma_per_block_pair": pair.mma_static if pair else 0,
           "pair_loop": pair.loc if pair else "", "loops": tuple(loops),
           "wgmma_widths": tuple(sorted(widths))}
    if sass is not None:
        sinsts = _sass_insts(sass)
        _, stotal, spair, sblocks, sin = _loop_stats(sinsts, _is_mma_sass)
        out["sass_loops"] = _sass_loops(sblocks, _loops(_blocks(sinsts)[1]))
        out.update(sass_instructions=sum(isinstance(i, _Inst) for i in sinsts),
                   sass_fma=sum(mma_fma(i.op) for i in sinsts if isinstance(i, _Inst)),
                   sass_mma_total=stotal, sass_mma_per_block_pair=spair.mma_static if spair
                   else 0, sass_membar_gpu_in_loops=sum(
                       re.match(r"MEMBAR\..*(GPU|SYS)", i.op) is not None
                       for b in sin for i in sblocks[b]),
                   sass_local_in_loops=sum(i.op.startswith(("LDL", "STL"))
                                           for b in sin for i in sblocks[b]))
    return out


def _sass_loops(blocks: list[list[_Inst]], loops: list[tuple[int, set[int]]]) -> tuple:
    """`SassLoop` of each loop, in code order (by header block)."""
    out = []
    for h, body in sorted(loops, key=lambda x: x[0]):
        nested = set().union(*(other for g, other in loops if g != h and g in body))
        own = [i for b in sorted(body - nested) for i in blocks[b]]
        out.append(SassLoop(depth=sum(h in other for _, other in loops),
                            instructions=len(own),
                            local=sum(i.op.startswith(("LDL", "STL")) for i in own),
                            mma=sum(_is_mma_sass(i.op) for i in own),
                            fma=sum(mma_fma(i.op) for i in own)))
    return tuple(out)


def disassemble(cubin: bytes) -> str | None:
    """SASS of a cubin (`nvdisasm -c` shipped with Triton), None when it is missing."""
    try:
        from triton import knobs

        nvdisasm = knobs.nvidia.nvdisasm.path
    except Exception:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


_MMA_LAYOUT = re.compile(r"^(#mma\d*) = #ttg\.nvidia_mma<\{versionMajor = (\d+), "
                         r"versionMinor = \d+, warpsPerCTA = \[(\d+), (\d+)\], "
                         r"instrShape = \[(\d+), (\d+)", re.M)
_PRODUCT = re.compile(r"(?:tt\.dot|ttng\.warp_group_dot) .*-> tensor<(\d+)x(\d+)x\w+, "
                      r"(#mma\d*)>")


def repeated_products(ttgir: str) -> tuple[tuple[int, int, int], ...]:
    """(rows, columns, repeats) of each matrix product of a TTGIR module whose layout's
    warps tile its result `repeats` > 1 times: rows split among warps 16 at a time (mma.sync;
    wgmma: 16 per warp of a warpgroup), columns by the instruction's width N."""
    layouts = {m.group(1): tuple(int(x) for x in m.groups()[1:])
               for m in _MMA_LAYOUT.finditer(ttgir)}
    out = []
    for m in _PRODUCT.finditer(ttgir):
        rows, cols = int(m.group(1)), int(m.group(2))
        _, warps_m, warps_n, inst_m, inst_n = layouts[m.group(3)]
        repeats = max(1, warps_m * inst_m // rows) * max(1, warps_n * inst_n // cols)
        if repeats > 1:
            out.append((rows, cols, repeats))
    return tuple(out)


def _report(name, c, capability: int, num_warps: int, config=None) -> KernelReport:
    blocks, limiter = blocks_per_sm(c.regs, num_warps, c.shared, capability)
    return KernelReport(name=name, capability=capability, num_warps=num_warps,
                        shared=c.shared, regs=c.regs, spills=c.spills, blocks_per_sm=blocks,
                        limiter=limiter, config=config,
                        repeated_products=repeated_products(c.ttgir or ""),
                        **analyze(c.ptx, disassemble(c.cubin)))


def inspect_jit(fn, signature: dict, constexprs: dict, capability: int, num_warps: int = 4,
                num_stages: int = 1) -> KernelReport:
    """`KernelReport` of any `triton.jit` kernel (arguments as `fit.compile_jit`)."""
    from .fit import compile_jit

    c = compile_jit(fn, signature, constexprs, capability, num_warps, num_stages, "cubin")
    return _report(fn.__name__, c, capability, num_warps)


def inspect_kernel(kernel: str, D: int, dtype, gates: bool, device: str, reflections: int = 1,
                   G: int = 1, block_size: int | None = None) -> KernelReport:
    """`KernelReport` of one pathattn kernel (`config.KERNELS`) as
    the launcher configures it on `device` ("sm_80" or "sm_90", see `fit.check`)."""
    from .fit import check

    f = check(D, dtype, gates, device, "cubin", block_size, kernel, G, reflections)[0]
    config = {"kernel": kernel, "D": D, "dtype": str(dtype).removeprefix("torch."),
              "gates": gates, "R": reflections, "G": G, "BT": f.BT,
              "num_stages": f.num_stages}
    return _report(kernel, f, f.capability, f.num_warps, config)


def narrow_beside_wide(widths) -> bool:
    """Whether a kernel's wgmma widths (`KernelReport.wgmma_widths`) put one narrower than
    64 columns beside wider ones: the pattern of the kernels that faulted on an H100 with
    Triton 3.6 (m64n32 beside m64n64; docs/ops.md, "One wgmma width")."""
    return len(widths) > 1 and min(widths) < 64


def ordered_atomics_in_loops(r: KernelReport) -> list[str]:
    """Atomics in loops that are not relaxed, and memory fences in loops (each orders memory
    on every iteration), as "count x opcode"; empty when there are none."""
    bad = [f"{n} x {op}" for op, n in r.atomics_in_loops.items()
           if atomic_order(op)[0] != "relaxed"]
    return bad + ([f"{r.fences_in_loops} x memory fence"] if r.fences_in_loops else [])


def grid_configs(grid: dict, devices=("sm_90", "sm_80"), kernels=None) -> list[tuple]:
    """`inspect_kernel` arguments (kernel, D, dtype, gates, device, R) over devices x
    grid["reflections"] x grid["D"] x grid["dtypes"] x grid["gates"] x `kernels` (default
    every kernel; GQA group 1, the launcher's block size)."""
    from .config import KERNELS

    return [(k, D, dtype, gates, device, R) for device in devices
            for R in grid.get("reflections", (1,)) for D in grid["D"]
            for dtype in grid["dtypes"] for gates in grid["gates"] for k in kernels or KERNELS]
