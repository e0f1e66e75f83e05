"""Triton kernel tests: without a CUDA device the kernels run on Triton's CPU interpreter.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when pathattn.ops.triton.op is
first imported (lazily, from the first Triton call), so setting it here, at collection of
this directory and before any test runs, is early enough. With a GPU the same tests run the
compiled kernels on it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
