"""Peak extra host memory of forward+backward of `pathattn.path_attn` (vs causal SDPA).

For every (op, T) pair a fresh child process (this script with --child) is started, so the
ru_maxrss high-water marks of different runs never mix. The child

1. creates the inputs at the target T (B=1, H heads, head dim D, float32),
2. runs a small fwd+bwd warm-up at T=256 so torch, the allocator and the op's lazy setup are
   initialised,
3. records resource.getrusage(RUSAGE_SELF).ru_maxrss,
4. runs forward+backward at the target T (fixed random output gradient),
5. records ru_maxrss again and reports the increase in MiB.

The increase is what the op itself needs on top of its inputs: activations, saved tensors,
temporaries and the input gradients. SDPA is pinned to its flash backend (no T x T math
fallback) and serves as the O(T) reference. For scale, each row also shows the size of one
T x T float32 matrix. The script exits with status 1 if PaTH's increase at T = --limit-seq-len
(default 16384) is >= --limit-mib (default 256).

    python benchmarks/memory_path_attn.py                  # T = 4096, 8192, 16384
    python benchmarks/memory_path_attn.py --seq-lens 4096  # one quick point
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _env import maxrss_mib  # benchmarks/ is on sys.path

DEFAULT_SEQ_LENS = (4096, 8192, 16384)
WARMUP_T = 256
OPS = ("path", "sdpa")
RESULT_TAG = "RESULT "
MIB = 2**20


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(DEFAULT_SEQ_LENS),
                   metavar="T", help="sequence lengths (default 4096 8192 16384)")
    p.add_argument("--heads", type=int, default=1, help="heads H = HQ (default 1)")
    p.add_argument("--dim", type=int, default=64, help="head dim D = Dv (default 64)")
    p.add_argument("--block-size", type=int, default=None,
                   help="block_size passed to path_attn (default: the op's default)")
    p.add_argument("--gates", action="store_true", help="measure PaTH-FoX (with forget gates)")
    p.add_argument("--limit-mib", type=float, default=256.0,
                   help="fail if PaTH's increase at --limit-seq-len is >= this (default 256)")
    p.add_argument("--limit-seq-len", type=int, default=16384,
                   help="T at which --limit-mib is checked (default 16384)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the results to this JSON file")
    # internal: one measurement in this process (used by the parent)
    p.add_argument("--child", choices=OPS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- child side


def make_inputs(T: int, H: int, D: int, gates: bool) -> dict:
    """PaTH inputs [B=1, T, H, D] plus a fixed output gradient `do`."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(T)
    shape = (1, T, H, D)
    x = {n: torch.randn(*shape, generator=gen) for n in ("q", "k", "v", "do")}
    x["w"] = F.normalize(torch.randn(*shape, generator=gen), dim=-1)
    x["beta"] = 2 * torch.rand(1, T, H, generator=gen)
    x["g"] = F.logsigmoid(torch.randn(1, T, H, generator=gen) + 3) if gates else None
    return x


def prepare(op: str, x: dict) -> tuple[dict, object]:
    """Leaf tensors (requires_grad) in the op's layout and the output gradient."""
    if op == "sdpa":  # SDPA layout [B, H, T, D], converted before the measurement
        leaves = {n: x[n].transpose(1, 2).contiguous().requires_grad_() for n in "qkv"}
        return leaves, x["do"].transpose(1, 2).contiguous()
    names = ("q", "k", "v", "w", "beta", "g")
    leaves = {n: (None if x[n] is None else x[n].requires_grad_()) for n in names}
    return leaves, x["do"]


def fwd_bwd(op: str, leaves: dict, do, block_size: int | None) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from pathattn import path_attn

    if op == "sdpa":
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(leaves["q"], leaves["k"], leaves["v"],
                                               is_causal=True)
    else:
        o = path_attn(**leaves, block_size=block_size)
    o.backward(do)


def run_child(args: argparse.Namespace) -> None:
    """Measure one (op, T) and print a RESULT line with JSON for the parent."""
    op, T = args.child, args.seq_len
    target = prepare(op, make_inputs(T, args.heads, args.dim, args.gates))
    warm = prepare(op, make_inputs(WARMUP_T, args.heads, args.dim, args.gates))
    fwd_bwd(op, *warm, args.block_size)
    del warm
    before = maxrss_mib()
    t0 = time.perf_counter()
    fwd_bwd(op, *target, args.block_size)
    seconds = time.perf_counter() - t0
    after = maxrss_mib()
    res = {"op": op, "T": T, "before_mib": before, "after_mib": after,
           "increase_mib": after - before, "seconds": seconds}
    print(RESULT_TAG + json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- parent side


def child_command(op: str, T: int, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, __file__, "--child", op, "--seq-len", str(T),
           "--heads", str(args.heads), "--dim", str(args.dim)]
    if args.block_size is not None:
        cmd += ["--block-size", str(args.block_size)]
    if args.gates:
        cmd.append("--gates")
    return cmd


def measure(op: str, T: int, args: argparse.Namespace) -> dict:
    """Run one measurement in a fresh subprocess and parse its RESULT line."""
    proc = subprocess.run(child_command(op, T, args), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child {op} T={T} failed (rc {proc.returncode}):\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"child {op} T={T} printed no result:\n{proc.stdout}\n{proc.stderr}")


def txt_matrix_mib(T: int) -> float:
    """Size of one T x T float32 matrix in MiB."""
    return T * T * 4 / MIB


def format_table(rows: list[dict]) -> str:
    cols = ["T", "path +MiB", "sdpa +MiB", "T x T fp32 MiB", "path / TxT", "path s", "sdpa s"]
    cells = [[str(r["T"]), f"{r['path']['increase_mib']:.1f}", f"{r['sdpa']['increase_mib']:.1f}",
              f"{txt_matrix_mib(r['T']):.0f}",
              f"{r['path']['increase_mib'] / txt_matrix_mib(r['T']):.3f}",
              f"{r['path']['seconds']:.2f}", f"{r['sdpa']['seconds']:.2f}"] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]

    def fmt(line: list[str]) -> str:
        return " | ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))

    head = fmt(cols)
    return "\n".join([head, "-" * len(head), *map(fmt, cells)])


def check_limit(rows: list[dict], args: argparse.Namespace) -> bool:
    """True if the limit holds (or was not measured)."""
    hit = [r for r in rows if r["T"] == args.limit_seq_len]
    if not hit:
        print(f"limit check skipped: T={args.limit_seq_len} not measured")
        return True
    inc = hit[0]["path"]["increase_mib"]
    ok = inc < args.limit_mib
    verdict = "OK" if ok else "FAIL"
    print(f"limit check: PaTH increase at T={args.limit_seq_len} is {inc:.1f} MiB "
          f"({'<' if ok else '>='} {args.limit_mib:g} MiB): {verdict}")
    return ok


def run_parent(args: argparse.Namespace) -> int:
    import torch

    fox = " (PaTH-FoX, with gates)" if args.gates else ""
    print(f"torch {torch.__version__} | peak RSS increase of one fwd+bwd, fresh process per "
          f"run | B=1 H={args.heads} D={args.dim} float32{fox}")
    rows = []
    for T in args.seq_lens:
        row = {"T": T, **{op: measure(op, T, args) for op in OPS}}
        rows.append(row)
        print(f"  T={T}: path +{row['path']['increase_mib']:.1f} MiB, "
              f"sdpa +{row['sdpa']['increase_mib']:.1f} MiB; one T x T float32 matrix would "
              f"be {txt_matrix_mib(T):.0f} MiB", flush=True)
    print()
    print(format_table(rows))
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0 if check_limit(rows, args) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    return run_parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
