"""Op tests run with the fused CPU kernels' workspace poisoned: every tensor the kernels
take from it starts as NaN, so a kernel that reads memory it did not write (or an
accumulator left unzeroed) fails the comparisons with the references, whatever earlier
calls left in the reused blocks."""

import pytest
import torch

from pathattn.ops.path.cpu import load_kernels


@pytest.fixture(autouse=True, scope="session")
def _poisoned_kernel_workspace():
    if not load_kernels():
        yield
        return
    before = torch.ops.pathattn_cpu.workspace_poison(True)
    yield
    torch.ops.pathattn_cpu.workspace_poison(before)
