"""`HostReads` records each kind of host read it names (so that a test asserting none
proves something), and restores the Tensor methods it wraps."""

from __future__ import annotations

import pytest
import torch

from pathattn.utils.host_reads import HostReads
from pathattn.utils.value_checks import mask_on_device

READS = {
    "item": lambda x: x.sum().item(),
    "bool": lambda x: bool(x.any()),
    "if": lambda x: 1 if x[0] > 0 else 0,
    "int": lambda x: int(x[0]),
    "tolist": lambda x: x.tolist(),
    "numpy": lambda x: x.numpy(),
    "nonzero": lambda x: x.nonzero(),
    "bool_index": lambda x: x[x > 0],
    "masked_select": lambda x: x.masked_select(x > 0),
    "unique": lambda x: torch.unique(x),
    "equal": lambda x: torch.equal(x, x),
    "from_host": lambda x: torch.tensor([1.0, 2.0]),
    "aminmax_tolist": lambda x: torch.stack(torch.aminmax(x)).tolist(),
}


@pytest.mark.parametrize("read", list(READS.values()), ids=list(READS))
def test_records(read):
    x = torch.arange(-2.0, 3.0)
    with HostReads() as reads:
        read(x)
    assert reads.events, "not recorded"
    assert "test_host_reads.py" in reads.events[0][1]  # where: the caller's line


def test_device_ops_record_nothing():
    x = torch.arange(-2.0, 3.0)
    with HostReads() as reads:
        y = torch.where(x > 0, x, x.new_zeros(()))
        y = y.cumsum(0).sort().values[x.argmax(0, keepdim=True)]
        torch._assert_async((y >= 0).all(), "never")
        torch.ones(3, device=x.device).fill_(True)
        mask_on_device(torch.ones(2, 3, dtype=torch.long), 2, 3, x.device)
    assert not reads.events, reads.report()


def test_restores_tensor_methods():
    before = torch.Tensor.tolist
    with pytest.raises(RuntimeError), HostReads():
        raise RuntimeError("inside")
    assert torch.Tensor.tolist is before
    assert torch.arange(3).tolist() == [0, 1, 2]
