"""Packed sequences (cu_seqlens, B = 1) on every backend against the float64 reference:
uneven lengths, empty and single-token sequences, sequences that end on, before and after a
block boundary, and one sequence as long as the input.
"""

from __future__ import annotations

import pytest

from ._cases import CU_70, Case, check_fp32

CASES = [
    pytest.param(Case(T=70, cu=CU_70), id="T70-lengths1_1_17_0_31_1_19-gates"),
    pytest.param(Case(T=70, cu=CU_70, gates=False), id="T70-lengths1_1_17_0_31_1_19-nogates"),
    pytest.param(Case(T=70, HQ=4, H=1, D=48, Dv=16, cu=CU_70), id="T70-MQA-D48"),
    pytest.param(Case(T=5, cu=(0, 1, 2, 3, 4, 5)), id="T5-all_length1"),
    pytest.param(Case(T=49, HQ=4, H=2, cu=(0, 16, 31, 48, 49), gates=False),
                 id="T49-lengths16_15_17_1-GQA-nogates"),
    pytest.param(Case(T=33, cu=(0, 0, 33, 33)), id="T33-one_sequence_between_empty"),
]


@pytest.mark.parametrize("case", CASES)
def test_fp32_cu_seqlens(backend, case):
    check_fp32(backend, case, backend.block_size)


def test_fp32_cu_seqlens_default_block_size(backend):
    """The backend's own block size (None): longer sequences, fewer blocks."""
    case = Case(T=100, cu=(0, 3, 3, 50, 51, 100))  # lengths 3, 0, 47, 1, 49
    check_fp32(backend, case)
