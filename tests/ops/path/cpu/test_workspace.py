"""The kernels' workspace (workspace.cpp, `pathattn.ops.path.cpu.workspace`): a repeated call
takes its blocks from the cache, results do not depend on what the reused memory held,
the limit and the release are kept, bad limits are refused."""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn
from pathattn.ops.path.cpu import (
    load_kernels,
    release_workspace,
    set_workspace_limit,
    workspace_info,
)

from .._helpers import make_inputs

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")


@pytest.fixture(autouse=True)
def _restore_settings():
    """Each test starts unpoisoned (tests/ops/conftest.py poisons the workspace) and leaves
    the limit and the poisoning as it found them."""
    limit = workspace_info().limit_bytes
    poisoned = torch.ops.pathattn_cpu.workspace_poison(False)
    yield
    torch.ops.pathattn_cpu.workspace_poison(poisoned)
    set_workspace_limit(limit)


def _inputs(seed: int = 0, gates: bool = True) -> tuple:
    # T = 512, D = 64: the UT outputs and the pair tiles are blocks of 128 KiB and more
    return tuple(None if x is None else x.requires_grad_()
                 for x in make_inputs(1, 512, 4, 2, 64, 64, gates=gates, seed=seed))


def _run(inputs) -> list[torch.Tensor]:
    """Output and every gradient of the "cpu" backend."""
    o = path_attn(*inputs, backend="cpu")
    leaves = [x for x in inputs if x is not None]
    grads = torch.autograd.grad(o, leaves, torch.ones_like(o))
    return [o.detach(), *grads]


def test_a_repeated_call_reuses_its_blocks():
    """From an empty cache: the first call's blocks serve the second call whole. (Blocks of
    other sizes that earlier tests of the same process left behind can be taken by a
    smaller request of the first call, up to twice its size, and leave a later request of
    the second call without its own block: then the steady state takes one more call.)"""
    release_workspace()
    assert workspace_info().cached_bytes == 0
    _run(_inputs())
    before = workspace_info()
    _run(_inputs(seed=1))
    after = workspace_info()
    assert after.misses == before.misses, (before, after, torch.get_num_threads())
    assert after.hits > before.hits
    assert after.cached_bytes >= 4 * 512 * 64 * 4  # at least the UT's query outputs


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "no_gates"])
def test_results_do_not_depend_on_reused_memory(gates):
    """Every block handed out filled with NaN first: the same numbers, bit for bit, as
    with fresh memory and no cache (a kernel reading memory it did not write, or an
    accumulator not zeroed, would differ)."""
    inputs = _inputs(seed=2, gates=gates)
    set_workspace_limit(0)
    want = _run(inputs)
    set_workspace_limit(1 << 30)
    _run(_inputs(seed=3, gates=gates))  # other numbers in the cached blocks
    torch.ops.pathattn_cpu.workspace_poison(True)
    got = _run(inputs)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_limit_and_release():
    set_workspace_limit(0)
    _run(_inputs())
    assert workspace_info().cached_bytes == 0  # nothing kept
    set_workspace_limit(1 << 30)
    _run(_inputs())
    assert workspace_info().cached_bytes > 0
    small = 200 * 1024
    set_workspace_limit(small)  # trims at once, oldest first
    assert workspace_info().cached_bytes <= small
    release_workspace()
    assert workspace_info().cached_bytes == 0


def test_release_leaves_live_tensors_alone():
    x = torch.ops.pathattn_cpu.workspace_empty([256, 256], torch.float32)
    x.fill_(3.0)
    release_workspace()
    assert bool((x == 3.0).all())
    del x  # back to the cache
    assert workspace_info().cached_bytes >= 256 * 256 * 4


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_set_workspace_limit_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="n_bytes must be an int >= 0"):
        set_workspace_limit(bad)


def test_a_smaller_request_reuses_a_cached_block():
    """Best fit up to twice the size: a shorter sequence takes the longer one's blocks; a
    request of less than half a cached block does not."""
    release_workspace()
    x = torch.ops.pathattn_cpu.workspace_empty([1000, 100], torch.float32)  # 400 kB
    del x
    before = workspace_info()
    y = torch.ops.pathattn_cpu.workspace_empty([600, 100], torch.float32)  # 240 kB: fits
    mid = workspace_info()
    assert (mid.hits, mid.misses) == (before.hits + 1, before.misses)
    assert mid.cached_bytes == 0
    del y
    z = torch.ops.pathattn_cpu.workspace_empty([400, 100], torch.float32)  # 160 kB: < half
    after = workspace_info()
    assert (after.hits, after.misses) == (mid.hits, mid.misses + 1)
    del z
