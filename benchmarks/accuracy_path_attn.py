"""Accuracy of `pathattn.path_attn` in float32 against the float64 references.

For each configuration, the output and the gradient of sum(o * do) with respect to every
input (q, k, v, w, beta, g) are computed by path_attn in float32 (fused C++ CPU kernels,
and with --torch-scan also the PyTorch ops, PATHATTN_CPU_KERNEL=0) and by the float64
reference, and the relative error ||ours - ref|| / ||ref|| of each is printed. The
reference is `path_attn_naive` (tokens one at a time) up to T = 512 and
`path_attn_full_matrix` (the masked UT form, T x T) above.

    python benchmarks/accuracy_path_attn.py                # the grid, T = 2048 and 4096
    python benchmarks/accuracy_path_attn.py --torch-scan   # also without the C++ kernels
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from pathattn import path_attn
from pathattn.ops import path_attn_full_matrix, path_attn_naive

NAMES = ("o", "q", "k", "v", "w", "beta", "g")
# B, T, HQ, H, D, Dv, gates, cu_seqlens
CONFIGS = [
    (2, 65, 4, 2, 64, 64, True, None),
    (2, 300, 4, 2, 16, 32, False, None),
    (1, 300, 2, 2, 48, 48, True, (0, 1, 130, 131, 300)),
    (1, 300, 8, 2, 128, 64, True, None),
    (1, 2048, 2, 2, 64, 64, True, None),
    (1, 2048, 2, 2, 64, 64, False, None),
    (1, 4096, 2, 2, 64, 64, True, None),  # the C++ kernels' 256-token blocks
]


def inputs(B, T, HQ, H, D, Dv, gates, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen)
    k = torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H, Dv, generator=gen)
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HQ, generator=gen) + 2) if gates else None
    do = torch.randn(B, T, HQ, Dv, generator=gen)
    return (q, k, v, w, beta, g), do


def run(fn, xs, do, dtype, **kw):
    leaves = [None if x is None else x.to(dtype).requires_grad_() for x in xs]
    o = fn(*leaves, **kw)
    used = [x for x in leaves if x is not None]
    grads = iter(torch.autograd.grad(o, used, do.to(o.dtype), materialize_grads=True))
    return [o] + [None if x is None else next(grads) for x in leaves]


def rel(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch-scan", action="store_true",
                   help="also measure path_attn without the C++ kernels")
    args = p.parse_args(argv)
    variants = [("kernels", "1")] + ([("torch ops", "0")] if args.torch_scan else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; relative errors "
          f"||ours - ref|| / ||ref|| of float32 path_attn vs float64 reference")
    print(f"{'config':46s} {'path':9s} " + " ".join(f"{n:>8s}" for n in NAMES))
    worst = 0.0
    for B, T, HQ, H, D, Dv, gates, cu in CONFIGS:
        xs, do = inputs(B, T, HQ, H, D, Dv, gates)
        kw = {} if cu is None else {"cu_seqlens": torch.tensor(cu)}
        ref_fn = path_attn_naive if T <= 512 else path_attn_full_matrix
        ref = run(ref_fn, xs, do, torch.float64, **kw)
        name = f"B{B} T{T} HQ{HQ} H{H} D{D} Dv{Dv} {'gates' if gates else 'nogates'}"
        name += " cu" if cu else ""
        for label, flag in variants:
            os.environ["PATHATTN_CPU_KERNEL"] = flag
            ours = run(path_attn, xs, do, torch.float32, **kw)
            errs = [None if r is None else rel(x, r) for x, r in zip(ours, ref, strict=True)]
            worst = max(worst, *(e for e in errs if e is not None))
            cells = " ".join(f"{'-':>8s}" if e is None else f"{e:8.1e}" for e in errs)
            print(f"{name:46s} {label:9s} {cells}", flush=True)
    os.environ.pop("PATHATTN_CPU_KERNEL", None)
    print(f"largest relative error: {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
