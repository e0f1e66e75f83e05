"""The optional "fla" backend (`pathattn.ops.path.fla`) without fla-core: its refusals, the
"auto" rule passing over it, and its adapter's conventions against a fake `fla` module whose
`parallel_path_attn` computes fla's definition (gate term multiplied by the scale, w / beta /
g asserted float32, cu_seqlens int64) from the float64 reference, with the CUDA requirement
relaxed so it runs on the CPU.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from pathattn import path_attn
from pathattn.ops import path_attn_naive
from pathattn.ops.path import backends
from pathattn.ops.path import fla as fla_backend
from pathattn.ops.path.backends import get_backend, keys_backend, select_backend

from ._helpers import NAMES, make_dout, make_inputs, make_reflection_inputs, run_with_grads


def _fake_parallel_path_attn(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None,
                             use_cache=False):
    """fla's contract: logits scale * (k_j^T H ... q_i + G_i - G_j), float32 w / beta / g."""
    assert w.dtype == beta.dtype == torch.float32, "w, beta must be float32"
    assert g is None or g.dtype == torch.float32, "g must be float32"
    assert cu_seqlens is None or cu_seqlens.dtype == torch.int64, "cu_seqlens must be int64"
    assert k.shape == w.shape and q.shape[-1] in (16, 32, 64, 128)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g_ours = None if g is None else g * scale  # fla(g) = path_attn(g * scale)
    o = path_attn_naive(q, k, v, w, beta, g_ours, scale=scale, cu_seqlens=cu_seqlens)
    return o.to(q.dtype), None


@pytest.fixture
def no_fla(monkeypatch):
    """fla-core not importable, whether or not it is installed here."""
    monkeypatch.setitem(sys.modules, "fla", None)


@pytest.fixture
def fake_fla(monkeypatch):
    """A fake fla package providing `fla.ops.path_attn.parallel_path_attn`."""
    names = ("fla", "fla.ops", "fla.ops.path_attn")
    modules = [types.ModuleType(name) for name in names]
    for parent, child, name in zip(modules, modules[1:], ("ops", "path_attn"), strict=False):
        setattr(parent, name, child)
    modules[-1].parallel_path_attn = _fake_parallel_path_attn
    for name, module in zip(names, modules, strict=True):
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def on_cpu(fake_fla, monkeypatch):
    """The fake fla with the backend's CUDA requirement relaxed to take CPU tensors."""
    monkeypatch.setattr(fla_backend, "DEVICE_TYPES", ("cuda", "cpu"))


def _q(D=16, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(1, 4, 2, D, dtype=dtype)  # [B, T, HQ, D]


def test_refuses_without_fla_core(no_fla):
    assert fla_backend.refuses(_q()) == "needs fla-core (pip install fla-core)"
    with pytest.raises(ValueError, match=r"^backend='fla': needs fla-core \(pip install"):
        path_attn(*make_inputs(1, 4, 2, 1, 16, 16), backend="fla")


def test_refuses_cpu_tensors(fake_fla):
    with pytest.raises(ValueError, match=r"^backend='fla': .*CUDA tensors, got a tensor on cpu"):
        select_backend("fla", _q())


@pytest.mark.parametrize("q, match", [
    pytest.param(_q(dtype=torch.float64), "float64 inputs need backend='torch'", id="f64"),
    pytest.param(_q(D=24), r"head dims \(16, 32, 64, 128\), got head dim D=24", id="D24"),
    pytest.param(_q(D=256), "got head dim D=256", id="D256"),
])
def test_refuses_dtype_and_head_dim(on_cpu, q, match):
    with pytest.raises(ValueError, match=f"^backend='fla': .*{match}"):
        select_backend("fla", q)
    assert select_backend("fla", _q()).name == "fla"


def test_refuses_value_head_dim_and_reflections(on_cpu):
    with pytest.raises(ValueError, match=r"^backend='fla': .*value head dims .*Dv=24"):
        path_attn(*make_inputs(1, 4, 2, 1, 16, 24), backend="fla")
    with pytest.raises(ValueError, match=r"^backend='fla': takes one reflection per token"):
        path_attn(*make_reflection_inputs(1, 4, 2, 1, 16, 16, 2), backend="fla")


def test_not_a_prefill_backend(on_cpu):
    with pytest.raises(ValueError, match=r"^backend='fla': path_attn_with_keys runs on"):
        keys_backend("fla", _q())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["f32", "f64", "bf16"])
def test_auto_never_picks_it(on_cpu, monkeypatch, dtype):
    """Even registered first and able to run the inputs, "fla" is passed over by "auto"."""
    fla = get_backend("fla")
    monkeypatch.setattr(backends, "_REGISTRY", {"fla": fla, **backends._REGISTRY})
    q = _q(dtype=dtype)
    assert not fla.auto(q)
    assert select_backend("auto", q).name != "fla"


CASES = [
    pytest.param(dict(B=2, HQ=2, H=2, gates=True), {}, id="MHA-gates"),
    pytest.param(dict(B=2, HQ=2, H=2, gates=False), {}, id="MHA-nogates"),
    pytest.param(dict(B=1, HQ=4, H=2, gates=True), {"scale": 0.3}, id="GQA-gates-scale"),
    pytest.param(dict(B=1, HQ=4, H=1, gates=True),
                 {"cu_seqlens": torch.tensor([0, 1, 9, 9, 20], dtype=torch.int32)},
                 id="MQA-packed"),
]


@pytest.mark.parametrize("shape, kwargs", CASES)
def test_adapter_matches_torch_backend(on_cpu, shape, kwargs):
    """path_attn(backend="fla") equals backend="torch" forward and in every gradient, with
    beta and g in float64 (their gradients come back in float64)."""
    B, HQ, H, gates = shape["B"], shape["HQ"], shape["H"], shape["gates"]
    inputs = make_inputs(B, 20, HQ, H, 16, 32, gates)
    inputs = inputs[:4] + tuple(None if x is None else x.double() for x in inputs[4:])
    dout = make_dout(B, 20, HQ, 32)
    ours = run_with_grads(path_attn, inputs, dout, backend="fla", **kwargs)
    ref = run_with_grads(path_attn, inputs, dout, backend="torch", **kwargs)
    assert ours[0].dtype == torch.float32
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-5)
    for name, x, a, b in zip(NAMES, inputs, ours[1], ref[1], strict=True):
        if x is None:
            assert a is None and b is None
            continue
        assert a.dtype == x.dtype, name
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_adapter_keeps_16_bit_dtypes(on_cpu):
    """bfloat16 q, k, v, w: o and every gradient in bfloat16 (w reached fla in float32)."""
    inputs = make_inputs(1, 12, 2, 1, 16, 16, dtype=torch.bfloat16)
    o, grads = run_with_grads(path_attn, inputs, make_dout(1, 12, 2, 16), backend="fla")
    assert o.dtype == torch.bfloat16
    assert [gr.dtype for gr in grads] == [torch.bfloat16] * 6
    ref = path_attn(*inputs, backend="torch")
    torch.testing.assert_close(o, ref, rtol=2e-2, atol=2e-2)
