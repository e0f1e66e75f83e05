"""The `launch_settings` section of `gpu_check.py`: launch settings other than the defaults
of `pathattn.ops.path.triton.config`, each timed against the defaults at one shape, so that
a change of the tables there is a measured one.

One row per setting (bfloat16, gates, D = 64, T = the plan's middle sequence length, B * T
= the plan's tokens): forward and forward + backward ms of the Triton op with that one
setting changed, the others at their defaults, and the ratio to the default row of its
head dim (the last two rows: D = 128's defaults, and its former key tiles):

  block_size  32-token blocks (the default is the largest that fits: 64 on an H100)
  seg         half and twice the default blocks per segment (about sqrt of the blocks)
  warps       8 warps for fwd, bwd or bwd_kv (default 4; `LaunchConfig.warps`)
  kv_tiles    (keys, queries) per step of the key-parallel kernel (`config.KV_TILES`)
  walk_hoist  the query kernel's walk with per-element offsets (`config.WALK_HOIST`)
  own_hoist   its own-segment loop with per-element offsets (`config.OWN_HOIST`)

A ratio below 1 names a faster setting for the device's architecture. Each row runs in its
own process (8 warps or other tiles compile kernels never run before: a fault costs only
its row; the Triton cache is shared, so a row compiles only the kernels its setting
changes, 10-20 s each on an H100); rows past the budget are skipped. `--cpu-smoke` runs
two rows on Triton's interpreter. Called as `launch_settings(ctx, sec)`
with `_gpu_sections.Context`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from _attn_gpu import _candidate, free, path_inputs, time_ms
from _children import run_children

from pathattn.ops.path.triton import config
from pathattn.ops.path.triton.op import path_attn_triton
from pathattn.ops.path.triton.tables import default_seg

__all__ = ["launch_settings", "settings", "child"]

ROOT = Path(__file__).resolve().parents[1]
MARK = "GPU_CHECK_LAUNCH "
CHILD_TIMEOUT = 150.0  # seconds per row: start, compilation of its kernels, timing


def settings(smoke: bool) -> list[tuple[str, str, dict]]:
    """(name, value shown, change) per row: change holds block_size / seg (call arguments)
    or fields of `config.device_settings` to replace ("warps": (kernel, n), "kv": (BKT,
    BQ), "fields": {field: value})."""
    if smoke:
        return [("seg", "x2", {"seg_scale": 2.0}),
                ("walk_hoist", "on", {"fields": {"walk_hoist": True}})]
    return ([("block_size", "32", {"block_size": 32}),
             ("seg", "x0.5", {"seg_scale": 0.5}), ("seg", "x2", {"seg_scale": 2.0})]
            + [("warps", f"{k} 8", {"warps": (k, 8)}) for k in ("fwd", "bwd", "bwd_kv")]
            # the query kernel's walk and own-segment loop with per-element offsets
            # (`config.WALK_HOIST`, `OWN_HOIST`)
            + [("walk_hoist", "off", {"fields": {"walk_hoist": False}}),
               ("own_hoist", "off", {"fields": {"own_hoist": False}})]
            + [("kv_tiles", f"{a}x{b}", {"kv": (a, b)}) for a, b in ((32, 64), (64, 32),
                                                                     (32, 32))]
            # D = 128 (32-token blocks): its own defaults (key tiles 128x64, 8 warps), and
            # the key tiles they replaced (32x32, then 16x32) and 64x64, at 4 warps
            + [("default", "D 128", {"D": 128})]
            + [("kv_tiles", f"{a}x{b} 4 warps D 128",
                {"D": 128, "kv": (a, b), "warps": ("bwd_kv", 4)})
               for a, b in ((32, 32), (16, 32), (64, 64))]
            + [("own_hoist", "off D 128", {"D": 128, "fields": {"own_hoist": False}})])


def _default_seg(T: int, cfg: config.LaunchConfig) -> int:
    return default_seg(-(-T // cfg.BT), cfg.seg_multiple())


def _row(device: torch.device, plan, shape: tuple, change: dict) -> dict:
    B, T, H, D = shape
    row = {"B": B, "T": T, "H": H, "D": D}
    default = config.device_settings
    try:
        if {"warps", "kv", "fields"} & set(change):
            def changed(*a, **kw):
                s = dict(default(*a, **kw))
                if "warps" in change:
                    s["warps"] = tuple({**dict(s["warps"]), change["warps"][0]:
                                        change["warps"][1]}.items())
                if "kv" in change:
                    s["kv"] = (*change["kv"], s["kv"][2])
                s.update(change.get("fields", {}))
                return s
            config.device_settings = changed
        block = change.get("block_size")
        cfg = config.device_launch_config(D, D, torch.bfloat16, device, block)
        BT = cfg.BT
        row |= {"warps": "/".join(str(cfg.launch(k)[0]) for k in ("fwd", "bwd", "bwd_kv")),
                "kv_tiles": "x".join(map(str, cfg.kv_tiles())),
                "walk_hoist": cfg.walk_hoist, "own_hoist": cfg.own_hoist}  # as launched
        seg = 0
        if "seg_scale" in change:
            seg = max(1, round(_default_seg(T, cfg) * change["seg_scale"]))
        row |= {"BT": BT, "seg": seg or _default_seg(T, cfg)}
        xs = path_inputs(B, T, H, H, D, torch.bfloat16, True, device)
        dout = torch.randn(B, T, H, D, device=device, dtype=torch.bfloat16)
        cand = _candidate(lambda: path_attn_triton(*xs, block_size=block, seg=seg), list(xs),
                          dout)
        row["fwd_ms"] = time_ms(cand.fwd, plan.repeats, device, plan.warmup)
        row["fwdbwd_ms"] = time_ms(cand.fwd_bwd, plan.repeats, device, plan.warmup)
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - recorded in the row
        row |= {"status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        config.device_settings = default
        free(device)
    return row


def _shape(plan, change: dict) -> tuple:
    T = plan.seq_lens[len(plan.seq_lens) // 2]
    return (max(1, plan.tokens // T), T, plan.heads, change.get("D", plan.dims[0]))


def child(mode: str, plan, index: int) -> int:
    """In a subprocess: row `index` of the section (0 the defaults, i the (i - 1)-th of
    `settings`); prints one MARK line of JSON."""
    change = {} if index == 0 else settings(mode == "cpu-smoke")[index - 1][2]
    row = _row(torch.device(plan.device), plan, _shape(plan, change), change)
    print(MARK + json.dumps(row), flush=True)
    return 0


def _run_child(ctx, index: int) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--child-launch",
           str(index)] + {"full": [], "quick": ["--quick"], "cpu-smoke": ["--cpu-smoke"]}[
               ctx.mode]
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    done = run_children({"row": cmd}, 1, min(CHILD_TIMEOUT, max(ctx.left() + 30, 1.0)),
                        ROOT, env)["row"]
    text = done.out + done.err
    found = [line for line in text.splitlines() if line.startswith(MARK)]
    if found:
        return json.loads(found[-1][len(MARK):]) | {"seconds": round(done.seconds, 1)}
    return {"status": f"no result (exit {done.returncode}"
                      f"{', timeout' if done.timed_out else ''})", "tail": text[-300:]}


def launch_settings(ctx, sec) -> None:
    """The default row, then one per `settings` row, each in its own process (a setting
    that faults costs only its row)."""
    base = {"setting": "default", "value": ""} | _run_child(ctx, 0)
    ctx.add_row(sec, base)
    bases = {base.get("D"): base}  # a head dim's rows are compared with its defaults
    for i, (name, value, change) in enumerate(settings(ctx.mode == "cpu-smoke"), start=1):
        head = {"setting": name, "value": value}
        if ctx.expired():
            ctx.add_row(sec, head | {"status": "skipped (budget)"})
            continue
        row = head | _run_child(ctx, i)
        if name == "default":
            bases[change["D"]] = row
        else:
            ref = bases.get(row.get("D"), {})
            for m in ("fwd_ms", "fwdbwd_ms"):
                if isinstance(row.get(m), float) and isinstance(ref.get(m), float):
                    row[f"{m.removesuffix('_ms')}/default"] = row[m] / ref[m]
        ctx.add_row(sec, row)
