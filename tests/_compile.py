"""Helpers of the torch.compile tests: graph-break counts and compiled-vs-eager checks.

Compiles are slow on a small CPU, so each test module compiles few functions (shared
across its parametrizations where it can) at tiny sizes.
"""

from __future__ import annotations

import torch
import torch._dynamo


def graph_breaks(fn, *args, **kwargs) -> tuple[int, list[str]]:
    """(number of graph breaks, their reasons) when torch.compile traces fn(*args)."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args, **kwargs)
    return explained.graph_break_count, [str(r.reason)[:300] for r in explained.break_reasons]


def assert_no_graph_breaks(fn, *args, **kwargs) -> None:
    count, reasons = graph_breaks(fn, *args, **kwargs)
    assert count == 0, f"{count} graph breaks:\n" + "\n".join(reasons)


def loss_and_grads(fn, args: tuple, params: tuple = ()) -> list[torch.Tensor]:
    """[loss, d loss / d x for every tensor x of args that requires grad, then of params]:
    loss = fn(*args) (a scalar), backward through it."""
    leaves = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
    leaves += list(params)
    loss = fn(*args)
    grads = torch.autograd.grad(loss, leaves)
    return [loss.detach(), *grads]


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor], names=None,
                rtol: float = 1e-6, atol: float = 1e-6) -> None:
    """Every tensor of got close to want (fp32: compiled and eager differ only in how the
    compiled code around the op rounds)."""
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        what = names[i] if names is not None else f"output {i}"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, w=what: f"{w}: {m}")


def fresh(args: tuple) -> tuple:
    """Detached copies of the tensors of args (requires_grad kept), None stays None."""
    return tuple(x.detach().clone().requires_grad_(x.requires_grad)
                 if isinstance(x, torch.Tensor) else x for x in args)
