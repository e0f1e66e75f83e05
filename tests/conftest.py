"""Shared pytest setup: every test starts from the same global RNG state; without a CUDA
device, Triton kernels run on Triton's CPU interpreter.

TRITON_INTERPRET must be set before anything imports triton or decorates a kernel (other
test directories import transformers and torch.compile, which may import triton), so it is
set here, when pytest loads the root conftest, before any test module is collected.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
