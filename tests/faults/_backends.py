"""The op's registered backends (`pathattn.ops.path.backends`), for fault tests that must hold on
every one of them: the `op` fixture is `path_attn(..., backend=name)` for each registered
name, on the device the backend runs on, with 16-token blocks (short sequences span several
blocks). A backend that cannot run here (its C++ kernels cannot build, triton is not
installed) is skipped with its reason (`tests.ops.path.conformance._specs`).
"""

from __future__ import annotations

import pytest

from pathattn.ops.path.backends import backend_names
from tests.ops.path.conformance._specs import backend_spec

BACKENDS = list(backend_names())


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def op(request):
    """path_attn on one registered backend: op(*inputs, **kwargs), output on the CPU."""
    spec = backend_spec(request.param)
    if spec.skip is not None:
        pytest.skip(spec.skip)

    def run(*inputs, **kwargs):
        return spec.op(*inputs, **{"block_size": spec.block_size, **kwargs})

    run.name = spec.name
    return run
