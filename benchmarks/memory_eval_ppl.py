"""Peak host memory of `pathattn eval ppl` (`pathattn.evaluation.ppl.evaluate_ppl`) on one
window of T tokens, against T: linear for a PaTH model.

For every T a fresh child process (this script with --child) is started, so the ru_maxrss
high-water marks of different lengths never mix. The child

1. builds a randomly initialised `PaTHForCausalLM` of the cpu-tiny preset (the attention
   type and vocabulary size are options) and a random token stream of T + 1 ids,
2. evaluates one window of 256 tokens, so torch, the allocator and the op's lazy setup are
   initialised,
3. records resource.getrusage(RUSAGE_SELF).ru_maxrss (the baseline: interpreter, torch,
   model),
4. evaluates the window of T tokens (`evaluate_ppl(model, stream, [T])`, batch 1, the LM
   head in chunks of --chunk-size tokens),
5. records ru_maxrss again,
6. evaluates the same window once more under `torch.profiler` (profile_memory=True) and
   adds up the tensor allocations and frees in time order: the peak of live tensor
   memory, exact and free of allocator effects (an op's allocations are counted at its
   start).

The children run with glibc's MALLOC_MMAP_THRESHOLD_=65536 and MALLOC_TRIM_THRESHOLD_=0:
blocks of 64 KiB and more come from mmap and freed memory goes back to the system, so the
RSS high-water mark follows the peak of live memory. (Without them the evaluation first
reuses heap memory freed by the imports and the model's construction, which hides part of
the cost at small T and makes the increase look super-linear.)

It reports the peak RSS, its increase over the baseline (what the evaluation itself
needs, page-granular, allocator caches included) and the peak of live tensor memory. The
parent prints them for every T and their ratios between the longest T and the shortest; it
exits with status 1 when the peak RSS ratio or the tensor peak ratio is above --max-ratio
(default 4, the length ratio of 16384 / 4096: memory that grew like T x T would give 16).

    python benchmarks/memory_eval_ppl.py                        # T = 4096, 8192, 16384
    python benchmarks/memory_eval_ppl.py --seq-lens 4096 16384 --chunk-size 0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _env import maxrss_mib  # benchmarks/ is on sys.path

DEFAULT_SEQ_LENS = (4096, 8192, 16384)
WARMUP_T = 256
RESULT_TAG = "RESULT "
MIB = 2**20
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(DEFAULT_SEQ_LENS),
                   metavar="T", help="window lengths (default 4096 8192 16384)")
    p.add_argument("--attn", default="path", help="attention type (default path)")
    p.add_argument("--vocab-size", type=int, default=1024, help="vocabulary (default 1024)")
    p.add_argument("--chunk-size", type=int, default=512,
                   help="tokens per LM-head chunk, 0 = all logits at once (default 512)")
    p.add_argument("--max-ratio", type=float, default=4.0,
                   help="fail if the peak RSS or the tensor peak at the longest T is more "
                   "than this times that at the shortest (default 4)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the results to this JSON file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- child side

def run_child(args: argparse.Namespace) -> None:
    """Measure one T and print a RESULT line with JSON for the parent."""
    import torch

    from pathattn.evaluation.ppl import evaluate_ppl
    from pathattn.hf import PaTHConfig, PaTHForCausalLM
    from pathattn.models import ModelConfig

    torch.manual_seed(0)
    T, chunk = args.seq_len, args.chunk_size or None
    config = ModelConfig.preset("cpu-tiny", vocab_size=args.vocab_size, attn_type=args.attn)
    model = PaTHForCausalLM(PaTHConfig.from_model_config(config)).eval()
    stream = torch.randint(0, args.vocab_size, (T + 1,), generator=torch.Generator()
                           .manual_seed(T)).numpy()
    evaluate_ppl(model, stream[:WARMUP_T + 1], [WARMUP_T], chunk_size=chunk)
    before = maxrss_mib()
    t0 = time.perf_counter()
    res = evaluate_ppl(model, stream, [T], chunk_size=chunk)
    seconds = time.perf_counter() - t0
    after = maxrss_mib()
    tensors = peak_tensor_mib(lambda: evaluate_ppl(model, stream, [T], chunk_size=chunk))
    print(RESULT_TAG + json.dumps({"T": T, "baseline_mib": before, "peak_mib": after,
                                   "increase_mib": after - before, "tensor_peak_mib": tensors,
                                   "seconds": seconds, "loss": res["loss"][T]}), flush=True)


def peak_tensor_mib(fn) -> float:
    """Peak of live CPU tensor memory allocated while fn() runs, in MiB (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                     if e.self_cpu_memory_usage)
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return peak / MIB


# ----------------------------------------------------------------------------- parent side

def measure(T: int, args: argparse.Namespace) -> dict:
    """Run one measurement in a fresh subprocess and parse its RESULT line."""
    cmd = [sys.executable, __file__, "--child", "--seq-len", str(T), "--attn", args.attn,
           "--vocab-size", str(args.vocab_size), "--chunk-size", str(args.chunk_size)]
    env = {**os.environ, **MALLOC_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"child T={T} failed (rc {proc.returncode}):\n{proc.stderr}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"child T={T} printed no result:\n{proc.stdout}\n{proc.stderr}")


def run_parent(args: argparse.Namespace) -> int:
    import torch

    chunk = args.chunk_size or "all"
    print(f"torch {torch.__version__} | evaluate_ppl on one window, fresh process per T | "
          f"cpu-tiny attn={args.attn} V={args.vocab_size} head chunk={chunk} float32")
    rows = [measure(T, args) for T in sorted(args.seq_lens)]
    print(f"{'T':>6} | {'baseline MiB':>12} | {'peak MiB':>9} | {'increase MiB':>12} | "
          f"{'tensor peak MiB':>15} | {'seconds':>7}")
    for r in rows:
        print(f"{r['T']:>6} | {r['baseline_mib']:>12.1f} | {r['peak_mib']:>9.1f} | "
              f"{r['increase_mib']:>12.1f} | {r['tensor_peak_mib']:>15.2f} | "
              f"{r['seconds']:>7.2f}")
    lo, hi = rows[0], rows[-1]
    ratios = {name: hi[key] / max(lo[key], 1e-9) for name, key in (
        ("peak", "peak_mib"), ("increase", "increase_mib"), ("tensor peak", "tensor_peak_mib"))}
    print(f"T {hi['T']} / {lo['T']} = {hi['T'] / lo['T']:g}: " + ", ".join(
        f"{name} ratio {value:.2f}" for name, value in ratios.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": rows, "ratios": ratios}, f,
                      indent=2)
        print(f"wrote {args.json}")
    ok = ratios["peak"] <= args.max_ratio and ratios["tensor peak"] <= args.max_ratio
    print(f"check: peak ratio {ratios['peak']:.2f}, tensor peak ratio "
          f"{ratios['tensor peak']:.2f}, limit {args.max_ratio:g}: {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    return run_parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
