"""One-shot GPU check of PaTH attention, to run once before and once after a kernel change:
about 9 minutes on an H100, every Triton compilation included.

Sections, cheapest and most important first. Each one is guarded (an error is recorded and
the run goes on), and after the global deadline (--budget seconds from the start) the ones
left are recorded as skipped:

  environment   GPU, torch / triton / ptxas / fla versions, pathattn's git revision
  first_call    seconds of the first forward + backward of path_attn(backend="triton") per
                dtype at a small shape (compilation), each dtype in its own subprocess with
                a timeout, the three side by side, the CPUs shared among them (each
                compiles its kernels on PATHATTN_COMPILE_THREADS threads)
  triage        every kernel variant (head dim, gates, GQA, dense / packed) once at a small
                size, each in its own process with CUDA_LAUNCH_BLOCKING=1: which ones fault
                and where (compute-sanitizer's memcheck on the smallest failing one), and
                their errors against the float64 op (`_gpu_triage.py`)
  speed         forward and forward + backward ms of flash SDPA, fla and ours, ratios, peak
                extra memory of forward + backward
  pipelining    forward and forward + backward ms per pipeline depth of each scan kernel's
                loop over earlier segments, against the defaults (`_gpu_pipe.py`)
  lm_step       step seconds of a 760M PaTHLM per attention type, ratio to rope
  profile       the top CUDA kernels of one forward + backward of ours and of fla's
  correctness   relative errors of o and of every gradient against the float64 op, for the
                Triton kernels, plain PyTorch at the same precision and fla
  fox_kernels   FoX's gated FlashAttention kernels: errors against float64, ms against
                flash SDPA and fla (`_gpu_fox.py`)
  sba_kernels   stick-breaking kernels: the same (`_gpu_sba.py`)
  generate      ms per token of generate() after a 2048-token prompt against transformers'
                Llama of the same size (`_gpu_lm.py`)
  launch_settings  forward and forward + backward ms with one launch setting changed
                (block length, blocks per segment, warps, the key kernel's tiles) against
                the defaults, each row in its own process (`_gpu_launch.py`)
  lm_commands   pretrain / convert / eval ppl / eval longctx on the GPU for a few steps,
                loss curves against the same runs on CPU in float32 (`_gpu_lm.py`)

Results go to --out: gpu_check.json and gpu_check.md, both rewritten after every row, so a
run cut short keeps what it measured. --quick runs fewer shapes; --cpu-smoke runs every
section's plumbing at tiny sizes on the CPU (Triton's interpreter, SDPA's math backend, the
"tiny" model preset, no CUDA profile). Triton compiles into a fresh cache folder
(--triton-cache to reuse one), so the first calls are cold. benchmarks/README.md has the
device command and how to read the output.

    PYTHONPATH=. python benchmarks/gpu_check.py --out benchmarks/out/gpu_check
    python benchmarks/gpu_check.py --cpu-smoke --out /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# torch, pathattn and triton are imported after the environment is set (TRITON_INTERPRET and
# TRITON_CACHE_DIR must be set before triton is imported; pathattn imports it)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "gpu_check")
    p.add_argument("--budget", type=float, default=500.0,
                   help="seconds from the start after which the sections left are skipped")
    p.add_argument("--quick", action="store_true", help="fewer shapes in every section")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="every section at tiny sizes on the CPU (checks the script runs)")
    p.add_argument("--label", default="", help="a name for this run (e.g. before / after)")
    p.add_argument("--sections", nargs="+", default=None, metavar="NAME",
                   help="run only these sections (the others are recorded as not asked)")
    p.add_argument("--triton-cache", type=Path, default=None,
                   help="Triton cache folder to use (default: a fresh one, cold compiles)")
    p.add_argument("--child-first-call", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-triage", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-launch", default=None, type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def prepare_env(args: argparse.Namespace) -> Path | None:
    """Set the variables triton reads at import; returns the cache folder made here (to be
    deleted at the end), or None."""
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # the Triton kernels on the CPU interpreter
        os.environ.setdefault("PATHATTN_CPU_KERNEL", "0")  # no C++ build in the smoke run
    root = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    if root not in path.split(os.pathsep):  # the first-call subprocesses import pathattn
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
    if any(x is not None for x in (args.child_first_call, args.child_triage,
                                    args.child_launch)):
        return None  # the parent's cache folder, inherited
    if args.triton_cache is not None:
        os.environ["TRITON_CACHE_DIR"] = str(args.triton_cache)
        return None
    made = Path(tempfile.mkdtemp(prefix="gpu_check_triton_"))
    os.environ["TRITON_CACHE_DIR"] = str(made)
    return made


def main(argv=None) -> int:
    start = time.time()
    args = parse_args(argv)
    made = prepare_env(args)
    import _gpu_sections as sections  # benchmarks/ is on sys.path; imports torch

    if args.child_first_call is not None:
        return sections.child_first_call(args)
    if args.child_triage is not None:
        return sections.child_triage(args)
    if args.child_launch is not None:
        return sections.child_launch(args)
    try:
        return sections.run(args, start)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
