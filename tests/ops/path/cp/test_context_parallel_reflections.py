"""context_parallel_path_attn with R reflections per token (w [B, T, H, R, D]) on 2 gloo
processes: forward and every gradient equal the single-process op (float32, 1e-5
relative) and the float64 naive reference (float64, 1e-10). The ring only carries the
shards' UT terms, which do not depend on R.
"""

from __future__ import annotations

import pytest
import torch

from pathattn.distributed import context_parallel_path_attn
from pathattn.ops import path_attn, path_attn_naive
from tests.distributed._launch import launch
from tests.ops.path._helpers import (
    NAMES,
    make_dout,
    make_reflection_inputs,
    rel_err,
    run_with_grads,
)

# (id, B, HQ, H, D, Dv, R, gates, block size, shard lengths)
CASES = [
    ("R2-gates-gqa", 2, 4, 2, 8, 8, 2, True, 8, (12, 20)),
    ("R3-nogates-mha", 1, 2, 2, 8, 6, 3, False, 8, (9, 15)),
]


def _compare(rank: int, dtype, reference) -> dict:
    out = {}
    for case_id, B, HQ, H, D, Dv, R, gates, C, lens in CASES:
        T = sum(lens)
        inputs = make_reflection_inputs(B, T, HQ, H, D, Dv, R, gates, dtype, seed=len(case_id))
        dout = make_dout(B, T, HQ, Dv).to(dtype)
        o_ref, g_ref = run_with_grads(reference, inputs, dout)
        lo = sum(lens[:rank])
        hi = lo + lens[rank]
        shard = tuple(None if x is None else x[:, lo:hi] for x in inputs)
        o, grads = run_with_grads(context_parallel_path_attn, shard, dout[:, lo:hi],
                                  block_size=C)
        errs = {"o": rel_err(o, o_ref[:, lo:hi])}
        for name, got, ref in zip(NAMES, grads, g_ref, strict=True):
            if ref is not None:
                errs["d" + name] = rel_err(got, ref[:, lo:hi])
        out[case_id] = errs
    return out


def _worker(rank: int, world_size: int) -> dict:
    return {"float32": _compare(rank, torch.float32, path_attn),
            "float64": _compare(rank, torch.float64, path_attn_naive)}


@pytest.fixture(scope="module")
def results():
    return launch(_worker, 2)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-10)])
def test_matches_single_process(results, dtype, tol):
    for case_id, *_ in CASES:
        for rank, res in enumerate(results):
            errs = res[dtype][case_id]
            assert max(errs.values()) < tol, f"{case_id} rank {rank}: {errs}"
