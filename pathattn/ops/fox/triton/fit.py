"""The FoX kernels as the launcher specializes them, for ahead-of-time compilation.

`specializations(D, dtype)` lists, per kernel, the `triton.jit` function, the argument
types (pointer dtypes, int32 scalars, 16-divisible strides and head counts as the JIT
infers them for a typical launch) and the compile-time arguments (`op.py`, `config.py`),
so that a tool compiles each for a GPU that need not be present (Triton's
`compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`) and reads registers, spills,
shared memory and the PTX. This module imports Triton; it must run with TRITON_INTERPRET
unset or 0 (the interpreter's kernels cannot be compiled).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...common import triton_gates as gates
from . import bwd, fwd
from ._common import TL_DTYPE
from .config import launch_config, padded_dim

__all__ = ["Specialization", "specializations", "KERNEL_NAMES"]

# cumsum / offset: the forward's prefix sums of the gates (input dtype), *_rev: the
# backward's suffix sums of dL/dG (float32); offsets_<BT>: the gates' block offsets per
# tile length
KERNEL_NAMES = ("fwd", "dkdv", "dq", "cumsum", "offset", "cumsum_rev", "offset_rev")
_TT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_FLOAT64 = {"G_ptr", "out_ptr", "total_ptr"}  # gates.py's outputs are float64
_FLOAT32 = {"lse_ptr", "delta_ptr", "dcol_ptr", "drow_ptr", "gs_ptr", "ge_ptr", "offs_ptr"}


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


def _signature(fn, dtype: torch.dtype, x_dtype: str = "fp32") -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if i in fn.constexprs:
            sig[name] = "constexpr"
        elif name == "table_ptr":
            sig[name] = "*i32"
        elif name == "x_ptr":
            sig[name] = "*" + x_dtype
        elif name in _FLOAT64:
            sig[name] = "*fp64"
        elif name.endswith("_ptr"):
            sig[name] = "*" + ("fp32" if name in _FLOAT32 else _TT[dtype])
        elif name.startswith("scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        if sig[name].startswith("*") or name.startswith("s") and name[1:2] in "qkvd" \
                and name.endswith(("_n", "_h")) or name in ("HQ", "H", "D", "DV", "NTOK"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def specializations(D: int, dtype: torch.dtype, group: int = 1, heads: int = 32
                    ) -> list[Specialization]:
    """Every kernel launch of a forward + backward for head dims D = Dv, inputs of `dtype`,
    GQA group `group`, `heads` query heads (the gate kernels' head tile), with the
    launcher's tile length, warps and stages."""
    cfg = launch_config(D, D, dtype)
    BD = padded_dim(D)
    common = {"GROUP": group, "BD": BD, "BDV": BD, "DT": TL_DTYPE[dtype],
              "PREC": "tf32x3" if dtype == torch.float32 else "tf32", "EMULATE": False}
    out = []
    for name, fn, extra in (("fwd", fwd._fwd_kernel, {"SPLIT_O": dtype != torch.float32}),
                            ("dkdv", bwd._dkdv_kernel, {}), ("dq", bwd._dq_kernel, {})):
        launch = cfg.launch(name)
        sig, attrs = _signature(fn, dtype)
        out.append(Specialization(name, fn, sig, {**common, **extra, "BT": cfg.tile(name),
                                                  "STAGES": launch["stages"]},
                                  attrs, launch["num_warps"]))
    BH = gates.head_tile(heads)
    for suffix, x_dtype, reverse, tile in (("", _TT[dtype], False, "fwd"),
                                           ("_rev", "fp32", True, "dq")):
        for name, fn, extra in (("cumsum", gates._tile_cumsum_kernel, {"FINITE": False}),
                                ("offset", gates._tile_offset_kernel, {"BB": 32})):
            sig, attrs = _signature(fn, dtype, x_dtype)
            out.append(Specialization(name + suffix, fn, sig,
                                      {"REVERSE": reverse, "BT": cfg.tile(tile), "BH": BH,
                                       **extra}, attrs, 4))
    # the gates' block offsets, once per tile length of fwd, dkdv, dq
    for BT in sorted({cfg.tile(k) for k in ("fwd", "dkdv", "dq")}):
        sig, attrs = _signature(gates._block_offsets_kernel, dtype)
        out.append(Specialization(f"offsets_{BT}", gates._block_offsets_kernel, sig,
                                  {"BT": BT, "BH": BH}, attrs, 4))
    return out
