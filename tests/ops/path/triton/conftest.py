"""Triton kernel tests: without a CUDA device the kernels run on Triton's CPU interpreter
(TRITON_INTERPRET=1, set by the root tests/conftest.py before any test module is collected:
triton reads it when a kernel is decorated, and other test directories may import triton
first). With a GPU the same tests run the compiled kernels on it."""
