"""PTX text of one kernel as statements: the parsing shared by `ptx_emulator`.

`statements(ptx)` returns the entry function's instructions in order as `Stmt` (guard,
opcode, operands, source location from the line table) and the index of each label.
Labels inside inline-assembly braces are renamed per scope (Triton's mbarrier wait loops
reuse one label name), and branch targets resolve innermost scope first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Stmt", "statements", "entry_params", "post_dominator_joins"]

_TOKEN = re.compile(r"//[^\n]*|/\*.*?\*/|[{};]|[^{};/]+|/", re.S)
_LABEL = re.compile(r"^\s*([$%\w]+):(?!:)\s*(.*)$", re.S)
_LOC = re.compile(r"//\s*(\S+\.py:\d+)")
_GUARD = re.compile(r"^@(!?)([%\w]+)\s+")
_PARAM = re.compile(r"\.param\s+\.\w+(?:\s+\.ptr)?(?:\s+\.global)?(?:\s+\.align\s+\d+)?\s+(\w+)")


@dataclass(frozen=True)
class Stmt:
    """One instruction: guard (predicate register, negated) or None, opcode with its
    modifiers, operands as written (vectors "{%r1, %r2}", addresses "[%rd1+16]"), and the
    kernel source line it came from ("bwd.py:250", or "")."""

    guard: tuple[str, bool] | None
    op: str
    args: tuple[str, ...]
    loc: str


def _body(ptx: str) -> str:
    start = ptx.index("{", ptx.index(")", ptx.index(".entry")))
    depth = 0
    for i in range(start, len(ptx)):
        depth += {"{": 1, "}": -1}.get(ptx[i], 0)
        if depth == 0:
            return ptx[start + 1:i]
    raise ValueError("unbalanced braces in the PTX")


def entry_params(ptx: str) -> list[str]:
    """Names of the entry function's parameters, in order."""
    head = ptx[ptx.index(".entry"):]
    return _PARAM.findall(head[:head.index(")")])


def _operands(text: str) -> tuple[str, ...]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += 1 if ch in "{[" else -1 if ch in "}]" else 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return tuple(out + [cur.strip()] if cur.strip() else out)


def statements(ptx: str) -> tuple[list[Stmt], dict[str, int]]:
    """(instructions, label -> index of the instruction it precedes) of the entry
    function; directives and declarations are dropped. A label inside inline-assembly
    braces is named "scope/label"."""
    raw, scopes, n_scopes, text, braces, loc = [], [0], 0, "", 0, ""
    for line in _body(ptx).splitlines():
        if line.strip().startswith((".loc", ".file")):  # one line each, no ';'
            loc = m.group(1) if (m := _LOC.search(line)) else loc
            continue
        for tok in _TOKEN.findall(line + "\n"):
            if tok.startswith(("//", "/*")):
                continue
            if tok == "{" and not text.strip():
                n_scopes += 1
                scopes.append(n_scopes)
            elif tok == "}" and not braces:
                scopes.pop()
            elif tok in "{}":
                braces += 1 if tok == "{" else -1
                text += tok
            elif tok == ";":
                raw.append((text.strip(), tuple(scopes), loc))
                text = ""
            else:
                text += tok
                while not braces and (m := _LABEL.match(text)):
                    raw.append((":" + m.group(1), tuple(scopes), loc))
                    text = m.group(2)
    defined = {(sc[-1], s[1:]) for s, sc, _ in raw if s.startswith(":")}

    def resolve(name: str, sc: tuple) -> str:  # "scope/name" inside inline-asm braces
        return next((f"{s}/{name}" if s else name for s in reversed(sc)
                     if (s, name) in defined), name)

    stmts: list[Stmt] = []
    labels: dict[str, int] = {}
    for s, sc, lc in raw:
        if s.startswith(":"):
            labels[resolve(s[1:], sc[-1:])] = len(stmts)
            continue
        if not s or s.startswith("."):
            continue
        guard = None
        if m := _GUARD.match(s):
            guard, s = (m.group(2), m.group(1) == "!"), s[m.end():]
        op, *rest = s.split(None, 1)
        args = _operands(rest[0]) if rest else ()
        if op.startswith("bra"):
            args = args[:-1] + (resolve(args[-1], sc),)
        stmts.append(Stmt(guard, op, args, lc))
    return stmts, labels


def post_dominator_joins(stmts: list[Stmt], labels: dict[str, int]) -> dict[int, int | None]:
    """For each conditional branch (statement index): the first statement of its block's
    immediate post-dominator, where the two sides meet again; None if only at the end.
    Inline-assembly wait loops ("scope/label" targets) count as falling through."""
    n = len(stmts)
    leaders = sorted({0, *(i for i in labels.values() if i < n)} |
                     {i + 1 for i, s in enumerate(stmts)
                      if s.op.split(".")[0] in ("bra", "ret", "exit") and i + 1 < n})
    block_of, starts = {}, leaders
    for b, (lo, hi) in enumerate(zip(leaders, leaders[1:] + [n], strict=True)):
        for i in range(lo, hi):
            block_of[i] = b
    exit_ = len(starts)
    succ = []
    for b in range(len(starts)):
        hi = starts[b + 1] if b + 1 < len(starts) else n
        last = stmts[hi - 1]
        nxt = {block_of[hi]} if hi < n else {exit_}
        base = last.op.split(".")[0]
        if base == "bra" and "/" not in last.args[-1]:
            t = labels[last.args[-1]]
            tgt = {block_of[t]} if t < n else {exit_}
            succ.append(tgt | nxt if last.guard else tgt)
        elif base in ("ret", "exit"):
            succ.append({exit_} | nxt if last.guard else {exit_})
        else:
            succ.append(nxt)
    full = (1 << (exit_ + 1)) - 1
    pdom = [full] * exit_ + [1 << exit_]
    changed = True
    while changed:
        changed = False
        for b in range(exit_ - 1, -1, -1):
            meet = full
            for s_ in succ[b]:
                meet &= pdom[s_]
            new = meet | (1 << b)
            if new != pdom[b]:
                pdom[b], changed = new, True
    joins = {}
    for i, st in enumerate(stmts):
        if st.op.split(".")[0] == "bra" and st.guard and "/" not in st.args[-1]:
            b = block_of[i]
            strict = [d for d in range(exit_ + 1) if pdom[b] >> d & 1 and d != b]
            ipdom = max(strict, key=lambda d: bin(pdom[d]).count("1"))
            joins[i] = None if ipdom == exit_ else starts[ipdom]
    return joins
