"""The stick-breaking kernels as the launcher specializes them, for ahead-of-time
compilation.

`specializations(D, dtype)` lists, per kernel, the `triton.jit` function, the argument
types (pointer dtypes, int32 scalars, 16-divisible strides as the JIT infers them for a
typical launch) and the compile-time arguments (`op.py`, `config.py`), so that a tool
compiles each for a GPU that need not be present and reads registers, spills, shared
memory and the PTX (`tests/ops/sba/triton/test_compiled.py`). This module imports Triton;
it must run with TRITON_INTERPRET unset or 0 (the interpreter's kernels cannot be
compiled).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...common.triton_tiles import TL_DTYPE, padded_dim
from . import bwd, fwd
from .config import launch_config

__all__ = ["Specialization", "specializations", "KERNEL_NAMES"]

KERNEL_NAMES = ("fwd", "dq", "dkdv")
_TT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_FLOAT32 = {"run_ptr", "pre_ptr"}
_DIVISIBLE = {"N", "D", "DV"}  # besides pointers and the token / head strides


@dataclass(frozen=True)
class Specialization:
    """One kernel launch: name, function, signature (argument -> type string),
    compile-time arguments, divisibility attributes, num_warps and num_stages."""

    name: str
    fn: object
    signature: dict
    constexprs: dict
    attrs: dict
    num_warps: int
    num_stages: int = 1


def _signature(fn, dtype: torch.dtype) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if i in fn.constexprs:
            sig[name] = "constexpr"
        elif name == "table_ptr":
            sig[name] = "*i32"
        elif name.endswith("_ptr"):
            sig[name] = "*" + ("fp32" if name in _FLOAT32 else _TT[dtype])
        elif name.startswith("scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        stride = name.startswith("s") and name.endswith(("_n", "_h"))
        if sig[name].startswith("*") or stride or name in _DIVISIBLE:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def specializations(D: int, dtype: torch.dtype, group: int = 1,
                    attend_current: bool = False) -> list[Specialization]:
    """The three kernels of a forward + backward for head dims D = Dv, inputs of `dtype`,
    GQA group `group`, with the launcher's tile lengths, warps and stages."""
    cfg = launch_config(D, D, dtype)
    BD = padded_dim(D)
    common = {"GROUP": group, "BD": BD, "BDV": BD, "DT": TL_DTYPE[dtype],
              "PREC": "tf32x3" if dtype == torch.float32 else "tf32", "EMULATE": False,
              "CURRENT": attend_current}
    out = []
    for name, fn in (("fwd", fwd._fwd_kernel), ("dq", bwd._dq_kernel),
                     ("dkdv", bwd._dkdv_kernel)):
        launch = cfg.launch(name)
        sig, attrs = _signature(fn, dtype)
        out.append(Specialization(name, fn, sig, {**common, "BT": cfg.tile(name),
                                                  "STAGES": launch["stages"]},
                                  attrs, launch["num_warps"]))
    return out
