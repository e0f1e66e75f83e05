"""Shared pytest setup: every test starts from the same global RNG state; without a CUDA
device, Triton kernels run on Triton's CPU interpreter.

TRITON_INTERPRET must be set before anything imports triton or decorates a kernel (other
test directories import transformers and torch.compile, which may import triton), so it is
set here, when pytest loads the root conftest, before any test module is collected.

Order: the files holding a test marked `slow` are collected first, and pytest-xdist keeps
that order (it would otherwise hand out the files with the most tests first, leaving the
few long ones for the end): with `-n 2 --dist loadfile` the long files start at once and
the short ones fill in around them.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist present
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order within kept
