"""path_attn_prefill / path_attn_step / PaTHCache against path_attn on whole sequences.

Every run of prefill + steps must reproduce `path_attn` on the full sequence (float32,
relative error below 1e-4; float64 against the float64 naive reference), and the cached keys
must equal a float64 reference that applies H_t for every later token t, one at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import pytest
import torch

from pathattn import PaTHCache, path_attn, path_attn_prefill, path_attn_step
from pathattn.ops import path_attn_naive
from pathattn.ops.path.cache import key_transforms

from ._helpers import make_inputs, rel_err

F32_TOL = 1e-4
MIXED = (1, 5, 1, 1, 5, 1, 3, 1, 5, 1)  # step sizes, cycled


def sl(inputs: tuple, a: int, b: int) -> tuple:
    """Positions [a, b) of every input (None stays None)."""
    return tuple(None if x is None else x[:, a:b] for x in inputs)


def take_rows(inputs: tuple, index) -> tuple:
    return tuple(None if x is None else x[index] for x in inputs)


def cat_time(*parts: tuple) -> tuple:
    return tuple(None if xs[0] is None else torch.cat(xs, dim=1) for xs in zip(*parts, strict=True))


def run_steps(inputs: tuple, state: PaTHCache, start: int, end: int,
              sizes=MIXED) -> torch.Tensor:
    """path_attn_step over positions [start, end) of `inputs` in chunks of `sizes` (cycled);
    returns the outputs [B, end - start, HQ, Dv]."""
    outs, t, i = [], start, 0
    while t < end:
        m = min(sizes[i % len(sizes)], end - t)
        outs.append(path_attn_step(*sl(inputs, t, t + m), state=state))
        t, i = t + m, i + 1
    return torch.cat(outs, dim=1)


def naive_keys(k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """float64 reference of the cached keys: k [B, T, H, D] -> k_j^(T), applying
    H_t = I - beta_t w_t w_t^T to every earlier key for t = 1 .. T-1, one token at a time."""
    k, w, beta = (x.double() for x in (k, w, beta))
    out = k.clone()
    for t in range(1, k.shape[1]):
        prev = out[:, :t]  # [B, t, H, D]
        proj = (prev * w[:, t: t + 1]).sum(-1, keepdim=True) * beta[:, t: t + 1, :, None]
        out[:, :t] = prev - proj * w[:, t: t + 1]
    return out


@dataclass(frozen=True)
class Case:
    B: int = 2
    HQ: int = 4
    H: int = 2
    D: int = 32
    Dv: int = 32
    gates: bool = True
    P: int = 100  # prompt length
    new: int = 40  # tokens decoded after it
    window: int | None = None  # max_pending_tokens (None: the default)

    def inputs(self, dtype=torch.float32, seed: int = 0) -> tuple:
        return make_inputs(self.B, self.P + self.new, self.HQ, self.H, self.D, self.Dv,
                           self.gates, dtype, seed)

    def __str__(self) -> str:
        s = f"B{self.B}-HQ{self.HQ}H{self.H}-D{self.D}-Dv{self.Dv}-P{self.P}+{self.new}"
        s += "-gates" if self.gates else "-nogates"
        return s + ("" if self.window is None else f"-window{self.window}")


def prefill(case: Case, inputs: tuple, **kwargs) -> tuple[torch.Tensor, PaTHCache]:
    o, state = path_attn_prefill(*sl(inputs, 0, case.P), **kwargs)
    if case.window is not None:
        state.max_pending_tokens = case.window
    return o, state


# ----------------------------------------------------------------------------- outputs

CASES = [
    Case(),  # GQA with gates
    Case(gates=False),
    Case(HQ=2, H=2, gates=False, window=1),  # the paper's per-token rank-1 update
    Case(HQ=2, H=2, window=3),  # commits between (and inside) the mixed steps
    Case(HQ=4, H=1, D=16, Dv=24, gates=False),  # MQA, Dv != D (matmul attention path)
    Case(B=1, P=64, new=70, window=16),  # prompt of exactly one key block
    Case(B=1, P=1, new=30, gates=False),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_prefill_then_steps_match_path_attn(case: Case):
    inputs = case.inputs()
    ref = path_attn(*inputs)
    o, state = prefill(case, inputs)
    assert rel_err(o, ref[:, : case.P]) < F32_TOL
    o_new = run_steps(inputs, state, case.P, case.P + case.new)
    assert o_new.shape == ref[:, case.P:].shape and o_new.dtype == torch.float32
    assert rel_err(o_new, ref[:, case.P:]) < F32_TOL
    assert len(state) == state.seq_len == case.P + case.new


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_float64_matches_naive_reference(gates: bool):
    case = Case(P=50, new=20, gates=gates, window=4)
    inputs = case.inputs(torch.float64)
    ref = path_attn_naive(*inputs)
    o, state = prefill(case, inputs)
    o_new = run_steps(inputs, state, case.P, case.P + case.new)
    assert state.dtype == torch.float64 and o_new.dtype == torch.float64
    assert rel_err(torch.cat([o, o_new], 1), ref) < 1e-10


def test_single_token_prompt_and_long_chunk():
    """A chunk longer than 64 tokens is padded for the UT transform."""
    case = Case(P=3, new=150)
    inputs = case.inputs()
    _, state = prefill(case, inputs)
    o_new = run_steps(inputs, state, case.P, case.P + case.new, sizes=(130, 1, 19))
    assert rel_err(o_new, path_attn(*inputs)[:, case.P:]) < F32_TOL


def test_empty_prompt():
    case = Case(P=0, new=20)
    inputs = case.inputs()
    o, state = prefill(case, inputs)
    assert o.shape == (2, 0, 4, 32) and len(state) == 0
    o_new = run_steps(inputs, state, 0, 20)
    assert rel_err(o_new, path_attn(*inputs)) < F32_TOL


def test_bfloat16_inputs():
    """Low precision inputs compute and cache in float32; the output has q's dtype."""
    case = Case(P=40, new=12)
    inputs = case.inputs(torch.bfloat16)
    o, state = prefill(case, inputs)
    o_new = run_steps(inputs, state, case.P, case.P + case.new)
    assert state.dtype == torch.float32 and o_new.dtype == torch.bfloat16
    ref = path_attn(*inputs)  # bf16 in, float32 accumulation: the same computation
    assert rel_err(o_new, ref[:, case.P:]) < 1e-2


# ----------------------------------------------------------------------------- cached keys


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 200], ids=lambda n: f"n{n}")
def test_key_transforms_match_naive(n: int):
    _, k, _, w, beta, _ = make_inputs(2, n, 2, 2, 16, 16, gates=False)
    kn, M = key_transforms(*(x.transpose(1, 2).contiguous() for x in (k, w, beta)))
    ref = naive_keys(k, w, beta)
    assert rel_err(kn.transpose(1, 2), ref) < 1e-5
    # M = H_0 ... H_{n-1}: x^T M is x^T transformed by every token
    x = torch.randn(2, 2, 3, 16)
    y = x.double()
    for t in range(n):
        wt, bt = w[:, t].double()[:, :, None], beta[:, t].double()[:, :, None, None]
        y = y - bt * (y @ wt.mT) * wt
    assert rel_err(x @ M, y) < 1e-5


@pytest.mark.parametrize("window", [None, 1, 7], ids=lambda w: f"window{w}")
def test_cached_keys_match_naive(window):
    case = Case(P=77, new=33, window=window)
    inputs = case.inputs()
    _, state = prefill(case, inputs)
    _, k, v, w, beta, g = inputs
    assert rel_err(state.k, naive_keys(k[:, :77], w[:, :77], beta[:, :77])) < 1e-5
    mid = case.P + 16
    run_steps(inputs, state, case.P, mid)
    assert rel_err(state.k, naive_keys(k[:, :mid], w[:, :mid], beta[:, :mid])) < 1e-5
    o_new = run_steps(inputs, state, mid, case.P + case.new)  # reading .k committed
    assert rel_err(o_new, path_attn(*inputs)[:, mid:]) < F32_TOL
    assert state.k.shape == k.shape
    assert rel_err(state.k, naive_keys(k, w, beta)) < 1e-5
    assert torch.equal(state.v, v)
    assert torch.allclose(state.g_cumsum, g.double().cumsum(1))
    assert state.g_cumsum.dtype == torch.float64


def test_views_share_the_buffers():
    case = Case(P=20, new=0)
    _, state = prefill(case, case.inputs())
    k, v = state.k, state.v
    assert k.shape == (2, 20, 2, 32) and v.shape == (2, 20, 2, 32)
    assert k._base is not None and v._base is not None  # views, not copies
    assert state.capacity >= 20


# ----------------------------------------------------------------------------- growth


def test_capacity_doubles_instead_of_growing_every_step():
    case = Case(B=1, P=10, new=300, gates=False)
    inputs = case.inputs()
    _, state = prefill(case, inputs)
    ptrs, caps = {state.v.data_ptr()}, [state.capacity]
    for t in range(case.P, case.P + case.new):
        path_attn_step(*sl(inputs, t, t + 1), state=state)
        ptrs.add(state.v.data_ptr())
        caps.append(state.capacity)
    grows = sum(b > a for a, b in pairwise(caps))
    assert grows == state.num_grows == len(ptrs) - 1
    assert grows <= math.ceil(math.log2((case.P + case.new) / caps[0]))
    assert all(b in (a, 2 * a) for a, b in pairwise(caps))


# ----------------------------------------------------------------------------- reorder


@pytest.mark.parametrize("index", [[2, 0, 0], [1, 2], [0, 1, 2, 2]],
                         ids=lambda i: "index" + "_".join(map(str, i)))
def test_reorder_then_step(index):
    """Beam search: reorder (with pending tokens), then step the reordered sequences."""
    case = Case(B=3, P=60, new=30)
    inputs = case.inputs()
    _, state = prefill(case, inputs)
    run_steps(inputs, state, case.P, case.P + 12)
    idx = torch.tensor(index)
    state.reorder(idx)
    cont = make_inputs(len(index), 18, case.HQ, case.H, case.D, case.Dv, seed=5)
    o_new = run_steps(cont, state, 0, 18)
    full = cat_time(take_rows(sl(inputs, 0, case.P + 12), idx), cont)
    assert rel_err(o_new, path_attn(*full)[:, case.P + 12:]) < F32_TOL


# ----------------------------------------------------------------------------- truncate


@pytest.mark.parametrize("window", [None, 1], ids=lambda w: f"window{w}")
@pytest.mark.parametrize("accepted", [0, 2, 5], ids=lambda a: f"accept{a}")
def test_truncate_after_draft_then_continue(accepted: int, window):
    """Speculative decoding: a 5-token draft step, keep `accepted` tokens, continue."""
    case = Case(P=70, new=6, window=window)
    inputs = case.inputs()
    _, state = prefill(case, inputs)
    run_steps(inputs, state, case.P, case.P + 6, sizes=(1,))
    draft = make_inputs(2, 5, case.HQ, case.H, case.D, case.Dv, seed=7)
    path_attn_step(*draft, state=state)
    state.truncate(case.P + 6 + accepted)
    cont = make_inputs(2, 12, case.HQ, case.H, case.D, case.Dv, seed=8)
    o_new = run_steps(cont, state, 0, 12)
    full = cat_time(sl(inputs, 0, case.P + 6), sl(draft, 0, accepted), cont)
    assert rel_err(o_new, path_attn(*full)[:, -12:]) < F32_TOL
    assert rel_err(state.k, naive_keys(full[1], full[3], full[4])) < 1e-5


def test_truncate_limits():
    case = Case(P=30, new=3)
    inputs = case.inputs()
    _, state = prefill(case, inputs)
    with pytest.raises(ValueError, match=r"^new_len=29 is out of range.*\[30, 30\]"):
        state.truncate(29)  # nothing to go back to after the prefill (no history)
    run_steps(inputs, state, 30, 30 + 3, sizes=(1,))
    draft = make_inputs(2, 4, 4, 2, 32, 32, seed=3)
    path_attn_step(*draft, state=state)  # positions 33..36
    with pytest.raises(ValueError, match=r"^new_len=29 is out of range.*\[30, 37\]"):
        state.truncate(29)  # the pending window starts at 30
    with pytest.raises(ValueError, match=r"^new_len=38 is out of range"):
        state.truncate(38)
    with pytest.raises(ValueError, match=r"^new_len must be an int"):
        state.truncate(34.0)
    state.truncate(35)
    state.truncate(31)  # into an earlier step of the window
    assert len(state) == 31
    assert rel_err(state.k, naive_keys(*(x[:, :31] for x in (inputs[1], inputs[3],
                                                             inputs[4])))) < 1e-5
    _ = state.k  # reading the keys commits: no going back any more
    with pytest.raises(ValueError, match=r"^new_len=30 is out of range.*\[31, 31\]"):
        state.truncate(30)


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_history_truncates_to_every_length(gates: bool):
    """With history the cache goes back to any length, into the prompt and across commits,
    and continues exactly as a fresh prefill of the kept prefix."""
    case = Case(P=9, new=9, gates=gates, window=2)
    inputs = case.inputs()
    n = case.P + case.new
    for keep in range(n + 1):
        o, state = path_attn_prefill(*sl(inputs, 0, case.P), history=True)
        state.max_pending_tokens = 2
        run_steps(inputs, state, case.P, n, sizes=(1, 3))
        assert state.min_len == 0 and state.has_history
        state.truncate(keep)
        o_new = run_steps(inputs, state, keep, n, sizes=(2,)) if keep < n else None
        assert len(state) == n
        if o_new is not None:
            assert rel_err(o_new, path_attn(*inputs)[:, keep:]) < F32_TOL, keep
    hist = state.history_inputs()
    assert torch.equal(hist.k, inputs[1]) and torch.equal(hist.beta[..., 0], inputs[4])


def test_masked_tokens_equal_their_removal():
    """Zeros anywhere in the prefill mask and in a step's mask: every row equals its real
    tokens run alone (no key, no transform, no gate for a masked token)."""
    B, P, new = 3, 12, 6
    inputs = make_inputs(B, P + new, 4, 2, 32, 32, True)
    mask = torch.ones(B, P + new, dtype=torch.bool)
    mask[0, [0, 1, 5, 6, 11]] = False  # left padding, a hole, the prompt's last token
    mask[1, [3, P + 1]] = False  # a hole in the prompt and one in a decode step
    mask[2, P - 2:P] = False  # right padding of the prompt
    o, state = path_attn_prefill(*sl(inputs, 0, P), attention_mask=mask[:, :P])
    o_new = torch.cat([path_attn_step(*sl(inputs, t, t + 3), state=state,
                                      mask=mask[:, t:t + 3]) for t in (P, P + 3)], dim=1)
    got = torch.cat([o, o_new], dim=1)
    assert torch.equal(state.key_mask, mask)
    for b in range(B):
        alone = tuple(None if x is None else x[b: b + 1, mask[b]] for x in inputs)
        assert rel_err(got[b: b + 1, mask[b]], path_attn(*alone)) < F32_TOL, b
        assert torch.all(got[b, ~mask[b]] == 0)


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("lengths", [(50, 37, 1), (50, 0, 44)],
                         ids=lambda ls: "len" + "_".join(map(str, ls)))
@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_left_padding_equals_each_prompt_alone(lengths, gates: bool):
    P, new = max(lengths), 14
    B = len(lengths)
    inputs = make_inputs(B, P + new, 4, 2, 32, 32, gates)  # padding positions hold junk
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, P - n:] = 1
    o, state = path_attn_prefill(*sl(inputs, 0, P), attention_mask=mask)
    o_new = run_steps(inputs, state, P, P + new)
    assert torch.equal(state.start, torch.tensor([P - n for n in lengths]))
    for b, n in enumerate(lengths):
        alone = tuple(None if x is None else x[b: b + 1, P - n:] for x in inputs)
        ref = path_attn(*alone)  # [1, n + new, HQ, Dv]
        assert rel_err(o[b: b + 1, P - n:], ref[:, :n]) < F32_TOL
        assert torch.all(o[b, : P - n] == 0)
        assert rel_err(o_new[b: b + 1], ref[:, n:]) < F32_TOL


def test_attention_mask_without_padding_is_ignored():
    case = Case(P=40, new=8)
    inputs = case.inputs()
    o, state = prefill(case, inputs, attention_mask=torch.ones(2, 40, dtype=torch.bool))
    assert not state.padded
    o_new = run_steps(inputs, state, 40, 48)
    assert rel_err(torch.cat([o, o_new], 1), path_attn(*inputs)) < F32_TOL


# ----------------------------------------------------------------------------- validation


def _step_args() -> dict:
    """A valid 2-token step for the state of `_state()` (B=2, HQ=4, H=2, D=8, Dv=6)."""
    q, k, v, w, beta, g = make_inputs(2, 2, 4, 2, 8, 6, seed=1)
    return {"q": q, "k": k, "v": v, "w": w, "beta": beta, "g": g}


def _state(gates: bool = True) -> PaTHCache:
    return path_attn_prefill(*make_inputs(2, 5, 4, 2, 8, 6, gates))[1]


def _other(B=2, HQ=4, H=2, D=8, Dv=6, m=2, gates=True) -> dict:
    q, k, v, w, beta, g = make_inputs(B, m, HQ, H, D, Dv, gates, seed=2)
    return {"q": q, "k": k, "v": v, "w": w, "beta": beta, "g": g}


BAD_STEPS = [
    pytest.param(lambda a: {"state": "cache"}, r"^state must be a PaTHCache", id="no-state"),
    pytest.param(lambda a: _other(m=0), r"^q: a step needs at least one new token", id="m0"),
    pytest.param(lambda a: _other(B=3), r"^q: batch size B=3 differs from the state's 2",
                 id="batch"),
    pytest.param(lambda a: _other(HQ=2, H=1), r"^k: key/value heads H=1 differs",
                 id="kv-heads"),
    pytest.param(lambda a: _other(HQ=8), r"^q: query heads HQ=8 differs", id="q-heads"),
    pytest.param(lambda a: _other(D=16), r"^q: head dim D=16 differs", id="head-dim"),
    pytest.param(lambda a: _other(Dv=8), r"^v: value head dim Dv=8 differs", id="value-dim"),
    pytest.param(lambda a: {"g": None}, r"^g: pass g \(the prefill had forget gates\)",
                 id="missing-gates"),
    pytest.param(lambda a: {k: a[k].double() for k in ("q", "k", "v", "w")},
                 r"^q: dtype torch.float64 computes in torch.float64 but the state holds",
                 id="dtype"),
    pytest.param(lambda a: {"k": a["k"][:, :1]}, r"^k: expected \[B, T\]", id="k-len"),
    pytest.param(lambda a: {"beta": a["beta"][..., None]}, r"^beta must have 3 dimensions",
                 id="beta-rank"),
    pytest.param(lambda a: {"scale": -1.0}, r"^scale must be a positive number",
                 id="scale"),
]


@pytest.mark.parametrize("edit, match", BAD_STEPS)
def test_step_validation(edit, match):
    state = _state()
    args = {**_step_args(), "state": state}
    with pytest.raises(ValueError, match=match):
        path_attn_step(**{**args, **edit(args)})
    assert len(state) == 5  # a rejected step leaves the cache alone


def test_step_checks_the_backend_once_per_cache():
    state = _state()
    path_attn_step(**_step_args(), state=state)
    assert state.step_backends == {("auto", torch.float32)}
    for backend in ("no-such-backend", ["auto"]):  # names not checked before still are
        with pytest.raises(ValueError, match="^backend must be one of"):
            path_attn_step(**_step_args(), state=state, backend=backend)
    assert len(state) == 7


def test_step_validation_unexpected_gates():
    state = _state(gates=False)
    with pytest.raises(ValueError, match=r"^g: pass g=None \(the prefill had no forget"):
        path_attn_step(**_step_args(), state=state)


def _mask(rows) -> torch.Tensor:
    return torch.tensor(rows)


BAD_MASKS = [
    pytest.param(torch.ones(2, 4, dtype=torch.long), r"^attention_mask must be a tensor of "
                 r"shape \[B, T\] = \(2, 5\)", id="shape"),
    pytest.param([[1] * 5] * 2, r"^attention_mask must be a tensor", id="list"),
    pytest.param(torch.ones(2, 5), r"^attention_mask must be bool or integer", id="float"),
    pytest.param(_mask([[0, 1, 2, 1, 1], [1] * 5]), r"^attention_mask must hold only 0",
                 id="not-binary"),
    pytest.param(torch.ones(2, 5, dtype=torch.long, device="meta"), r"^attention_mask is on "
                 r"meta", id="device"),
]


@pytest.mark.parametrize("mask, match", BAD_MASKS)
def test_prefill_mask_validation(mask, match):
    with pytest.raises(ValueError, match=match):
        path_attn_prefill(*make_inputs(2, 5, 4, 2, 8, 6), attention_mask=mask)


def test_reorder_validation():
    state = _state()
    with pytest.raises(ValueError, match=r"^index: entries must lie in \[0, 2\)"):
        state.reorder(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"^index must be a 1-D int32 or int64 tensor"):
        state.reorder(torch.tensor([0.0, 1.0]))


# ----------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "left_padded"])
def test_differentiable_prefill_builds_the_same_cache(padded: bool):
    """With inputs that require grad, the prefill keeps the op's autograd and builds the
    keys in a separate pass; without, one pass gives both. The caches must agree."""
    B, P = 2, 70
    inputs = make_inputs(B, P, 4, 2, 16, 16, True)
    mask = None
    if padded:
        mask = torch.ones(B, P, dtype=torch.long)
        mask[1, :9] = 0
    o_fast, fast = path_attn_prefill(*inputs, attention_mask=mask)
    leaves = tuple(x.clone().requires_grad_() for x in inputs)
    o_grad, slow = path_attn_prefill(*leaves, attention_mask=mask)
    assert o_grad.requires_grad and not o_fast.requires_grad
    o_grad.sum().backward()
    assert all(x.grad is not None for x in leaves)
    assert rel_err(o_grad.detach(), o_fast) < 1e-6
    assert rel_err(slow.k, fast.k) < 1e-5
    assert torch.equal(slow.v, fast.v) and torch.equal(slow.start, fast.start)
