"""Where precision ends for the appendix constructions.

Swaps (Theorem A.1): the PaTH layer L2-normalises w and caps beta strictly below 2, so a
swap's H has eigenvalue lambda = 1 - beta |w|^2 slightly above -1 along w and each swap
shrinks the start key a little. The worst case, `#` then [1 <-> 5] repeated, first reads
wrong at T = 153 tokens in bf16 (w rounded toward zero) and at about 2.9e5 tokens in float32
(beyond what these tests can run; extrapolated from the op's measured drift, which is
linear in the number of swaps). With `exact_reflections` (w = e_x - e_y, beta = 1) H is an
integer permutation matrix and the model is exact in float32 and bf16 alike.

Flip-flop (Theorem A.2): every H is a coordinate projection (beta = 1, w in {e1, e2}),
exact in every format; the decision margin h13 - h14 at a read stays above 1/2 for all n
(1 exactly from n = 32 on), in float32 and bf16.
"""

from __future__ import annotations

import pytest
import torch

from pathattn.tasks import FlipFlop
from pathattn.tasks.flipflop import BIT0, R
from pathattn.theory import (
    flipflop_model,
    last_written_bit,
    swap_model,
    swaps_identity,
    worst_case_ids,
)

from . import random_swap_ids

N = 1024
BF16_FAILURE = 153  # T at which the bf16 layer first errs on worst_case_ids(T)


def _wrong(model, ids):
    with torch.no_grad():
        return (model(ids) > 0) != swaps_identity(ids)  # [B, T]


def test_float32_layer_drift():
    """lambda = -1 + 1.9e-7; the op's sum_i i pi(i) drifts linearly (the same rate over 512
    and 2048 swaps), and the extrapolated first failure lies far beyond n = 1024, a little
    before what lambda alone predicts (the op's own float32 rounding adds to the drift)."""
    model = swap_model(2049)
    lam = model.swap_eigenvalue()
    assert -1 < lam < -1 + 3e-7
    drift = [(55 - model.rearrangement_sum(worst_case_ids(T + 1)).item()) / T
             for T in (512, 2048)]
    assert drift[1] == pytest.approx(drift[0], rel=0.05)
    measured, from_lambda = model.failure_length(), model.failure_length(measure=False)
    assert 2.5e5 < measured < from_lambda < 4e5
    assert not _wrong(swap_model(N), worst_case_ids(N)).any()


def test_bf16_layer_fails_at_predicted_length():
    model = swap_model(N).to(torch.bfloat16)
    assert model.failure_length(measure=False) == model.failure_length() == BF16_FAILURE
    wrong = _wrong(model, worst_case_ids(BF16_FAILURE))[0]
    assert wrong.nonzero().flatten().tolist() == [BF16_FAILURE - 1]


def test_bf16_layer_fails_on_random_sequences():
    """Random walks returning to the identity (each swap followed by itself): the bf16
    layer errs within 1024 tokens, the exact-reflection variant never does."""
    pairs = random_swap_ids(4, N // 2, seed=5)[:, 1:]
    ids = torch.cat([torch.zeros(4, 1, dtype=torch.long),
                     pairs.repeat_interleave(2, dim=1)], dim=1)  # [4, N - 1]
    assert _wrong(swap_model(N).to(torch.bfloat16), ids).any(dim=1).all()
    assert not _wrong(swap_model(N, exact_reflections=True).to(torch.bfloat16), ids).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
def test_exact_reflections_do_not_drift(dtype):
    model = swap_model(N, exact_reflections=True).to(dtype)
    assert model.swap_eigenvalue() == -1.0 and model.failure_length() is None
    assert model.rearrangement_sum(worst_case_ids(N - 1)).item() == 55.0  # 1022 swaps
    assert not _wrong(model, worst_case_ids(N)).any()
    assert not _wrong(model, random_swap_ids(2, N, seed=6)).any()


def test_float64_layer_is_exact_far_beyond():
    model = swap_model(N).double()
    assert model.failure_length(measure=False) > 1e13
    assert not _wrong(model, worst_case_ids(N)).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("n", [4, 32, N])
def test_flipflop_margin_stays_bounded(dtype, n):
    """h13 - h14 (stored bit as attention weights) at every read: > 1/2 with the right sign
    for every n, exactly 1 once e^-s underflows (s >= 32 here)."""
    model = flipflop_model(n).to(dtype)
    ids, _ = next(iter(FlipFlop(split="val_dense", batch_size=2, num_pairs=max(n // 2, 2),
                                seed=n)))
    ids = ids[:, :n]
    with torch.no_grad():
        h = model.stream(ids).float()
        pred = model(ids).argmax(-1)
    want = last_written_bit(ids)
    reads = (ids == R) & (want >= 0)
    margin = ((h[..., 12] - h[..., 13]) * (1 - 2 * want))[reads]  # > 0: the right bit
    assert reads.any() and (margin > 0.5).all()
    if n >= 32:
        assert (margin == 1).all()
    assert torch.equal(pred[reads] - BIT0, want[reads])
