"""Where a compiled kernel reads and writes, found by running its PTX on the CPU.

`Emulator(ptx, shared, num_warps, regions, params).run(ctaid, nctaid)` executes one
program (thread block) of a kernel's PTX for all its threads at once, exactly for integers
and not at all for floating point: a float value is "unknown", and so is everything
computed from it. Every memory access is checked: a global one must lie inside one of
`regions` (the launch's tensors), a shared one inside the block's `shared` bytes, and a
wgmma operand's whole tile (read through its matrix descriptor: start address, strides,
swizzle mode) inside the shared bytes too. Integer tensors given with their bytes (block
tables, slots) are read as the kernel reads them; shared memory keeps what the kernel
stored with known values, so indices that cross threads through it stay known. What
cannot be evaluated (an address computed from an unknown value) is reported as such.

Model: the threads of a block run in lockstep; a branch must go the same way for all of
them (Triton's control flow is uniform), except the inline-assembly wait loops on mbarriers,
taken as completed. A guarded access is checked for the threads whose guard is true, or for
all of them when the guard is unknown. The emulator covers the instructions Triton's NVIDIA
backend emits for the pathattn kernels and fails loudly on others. It checks the kernel as
Triton wrote it (PTX), not ptxas's machine code.
"""

from __future__ import annotations

import re

import numpy as np

from .ptx_memory import Fault, Memory, Region
from .ptx_parse import Stmt, post_dominator_joins, statements

__all__ = ["Region", "Fault", "Emulator", "Unsupported"]

U64 = np.uint64
_MASK = {1: 1, 8: 0xFF, 16: 0xFFFF, 32: 0xFFFFFFFF, 64: 0xFFFFFFFFFFFFFFFF}
_FLOAT = {"f16", "f16x2", "bf16", "bf16x2", "f32", "f64", "tf32", "e4m3", "e5m2", "e4m3x2",
          "e5m2x2"}
_FLOAT_OPS = {"mma", "ex2", "lg2", "fma", "rcp", "sqrt", "rsqrt", "tanh", "sin", "cos",
              "testp", "copysign", "cvt.rn", "fns"}
_NO_EFFECT = ("bar", "barrier", "fence", "membar", "wgmma.fence", "wgmma.commit_group",
              "wgmma.wait_group", "mbarrier.init", "mbarrier.arrive", "mbarrier.expect_tx",
              "griddepcontrol", "prefetch", "discard", "nanosleep", "pmevent",
              "cp.async.commit_group", "cp.async.wait_group", "cp.async.wait_all",
              "cp.async.bulk.commit_group", "cp.async.bulk.wait_group")
_ELEM = {"bf16": 2, "f16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "s8": 1, "u8": 1}
_INT = re.compile(r"(-?(?:0[xX][0-9a-fA-F]+|\d+))U?")
_ADDR = re.compile(r"\[\s*([%\w]+)\s*(?:\+\s*(-?\d+))?\s*\]")


class Unsupported(RuntimeError):
    """An instruction or a control flow the emulator does not model."""


class _Unknown(Exception):
    pass


def _bits(t: str) -> int | None:
    if t == "pred":
        return 1
    m = re.fullmatch(r"[bsuf](\d+)", t)
    return int(m.group(1)) if m else None


def _signed(x: np.ndarray, bits: int) -> np.ndarray:
    x = (x & U64(_MASK[bits])).astype(np.int64) if bits < 64 else x.astype(np.int64)
    return np.where(x >= (1 << (bits - 1)), x - (1 << bits), x) if bits < 64 else x


class Emulator:
    """One kernel's PTX, ready to run its programs (see the module docstring).

    ptx: the kernel's PTX text; shared: its shared memory per block in bytes; num_warps;
    regions: the launch's tensors (`Region`); params: PTX parameter name -> integer value
    (None for a float parameter). After `run` calls: `faults`, `unknown` (statement index ->
    (source line, opcode) of accesses whose address could not be evaluated) and the counts
    `global_accesses`, `shared_accesses`, `steps`."""

    def __init__(self, ptx: str, shared: int, num_warps: int, regions, params: dict):
        self.code, self.labels = statements(ptx)
        self.n = 32 * num_warps
        self.mem = Memory(list(regions), shared)
        self.params = params
        self.unknown: dict[int, tuple[str, str]] = {}
        self.steps = 0

    faults = property(lambda self: self.mem.faults)
    global_accesses = property(lambda self: self.mem.global_accesses)
    shared_accesses = property(lambda self: self.mem.shared_accesses)

    # ------------------------------------------------------------------- values
    def _get(self, a: str) -> np.ndarray:
        if a in self.r:
            v = self.r[a]
            if v is None:
                raise _Unknown(a)
            return v
        if m := _INT.fullmatch(a):  # 12, -1, 0x7701U
            return np.full(self.n, int(m.group(1), 0) & _MASK[64], dtype=U64)
        if a == "global_smem":
            return np.zeros(self.n, dtype=U64)
        if a == "%tid.x":
            return np.arange(self.n, dtype=U64)
        if a == "%laneid":
            return np.arange(self.n, dtype=U64) % U64(32)
        if a in self.special:
            return np.full(self.n, self.special[a], dtype=U64)
        raise _Unknown(a)  # float literal, undefined register, unmodelled special

    def _set(self, d: str, v: np.ndarray | None, bits: int | None, gm) -> None:
        if v is not None and bits and bits < 64:
            v = v & U64(_MASK[bits])
        if gm is None or gm is True or d not in self.r:  # (a first definition: all threads)
            self.r[d] = v
        elif gm is not False:  # per-thread guard: keep the old value where it is false
            old = self.r[d]
            self.r[d] = None if v is None or old is None else np.where(gm, v, old)

    def _dests(self, a: str) -> list[str]:
        return [x.strip() for x in a.strip("{} ").replace("|", ",").split(",")]

    def _forget(self, args) -> None:
        for d in self._dests(args[0]) if args else ():
            if d.startswith("%"):
                self.r[d] = None

    # ------------------------------------------------------------------- running
    def run(self, ctaid: tuple[int, int, int], nctaid: tuple[int, int, int],
            max_steps: int = 20_000_000) -> None:
        """Execute program `ctaid` of a grid of `nctaid` programs."""
        self.r: dict[str, np.ndarray | None] = {}
        self.special = {f"%ctaid.{c}": v for c, v in zip("xyz", ctaid, strict=True)}
        self.special.update({f"%nctaid.{c}": v for c, v in zip("xyz", nctaid, strict=True)})
        self.special.update({"%tid.y": 0, "%tid.z": 0, "%ntid.x": self.n, "%ntid.y": 1,
                             "%ntid.z": 1})
        self.mem.reset_shared()
        self.active = None  # the threads on the current path (None: all)
        self.exited = np.zeros(self.n, dtype=bool)
        self.uncertain = 0  # inside the sides of a branch on an unknown predicate
        self.budget = max_steps
        self._walk(0, None)

    def _walk(self, pc: int, stop: int | None) -> None:
        """Execute from pc until statement `stop` (a join point) or the end."""
        code = self.code
        while pc != stop and pc < len(code):
            self.steps += 1
            self.budget -= 1
            if self.budget < 0:
                raise Unsupported("too many steps: a loop that does not end?")
            st = code[pc]
            gm = self._guard(st)
            base = st.op.split(".")[0]
            if base == "bra":
                target = self.labels[st.args[-1]]
                if gm is True or gm is None or (self.active is not None and
                                                not isinstance(gm, (bool, str)) and
                                                (gm == self.active).all()):
                    pc = target
                elif gm is False or "/" in st.args[-1]:  # an inline-asm wait loop: done
                    pc += 1
                else:  # the threads part ways, and meet again at the join point
                    join = self._join(pc)
                    if isinstance(gm, str):
                        self._both_ways(st, target, pc + 1, join)
                    else:
                        self._each_way(target, pc + 1, join, gm)
                    if join is None or (self.active is not None and not self.active.any()):
                        return
                    pc = join
                continue
            if base in ("ret", "exit"):
                if gm is False:
                    pc += 1
                    continue
                if isinstance(gm, str) or self.uncertain:
                    raise Unsupported(f"exit on an unknown predicate ({st.loc})")
                self.exited |= True if gm is None or gm is True else gm
                self.active = (~self.exited if self.active is None
                               else self.active & ~self.exited)
                if not self.active.any():
                    return
                pc += 1
                continue
            try:
                self._step(pc, st, gm)
            except _Unknown:
                self._unknown(pc, st, gm)
            pc += 1

    def _each_way(self, target: int, fall: int, join: int | None, taken) -> None:
        """A branch some threads take: each side runs with its threads, as a GPU does."""
        outer = np.ones(self.n, bool) if self.active is None else self.active
        self.active = taken
        self._walk(target, join)
        self.active = outer & ~taken & ~self.exited
        if self.active.any():
            self._walk(fall, join)
        self.active = outer & ~self.exited
        if self.active.all():
            self.active = None

    def _both_ways(self, st: Stmt, target: int, fall: int, join: int | None) -> None:
        """A branch on an unknown predicate (floating-point data): both sides run with every
        thread and their accesses are checked; a register the two sides leave different
        is unknown after the join."""
        if join is None:
            raise Unsupported(f"branch on an unknown predicate that never joins ({st.loc})")
        if target < fall or self.uncertain >= 8:  # a loop latch, or branches nested deep
            raise Unsupported(f"a loop or nested branches on an unknown predicate ({st.loc})")
        before, writes = dict(self.r), self.mem.shared_writes
        self.uncertain += 1
        self._walk(target, join)
        taken, self.r = self.r, dict(before)
        self._walk(fall, join)
        self.uncertain -= 1
        for k in taken.keys() | self.r.keys():
            a, b = taken.get(k), self.r.get(k)
            if a is not b and (a is None or b is None or not np.array_equal(a, b)):
                self.r[k] = None
        if self.mem.shared_writes != writes:
            self.mem.forget_shared()

    def _join(self, pc: int) -> int | None:
        """The statement where the two sides of the branch at pc meet (its block's
        immediate post-dominator), None when they only meet at the kernel's end."""
        if not hasattr(self, "_joins"):
            self._joins = post_dominator_joins(self.code, self.labels)
        return self._joins[pc]

    def _guard(self, st: Stmt):
        """The threads an instruction acts on: None (all, on a path all threads run), True /
        False (every thread of the current path / none), a per-thread bool array, or
        "unknown" (a guard computed from floating-point data)."""
        active = self.active
        if st.guard is None:
            return None if active is None else active
        try:
            p = self._get(st.guard[0]).astype(bool)
        except _Unknown:
            return "unknown"
        p = ~p if st.guard[1] else p
        if active is not None:
            p = p & active
            return False if not p.any() else p
        return True if p.all() else False if not p.any() else p

    def _unknown(self, pc: int, st: Stmt, gm) -> None:
        """An instruction with an unknown input: its results are unknown; an access whose
        address is unknown is recorded."""
        base = st.op.split(".")[0]
        if base in ("ld", "st", "atom", "red", "ldmatrix", "stmatrix", "cp", "wgmma") \
                and gm is not False and ".param" not in st.op:  # a float parameter
            addr = next((a for a in st.args if a.startswith("[")), None)
            try:
                if addr is not None:
                    self._address(addr)
                if base == "wgmma" and st.op.startswith("wgmma.mma_async"):
                    raise _Unknown("descriptor")
            except _Unknown:
                self.unknown.setdefault(pc, (st.loc, st.op))
            if ".shared" in st.op and base in ("st", "stmatrix", "atom", "red", "cp"):
                self.mem.forget_shared()  # some shared bytes now unknown: forget them all
        if base not in ("st", "red", "stmatrix") and not st.op.startswith(_NO_EFFECT):
            self._forget(st.args)

    def _step(self, pc: int, st: Stmt, gm) -> None:
        op, args = st.op, st.args
        parts = op.split(".")
        base = parts[0]
        if op.startswith(_NO_EFFECT):
            return
        if base in ("ld", "st", "atom", "red", "ldmatrix", "stmatrix", "cp"):
            self._memory(pc, st, parts, gm)
            return
        if isinstance(gm, str):
            raise _Unknown("guard")
        if op.startswith("wgmma.mma_async"):
            self._wgmma(pc, st)
            self._forget(args)
            return
        if op.startswith("mbarrier.try_wait") or op.startswith("mbarrier.test_wait"):
            self._set(self._dests(args[0])[0], np.ones(self.n, dtype=U64), 1, gm)
            return
        if base in _FLOAT_OPS or ".".join(parts[:2]) in _FLOAT_OPS:
            self._forget(args)
            return
        if base not in ("mov", "selp", "cvt") and any(p in _FLOAT for p in parts[1:]):
            self._forget(args)
            return
        handler = getattr(self, f"_op_{base}", None)
        if handler is not None:
            handler(args, parts, gm)
            return
        self._integer(args, parts, gm)

    # ------------------------------------------------------------------- moves
    def _op_cvt(self, args, parts, gm) -> None:
        dt, st_ = parts[-2], parts[-1]
        if dt in _FLOAT or st_ in _FLOAT:
            self._forget(args)
            return
        x, sb, db = self._get(args[1]), _bits(st_), _bits(dt)
        v = _signed(x, sb).astype(U64) if st_.startswith("s") and db > sb else x & U64(_MASK[sb])
        self._set(args[0], v, db, gm)

    def _op_mov(self, args, parts, gm) -> None:
        d, s = args
        b = _bits(parts[-1]) or 64
        if d.startswith("{"):  # unpack a wide register into parts
            x, ds = self._get(s), self._dests(d)
            w = b // len(ds)
            for j, dd in enumerate(ds):
                if dd != "_":
                    self._set(dd, (x >> U64(w * j)) & U64(_MASK[w]), w, gm)
            return
        if s.startswith("{"):  # pack parts into a wide register
            ss = self._dests(s)
            w = b // len(ss)
            v = np.zeros(self.n, dtype=U64)
            for j, x in enumerate(ss):
                v |= (self._get(x) & U64(_MASK[w])) << U64(w * j)
            self._set(d, v, b, gm)
            return
        self._set(d, self._get(s), b, gm)

    def _op_selp(self, args, parts, gm) -> None:
        a, b, p = self._get(args[1]), self._get(args[2]), self._get(args[3]).astype(bool)
        self._set(args[0], np.where(p, a, b), _bits(parts[-1]) or 64, gm)

    def _op_setp(self, args, parts, gm) -> None:
        cmp_, t = parts[1], parts[2]
        if len(parts) > 3 and parts[3] in ("and", "or", "xor"):
            raise Unsupported(f"setp with a predicate operand: {'.'.join(parts)}")
        b = _bits(t)
        x, y = self._get(args[1]), self._get(args[2])
        if t.startswith("s"):
            x, y = _signed(x, b), _signed(y, b)
        else:
            x, y = x & U64(_MASK[b]), y & U64(_MASK[b])
        r = {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y,
             "ge": x >= y, "lo": x < y, "ls": x <= y, "hi": x > y, "hs": x >= y}[cmp_]
        ds = self._dests(args[0])
        self._set(ds[0], r.astype(U64), 1, gm)
        if len(ds) > 1:
            self._set(ds[1], (~r).astype(U64), 1, gm)

    def _op_shfl(self, args, parts, gm) -> None:
        mode = parts[2]
        a, b = self._get(args[1]), self._get(args[2]).astype(np.int64) & 0x1F
        c = self._get(args[3]).astype(np.int64)
        lane = np.arange(self.n, dtype=np.int64) % 32
        seg = (c >> 8) & 0x1F
        bound = (lane & seg) | ((c & 0x1F) & ~seg)
        j = {"idx": (lane & seg) | (b & ~seg), "bfly": lane ^ b, "up": lane - b,
             "down": lane + b}[mode]
        ok = j >= bound if mode == "up" else j <= bound
        j = np.where(ok, j, lane)
        ds = self._dests(args[0])
        self._set(ds[0], a[np.arange(self.n) - lane + j], 32, gm)
        if len(ds) > 1:
            self._set(ds[1], ok.astype(U64), 1, gm)

    # ------------------------------------------------------------------- integers
    def _integer(self, args, parts, gm) -> None:
        base, typ = parts[0], parts[-1]
        b = _bits(typ)
        if b is None:
            raise Unsupported(f"instruction {'.'.join(parts)}")
        if typ == "pred":
            xs = [self._get(a).astype(bool) for a in args[1:]]
            r = {"and": lambda: xs[0] & xs[1], "or": lambda: xs[0] | xs[1],
                 "xor": lambda: xs[0] ^ xs[1], "not": lambda: ~xs[0]}[base]()
            self._set(args[0], r.astype(U64), 1, gm)
            return
        m = U64(_MASK[b])
        xs = [self._get(a) for a in args[1:]]
        signed = typ.startswith("s")
        wide = len(parts) > 1 and parts[1] == "wide"
        if len(parts) > 1 and parts[1] == "hi":
            raise Unsupported(f"instruction {'.'.join(parts)}")
        if base in ("mul", "mad") and wide:
            p = (_signed(xs[0], b) * _signed(xs[1], b)).astype(U64) if signed else \
                (xs[0] & m) * (xs[1] & m)
            self._set(args[0], p + xs[2] if base == "mad" else p, 2 * b, gm)
            return
        if base == "add":
            r = xs[0] + xs[1]
        elif base == "sub":
            r = xs[0] - xs[1]
        elif base == "mul":
            r = xs[0] * xs[1]
        elif base == "mad":
            r = xs[0] * xs[1] + xs[2]
        elif base in ("div", "rem"):
            if signed:
                x, y = _signed(xs[0], b), _signed(xs[1], b)
                q = np.abs(x) // np.abs(y) * np.sign(x) * np.sign(y)
                r = (q if base == "div" else x - q * y).astype(U64)
            else:
                r = (xs[0] & m) // (xs[1] & m) if base == "div" else (xs[0] & m) % (xs[1] & m)
        elif base in ("min", "max"):
            f = np.minimum if base == "min" else np.maximum
            r = f(_signed(xs[0], b), _signed(xs[1], b)).astype(U64) if signed else \
                f(xs[0] & m, xs[1] & m)
        elif base == "neg":
            r = U64(0) - xs[0]
        elif base == "abs":
            r = np.abs(_signed(xs[0], b)).astype(U64)
        elif base in ("not", "and", "or", "xor"):
            r = {"not": lambda: ~xs[0], "and": lambda: xs[0] & xs[1],
                 "or": lambda: xs[0] | xs[1], "xor": lambda: xs[0] ^ xs[1]}[base]()
        elif base in ("shl", "shr"):
            sh = np.minimum(xs[1] & U64(0xFFFFFFFF), U64(b))
            s63 = np.minimum(sh, U64(63))
            if base == "shr" and signed:
                r = (_signed(xs[0], b) >> s63.astype(np.int64)).astype(U64)
            else:
                v = (xs[0] & m) << s63 if base == "shl" else (xs[0] & m) >> s63
                r = np.where(sh >= U64(b), U64(0), v)
        elif base == "bfe":
            pos, ln = xs[1] & U64(0xFF), xs[2] & U64(0xFF)
            keep = (U64(1) << ln) - U64(1)
            r = ((xs[0] & m) >> pos) & keep
            if signed:
                top = (r >> np.maximum(ln, U64(1)) - U64(1)) & U64(1)
                r = np.where((top == U64(1)) & (ln > U64(0)), r | ~keep, r)
        elif base == "prmt":  # bytes of {b, a} selected by the nibbles of c
            if len(parts) > 2:
                raise Unsupported(f"instruction {'.'.join(parts)}")
            pool = (xs[0] & U64(0xFFFFFFFF)) | ((xs[1] & U64(0xFFFFFFFF)) << U64(32))
            r = np.zeros(self.n, dtype=U64)
            for i in range(4):
                sel = (xs[2] >> U64(4 * i)) & U64(0xF)
                byte = (pool >> ((sel & U64(7)) * U64(8))) & U64(0xFF)
                byte = np.where(sel >= U64(8), np.where(byte >= U64(0x80), U64(0xFF), U64(0)),
                                byte)
                r |= byte << U64(8 * i)
        elif base == "bfi":
            pos, ln = xs[2] & U64(0xFF), xs[3] & U64(0xFF)
            keep = ((U64(1) << ln) - U64(1)) << pos
            r = (xs[1] & ~keep) | ((xs[0] << pos) & keep)
        else:
            raise Unsupported(f"instruction {'.'.join(parts)}")
        self._set(args[0], r, b, gm)

    # ------------------------------------------------------------------- memory
    def _address(self, arg: str) -> np.ndarray:
        m = _ADDR.fullmatch(arg)
        if m is None:
            raise Unsupported(f"address {arg}")
        return self._get(m.group(1)) + U64(int(m.group(2) or 0) & _MASK[64])

    def _memory(self, pc: int, st: Stmt, parts, gm) -> None:
        base, op, args, mem, where = parts[0], st.op, st.args, self.mem, (pc, st.loc, st.op)
        if gm is False:
            return
        unsure = isinstance(gm, str)  # unknown guard: check every thread, read nothing
        lanes = self.active if unsure else None if gm is None or gm is True else gm
        space = "shared" if ".shared" in op else "global" if ".global" in op else \
            "param" if ".param" in op else None
        if base == "ld" and space == "param":
            v = self.params.get(args[1].strip("[] "))
            if v is None:
                raise _Unknown(args[1])
            self._set(args[0], np.full(self.n, v & _MASK[64], dtype=U64), _bits(parts[-1]), gm)
            return
        if space is None:
            raise Unsupported(f"memory instruction {op} (state space)")
        if base in ("ldmatrix", "stmatrix"):
            addrs = self._address(args[1] if base == "ldmatrix" else args[0])
            mem.check_shared(where, addrs, 16, lanes)
            if base == "ldmatrix":
                self._forget(args)
            else:
                mem.forget_shared()
            return
        if base == "cp":  # cp.async.*.shared.global [dst], [src], cp-size[, src-size]
            n = int(args[2], 0)
            mem.check_shared(where, self._address(args[0]), n, lanes)
            mem.forget_shared()
            if len(args) > 3:  # src-size 0: fill with zeros, read nothing (masked lanes)
                reads = self._get(args[3]) > U64(0)
                lanes = reads if lanes is None else lanes & reads
            mem.check_global(where, self._address(args[1]), n, lanes)
            return
        w = _bits(parts[-1]) or 32
        vec = next((int(p[1]) for p in parts if p in ("v2", "v4", "v8")), 1)
        nbytes = vec * w // 8
        if base in ("atom", "red"):
            addrs = self._address(next(a for a in args if a.startswith("[")))
            if space == "shared":
                mem.check_shared(where, addrs, nbytes, lanes)
                mem.forget_shared()
            else:
                mem.check_global(where, addrs, nbytes, lanes)
            if base == "atom":
                self._forget(args)
            return
        if base == "ld":
            addrs, ds, vals = self._address(args[1]), self._dests(args[0]), None
            if space == "global":
                r = mem.check_global(where, addrs, nbytes, lanes)
                if r is not None and not unsure:
                    vals = mem.read_global(r, addrs, w, vec)
            elif mem.check_shared(where, addrs, nbytes, lanes) and not unsure:
                vals = mem.read_shared(addrs, w, vec, lanes)
            for j, d in enumerate(ds):
                self._set(d, None if vals is None else vals[j], w, None if unsure else gm)
            return
        if base == "st":
            addrs = self._address(args[0])
            if space == "global":
                mem.check_global(where, addrs, nbytes, lanes)
            elif mem.check_shared(where, addrs, nbytes, lanes):
                try:
                    vals = [self._get(s) for s in self._dests(args[1])]
                except _Unknown:
                    vals = None
                mem.write_shared(addrs, w, vec, None if unsure else vals, lanes)
            return
        raise Unsupported(f"memory instruction {op}")

    # ------------------------------------------------------------------- wgmma
    def _wgmma(self, pc: int, st: Stmt) -> None:
        """Check the shared-memory tiles a wgmma reads through its descriptors."""
        m = re.search(r"\.m(\d+)n(\d+)k(\d+)\.\w+\.(\w+)\.(\w+)", st.op)
        if m is None:
            raise Unsupported(f"wgmma shape in {st.op}")
        M, N, K = map(int, m.groups()[:3])
        ta, tb = m.group(4), m.group(5)
        a_desc = not st.args[1].startswith("{")
        transposable = ta in ("bf16", "f16")
        imm = (st.args[-2:] if a_desc else st.args[-1:]) if transposable else ()
        trans = {"A": bool(imm) and a_desc and imm[0] == "1", "B": bool(imm) and imm[-1] == "1"}
        operands = ([("A", st.args[1], M, _ELEM[ta])] if a_desc else []) + \
            [("B", st.args[2], N, _ELEM[tb])]
        for name, reg, mn, elem in operands:
            for d in np.unique(self._get(reg)):  # one per warpgroup
                self.mem.check_tile((pc, st.loc, st.op), name, int(d), mn, K, elem,
                                    trans[name])


