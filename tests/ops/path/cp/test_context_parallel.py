"""context_parallel_path_attn on 2 and 3 gloo processes against the single-process op.

Each worker computes the single-process `path_attn` on the full sequence itself (same
seeded inputs) and compares its own rows; forward and every gradient must agree within
1e-5 relative in float32, and to float64 rounding against the float64 reference
`path_attn_naive` in float64 (which shows the algorithm, not just the tolerance, is exact).
"""

from __future__ import annotations

import pytest
import torch

from pathattn.distributed import context_parallel_path_attn
from pathattn.ops import path_attn, path_attn_naive
from tests.distributed._launch import launch
from tests.ops.path._helpers import NAMES, make_dout, make_inputs, rel_err, run_with_grads

# (id, B, HQ, H, D, Dv, gates, block size, shard lengths)
CASES_2 = [
    ("gates-gqa-equal", 2, 4, 2, 8, 8, True, 8, (24, 24)),
    ("nogates-mha-equal", 1, 2, 2, 8, 6, False, 8, (20, 20)),
    ("gates-mqa-uneven", 2, 4, 1, 8, 8, True, 16, (9, 31)),
    ("gates-one-block", 1, 2, 2, 16, 16, True, 128, (13, 13)),
]
CASES_3 = [
    ("gates-gqa-equal", 2, 4, 2, 8, 8, True, 8, (16, 16, 16)),
    ("nogates-gqa-uneven", 1, 4, 2, 8, 8, False, 8, (7, 30, 13)),
    ("gates-mha-single-token-shard", 1, 2, 2, 8, 8, True, 8, (10, 1, 12)),
]


def _compare(rank: int, world_size: int, cases, dtype, reference: str) -> dict:
    """Worker: max relative error of the forward and each gradient, per case id."""
    out = {}
    for case_id, B, HQ, H, D, Dv, gates, C, lens in cases:
        assert len(lens) == world_size
        T = sum(lens)
        inputs = make_inputs(B, T, HQ, H, D, Dv, gates=gates, dtype=dtype, seed=len(case_id))
        dout = make_dout(B, T, HQ, Dv).to(dtype)
        if reference == "op":
            o_ref, g_ref = run_with_grads(path_attn, inputs, dout)
        else:
            o_ref, g_ref = run_with_grads(path_attn_naive, inputs, dout)
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


def _check(results, cases, tol):
    for case_id, *_ in cases:
        for rank, res in enumerate(results):
            worst = max(res[case_id].values())
            assert worst < tol, f"{case_id} rank {rank}: {res[case_id]}"


def _mismatch(rank: int, world_size: int) -> str:
    """Worker: rank 1 passes a different head dim; every rank must raise."""
    D = 8 if rank == 0 else 16
    q, k, v, w, beta, g = make_inputs(1, 6, 2, 2, D, 8, gates=True)
    try:
        context_parallel_path_attn(q, k, v, w, beta, g)
    except ValueError as e:
        return str(e)
    return "no error"


def _one_bad_rank(rank: int, world_size: int) -> str:
    """Worker: rank 0's beta has a wrong shape; every rank must raise."""
    q, k, v, w, beta, g = make_inputs(1, 6, 2, 2, 8, 8, gates=False)
    if rank == 0:
        beta = beta[:, :, :1]
    try:
        context_parallel_path_attn(q, k, v, w, beta, g)
    except ValueError as e:
        return str(e)
    return "no error"


def _worker(rank: int, world_size: int) -> dict:
    """Everything one process group checks (one launch per world size: process start-up,
    mostly `import torch`, dominates the run time)."""
    cases = CASES_2 if world_size == 2 else CASES_3
    return {"float32": _compare(rank, world_size, cases, torch.float32, "op"),
            "float64": _compare(rank, world_size, cases[:2], torch.float64, "naive"),
            "mismatch": _mismatch(rank, world_size),
            "bad_rank": _one_bad_rank(rank, world_size)}


@pytest.fixture(scope="module", params=[2, 3], ids=["P2", "P3"])
def group_results(request):
    return request.param, launch(_worker, request.param)


def test_matches_single_process_float32(group_results):
    world_size, results = group_results
    _check([r["float32"] for r in results], CASES_2 if world_size == 2 else CASES_3, 1e-5)


def test_matches_float64_reference(group_results):
    world_size, results = group_results
    _check([r["float64"] for r in results], (CASES_2 if world_size == 2 else CASES_3)[:2],
           1e-10)


def test_mismatched_shards_raise_on_every_rank(group_results):
    _, results = group_results
    assert all(r["mismatch"].startswith("q: head dim D must be equal on every rank")
               for r in results), [r["mismatch"] for r in results]
    assert results[0]["bad_rank"].startswith("beta:")
    assert all(r["bad_rank"].startswith("q, k, v, w, beta, g: invalid inputs on rank(s) [0]")
               for r in results[1:])


def test_needs_initialised_group():
    q, k, v, w, beta, g = make_inputs(1, 4, 2, 2, 8, 8)
    with pytest.raises(ValueError, match="^group: torch.distributed is not initialised"):
        context_parallel_path_attn(q, k, v, w, beta, g)
