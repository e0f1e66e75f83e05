"""Forget gates stay inside their sequence, and a huge gate costs no precision elsewhere.

The gate term G_i - G_j is a per-sequence cumulative sum. A gate of -inf, -1e16 or NaN in
one sequence (batch row or packed segment) must leave every other sequence's output and
gradients exactly as they are: in every backend (`tests/ops/path/conformance/test_isolation.py`),
in the prefill and the decode steps, and under context parallelism; and inside a sequence a
gate of -1e6 must not cost the other tokens float32 accuracy, in every backend.
"""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn_prefill, path_attn_step
from pathattn.ops.path.reference import path_attn_naive
from tests.faults._backends import op  # noqa: F401  (fixture)
from tests.ops.path._helpers import make_dout, make_inputs, rel_err, run_with_grads

BAD_GATES = {"minus-inf": float("-inf"), "minus-1e16": -1e16, "nan": float("nan")}


def _with_gate(inputs, index, value):
    g = inputs[5].clone()
    g[index] = value
    return inputs[:5] + (g,)


@pytest.mark.parametrize("value", [-1e6, -1e9], ids=["minus-1e6", "minus-1e9"])
def test_huge_gate_keeps_float32_accuracy(op, value):  # noqa: F811
    """A gate of -1e6 inside a sequence: forward and every gradient stay within float32
    accuracy of the float64 reference (the old single running sum cast to float32 gave
    5e-3 relative error in the output)."""
    B, T, HQ, H, D = 1, 70, 2, 1, 16
    inputs = _with_gate(make_inputs(B, T, HQ, H, D, D, gates=True), (0, 21, 0), value)
    dout = make_dout(B, T, HQ, D)
    ours = run_with_grads(op, inputs, dout)
    ref = run_with_grads(path_attn_naive, tuple(x.double() for x in inputs), dout.double())
    assert rel_err(ours[0], ref[0]) < 1e-5
    for name, got, want in zip("q k v w beta".split(), ours[1][:5], ref[1][:5], strict=True):
        assert rel_err(got, want) < 1e-4, name
    # dg: the huge gate's own gradient is ~0 against a huge G; compare every other token
    keep = torch.ones(T, dtype=torch.bool)
    keep[21] = False
    assert rel_err(ours[1][5][:, keep], ref[1][5][:, keep]) < 1e-4


def test_prefill_and_step_isolated():
    """Left-padded prefill (packed internally) and decode steps: a -inf gate in prompt row
    0 and a NaN gate in row 0's new token leave row 1 exactly as alone."""
    B, T, HQ, H, D = 2, 30, 2, 1, 16
    q, k, v, w, beta, g = make_inputs(B, T + 1, HQ, H, D, D, gates=True)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :4] = 0  # row 1 is left-padded: the prefill packs the rows

    def run(g_prompt, g_new):
        o, cache = path_attn_prefill(q[:, :T], k[:, :T], v[:, :T], w[:, :T], beta[:, :T],
                                     g_prompt, attention_mask=mask)
        o1 = path_attn_step(q[:, T:], k[:, T:], v[:, T:], w[:, T:], beta[:, T:], g_new,
                            state=cache)
        return o, o1

    o_ref, o1_ref = run(g[:, :T], g[:, T:])
    g_bad, g_new = g[:, :T].clone(), g[:, T:].clone()
    g_bad[0, 3, 1] = float("-inf")
    g_new[0, 0, 0] = float("nan")
    o, o1 = run(g_bad, g_new)
    torch.testing.assert_close(o[1], o_ref[1], rtol=0, atol=0)
    torch.testing.assert_close(o1[1], o1_ref[1], rtol=0, atol=0)


def _cp_worker(rank: int, world_size: int) -> dict:
    """Worker: context-parallel op on 2 shards of 2 batch rows, with a bad gate in row 0
    of rank 0's shard; row 1's output and gradients against the clean run (max abs diff),
    and a -1e6 gate's error against the float64 reference."""
    from pathattn.distributed import context_parallel_path_attn

    B, T, HQ, H, D = 2, 48, 2, 1, 8
    lo, hi = rank * T // 2, (rank + 1) * T // 2
    inputs = make_inputs(B, T, HQ, H, D, D, gates=True)
    dout = make_dout(B, T, HQ, D)
    dout[0] = 0

    def run(inp):
        shard = tuple(x[:, lo:hi] for x in inp)
        return run_with_grads(context_parallel_path_attn, shard, dout[:, lo:hi], block_size=8)

    clean = run(inputs)
    out = {}
    for bad, value in BAD_GATES.items():
        hurt = run(_with_gate(inputs, (0, 5, 1), value))
        diffs = [(hurt[0][1] - clean[0][1]).abs().max()]
        diffs += [(got[1] - ref[1]).abs().max()
                  for got, ref in zip(hurt[1], clean[1], strict=True)]
        out[bad] = float(max(diffs))
    huge = _with_gate(inputs, (1, 17, 0), -1e6)
    ref = path_attn_naive(*(x.double() for x in huge))[:, lo:hi]
    out["precision"] = rel_err(run(huge)[0], ref)
    return out


def test_context_parallel_isolated():
    from tests.distributed._launch import launch

    for res in launch(_cp_worker, 2):
        assert all(res[bad] == 0 for bad in BAD_GATES), res
        assert res["precision"] < 1e-5, res
