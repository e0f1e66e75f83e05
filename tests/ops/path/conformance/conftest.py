"""The `backend` fixture of the conformance suite: every registered backend of the op
(`pathattn.ops.path.backends.backend_names()`), with what it supports here.

Every test of this folder that takes `backend` runs once per registered name (ids are the
names), so a new backend gets the whole suite by `register_backend` alone. Tests that also
take `block_size` run once per block size the backend accepts (`Limits`), tests that take
`low_dtype` once per 16-bit dtype the backend takes. A backend that cannot run at all here
(its C++ kernels cannot build, triton is not installed, no device it takes) is skipped with
its own reason; otherwise only the float64 tests of a backend without float64 skip.

What a backend takes is asked from the backend itself; the block sizes and head dims it
accepts live in `_specs.LIMITS` (see there).

PATHATTN_CONFORMANCE_TOY=1 registers "toy", the "torch" algorithm under another name with no
`with_keys` and never picked by "auto", before collection (`test_registry.py` checks that it
then gets every test).
"""

from __future__ import annotations

import os

import pytest

from pathattn.ops.path.backends import Backend, backend_names, get_backend, register_backend

from ._specs import LOW_DTYPES, BackendSpec, backend_spec, backend_specs

if os.environ.get("PATHATTN_CONFORMANCE_TOY") == "1" and "toy" not in backend_names():
    register_backend(Backend("toy", get_backend("torch").attention, lambda q: None,
                             auto=lambda q: False))


def _skipped(spec: BackendSpec):
    return pytest.param(spec.name, None, id=spec.name, marks=pytest.mark.skip(reason=spec.skip))


def pytest_generate_tests(metafunc):
    if "backend" not in metafunc.fixturenames:
        return
    specs = backend_specs()
    for extra, values in (("block_size", lambda s: (None,) + s.limits.block_sizes),
                          ("low_dtype", lambda s: [dt for dt in LOW_DTYPES if s.takes(dt)])):
        if extra in metafunc.fixturenames:
            params = []
            for s in specs:
                if s.skip is not None:
                    params.append(_skipped(s))
                    continue
                for x in values(s):
                    xid = LOW_DTYPES[x] if extra == "low_dtype" else f"C{x or 'default'}"
                    params.append(pytest.param(s.name, x, id=f"{s.name}-{xid}"))
            metafunc.parametrize(f"backend, {extra}", params, indirect=["backend"])
            return
    metafunc.parametrize("backend", [s.name for s in specs], indirect=True,
                         ids=[s.name for s in specs])


@pytest.fixture
def backend(request) -> BackendSpec:
    """The `BackendSpec` of one registered backend (skipped when it cannot run here)."""
    spec = backend_spec(request.param)
    if spec.skip is not None:
        pytest.skip(spec.skip)
    return spec
