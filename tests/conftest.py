"""Shared pytest setup: every test starts from the same global RNG state."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
