"""Language-model sections of `gpu_check.py`: decoding speed and the LM commands on a GPU.
Each is a function (ctx, sec) in the style of `_gpu_sections` (rows through
`ctx.add_row`, so the report is rewritten as they come; `ctx.mode` "cpu-smoke" runs the
plumbing at tiny sizes on the CPU).

generate       ms per token of Hugging Face generate() after a 2048-token prompt: PaTH,
               PaTH-FoX, FoX and RoPE `PaTHForCausalLM` against transformers'
               LlamaForCausalLM of the same size (the 760m preset's shape), bf16, B = 1,
               greedy; per token = (generate(65) - generate(1)) / 64, minima over the
               repeats, models interleaved. Columns: ratio to Llama (goal <= 1.2), the host
               reads of one decode step (`pathattn.utils.host_reads.HostReads`: value reads,
               value-dependent shapes, transfers) and, on CUDA, the synchronising CUDA calls
               of one decode step (torch.cuda.set_sync_debug_mode).
lm_commands    `pathattn prepare` of a small local corpus, then `pathattn pretrain` for a
               few steps on the GPU (float32 and bf16 autocast) and on the CPU (float32),
               the loss curves compared step by step; `--dp fsdp` under torchrun on one GPU
               against the plain GPU run; then `convert`, `eval ppl` (GPU bf16 against the
               CPU's float32 perplexity) and `eval longctx` smoke runs on the GPU. Each
               command runs as a subprocess (`python -m pathattn ...`) with a timeout.

Tolerances (relative, per step of the loss curve, over the same batches and init):
    GPU float32 vs CPU float32        5e-3  (TF32-free float32, but other kernels and
                                             reduction orders; the Triton kernels
                                             accumulate in float32)
    GPU bf16 autocast vs CPU float32  2e-2  (bf16 activations over a few steps)
    FSDP2 on 1 GPU vs plain GPU       1e-5  (the same arithmetic on one rank)
    eval ppl, GPU bf16 vs CPU float32 2e-2
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TOL_FP32, TOL_BF16, TOL_FSDP, TOL_PPL = 5e-3, 2e-2, 1e-5, 2e-2
GOAL = 1.2  # generate() per token, PaTH <= 1.2x Llama
WORDS = ("the a river stone mill cloud hill boat shore bird light road town green blue "
         "north south rain wind old new small large quiet bright").split()


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _smoke(ctx) -> bool:
    return ctx.mode == "cpu-smoke"


# ---------------------------------------------------------------------------- generate

def _gen_sizes(ctx) -> dict:
    if _smoke(ctx):
        return dict(hidden=32, layers=2, heads=4, intermediate=64, vocab=64, prompt=32,
                    new=5, repeats=1, dtype=torch.float32)
    quick = ctx.mode == "quick"
    return dict(hidden=1536, layers=24, heads=24, intermediate=4096, vocab=32768,
                prompt=2048, new=33 if quick else 65, repeats=2 if quick else 3,
                dtype=torch.bfloat16)


def _build(name: str, size: dict, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from pathattn.hf import PaTHConfig, PaTHForCausalLM

    shape = dict(vocab_size=size["vocab"], hidden_size=size["hidden"],
                 intermediate_size=size["intermediate"], num_hidden_layers=size["layers"],
                 num_attention_heads=size["heads"], tie_word_embeddings=False,
                 max_position_embeddings=size["prompt"] + size["new"] + 16)
    torch.manual_seed(0)
    with torch.device(device):
        if name == "llama":
            model = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="sdpa"))
        else:
            model = PaTHForCausalLM(PaTHConfig(**shape, attn_type=name))
    return model.to(size["dtype"]).eval()


def _generate(model, ids: torch.Tensor, new: int) -> None:
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                   min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)


def _step_reads(model, ids: torch.Tensor) -> tuple[int, int | None]:
    """(host reads, synchronising CUDA calls) of one decode step after the prompt."""
    import contextlib

    from pathattn.utils.host_reads import HostReads
    from pathattn.utils.value_checks import device_side_checks

    # on the CPU (--cpu-smoke), the decode step takes the GPU's path of value checks
    checks = device_side_checks() if ids.device.type == "cpu" else contextlib.nullcontext()
    with torch.no_grad(), checks:
        out = model(ids, attention_mask=torch.ones_like(ids), use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        mask = torch.ones(1, ids.shape[1] + 1, dtype=ids.dtype, device=ids.device)
        step = {"cache" if hasattr(out, "cache") and out.cache is not None
                else "past_key_values": cache}
        out = model(tok, attention_mask=mask, use_cache=True, **step)  # warm-up step
        tok, mask = out.logits[:, -1:].argmax(-1), torch.cat([mask, mask[:, :1]], 1)
        _sync(ids.device)
        with HostReads() as reads:
            out = model(tok, attention_mask=mask, use_cache=True, **step)
        syncs = None
        if ids.device.type == "cuda":
            tok, mask = out.logits[:, -1:].argmax(-1), torch.cat([mask, mask[:, :1]], 1)
            _sync(ids.device)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    model(tok, attention_mask=mask, use_cache=True, **step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught)
    return len(reads.events), syncs


def generate(ctx, sec: dict) -> None:
    """ms per generated token after a long prompt, PaTH types against Llama."""
    size = _gen_sizes(ctx)
    names = ["llama", "path", "path_fox", "fox", "rope"]
    sec["info"] = {k: str(v) for k, v in size.items()} | {
        "B": 1, "per_token": f"(generate({size['new']}) - generate(1)) / {size['new'] - 1}",
        "goal": f"path <= {GOAL}x llama", "decoding": "greedy, attention_mask of ones"}
    device = ctx.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, size["vocab"], (1, size["prompt"]), generator=gen).to(device)
    models, rows = {}, {}
    for name in names:
        try:
            models[name] = _build(name, size, device)
            with torch.no_grad():
                _generate(models[name], ids, 2)  # warm-up
            _sync(device)
        except Exception as e:  # noqa: BLE001 - recorded, the other models run
            rows[name] = {"model": name, "status": "error", "error": _short(e)}
    times = {n: {"short": [], "long": []} for n in models}
    with torch.no_grad():
        for r in range(size["repeats"]):
            order = list(models)[r % max(len(models), 1):] + list(models)[:r % max(len(models), 1)]
            for name in order:
                if ctx.expired():
                    break
                for call, new in (("short", 1), ("long", size["new"])):
                    _sync(device)
                    t0 = time.perf_counter()
                    _generate(models[name], ids, new)
                    _sync(device)
                    times[name][call].append((time.perf_counter() - t0) * 1e3)
    base = None
    for name in names:
        if name in rows:
            ctx.add_row(sec, rows[name])
            continue
        t = times[name]
        if not t["long"]:
            ctx.add_row(sec, {"model": name, "status": "skipped (budget)"})
            continue
        per_token = (min(t["long"]) - min(t["short"])) / (size["new"] - 1)
        if per_token <= 0:  # timing noise larger than the decode steps: no figure
            ctx.add_row(sec, {"model": name, "status": "unreliable (long run not slower "
                              "than the short one)", "prompt_ms": min(t["short"])})
            continue
        base = per_token if name == "llama" else base
        row = {"model": name, "status": "ok", "prompt_ms": min(t["short"]),
               "per_token_ms": per_token,
               "vs_llama": None if base is None else per_token / base}
        try:
            row["host_reads_per_step"], row["cuda_syncs_per_step"] = _step_reads(
                models[name], ids)
        except Exception as e:  # noqa: BLE001
            row["reads_error"] = _short(e)
        if name != "llama" and row["vs_llama"] is not None:
            row["goal_met"] = row["vs_llama"] <= GOAL
        ctx.add_row(sec, row)
    models.clear()


# ------------------------------------------------------------------------- lm_commands

def _corpus(folder: Path, docs: int) -> None:
    folder.mkdir(parents=True)
    rng = random.Random(0)
    for i in range(docs):
        words = [rng.choice(WORDS) for _ in range(rng.randrange(60, 200))]
        (folder / f"doc{i}.txt").write_text(" ".join(words) + ".\n")


def _command(ctx, args: list[str], timeout: float, torchrun: bool = False
             ) -> tuple[int, float, str]:
    """(exit code, seconds, tail of stdout + stderr) of `python -m pathattn ARGS` (or
    under torchrun with one process)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    cmd = [sys.executable, "-m", "pathattn", *args]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "1", "-m", "pathattn", *args]
    t0 = time.time()
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=max(10.0, min(timeout, ctx.left())))
        code, text = run.returncode, run.stdout[-1500:] + run.stderr[-1500:]
    except subprocess.TimeoutExpired:
        code, text = 124, "timeout"
    return code, time.time() - t0, text


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()
            if line.strip()]


def _curve_row(ctx, sec, what: str, got: list[float], ref: list[float], tol: float) -> None:
    if not got or len(got) != len(ref):
        ctx.add_row(sec, {"check": what, "status": "error",
                          "error": f"{len(got)} losses against {len(ref)}"})
        return
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref, strict=True))
    ctx.add_row(sec, {"check": what, "status": "ok", "steps": len(got),
                      "max_rel_diff": worst, "tolerance": tol, "within": worst <= tol,
                      "first_loss": got[0], "last_loss": got[-1]})


def lm_commands(ctx, sec: dict) -> None:
    """The LM commands on the device (module docstring)."""
    smoke = _smoke(ctx)
    dev = "cpu" if smoke else "cuda"
    steps = 3 if smoke else 12
    sec["info"] = {"device": dev, "steps": steps, "preset": "cpu-tiny", "seq_len": 64,
                   "batch_size": 4, "tolerances": {"gpu_fp32_vs_cpu": TOL_FP32,
                                                   "gpu_bf16_vs_cpu": TOL_BF16,
                                                   "fsdp_1gpu_vs_plain": TOL_FSDP,
                                                   "ppl_bf16_vs_cpu": TOL_PPL}}
    root = Path(tempfile.mkdtemp(prefix="gpu_lm_"))
    _corpus(root / "corpus", 12 if smoke else 80)
    for args in (["tokenizer", "--input", str(root / "corpus"), "--vocab-size", "300",
                  "--out", str(root / "tok"), "--no-progress"],
                 ["prepare", "--input", str(root / "corpus"), "--tokenizer", str(root / "tok"),
                  "--out", str(root / "data"), "--val-fraction", "0.3", "--workers", "1"]):
        code, secs, text = _command(ctx, args, 300)
        ctx.add_row(sec, {"check": args[0], "status": "ok" if code == 0 else "error",
                          "seconds": secs, **({} if code == 0 else {"error": text})})
        if code:
            return
    common = ["pretrain", "--data", str(root / "data"), "--preset", "cpu-tiny", "--attn",
              "path", "--steps", str(steps), "--seq-len", "64", "--batch-size", "4",
              "--packing", "windows", "--log-every", "1", "--eval-every", "1000",
              "--checkpoint-every", "1000", "--final-eval-batches", "2", "--no-progress"]
    runs = {"cpu_fp32": ["--device", "cpu"],
            "dev_fp32": ["--device", dev],
            "dev_bf16": ["--device", dev, "--dtype", "bfloat16"]}
    losses = {}
    for name, extra in runs.items():
        code, secs, text = _command(ctx, [*common, *extra, "--out", str(root / name)], 600)
        ctx.add_row(sec, {"check": f"pretrain {name}", "status": "ok" if code == 0 else
                          "error", "seconds": secs, **({} if code == 0 else {"error": text})})
        if code == 0:
            losses[name] = _losses(root / name)
    ref = losses.get("cpu_fp32")
    if ref is not None:
        for name, tol in (("dev_fp32", TOL_FP32), ("dev_bf16", TOL_BF16)):
            if name in losses:
                _curve_row(ctx, sec, f"loss {name} vs cpu_fp32", losses[name], ref, tol)
    code, secs, text = _command(ctx, [*common, "--device", dev, "--dp", "fsdp", "--out",
                                      str(root / "fsdp")], 600, torchrun=True)
    ctx.add_row(sec, {"check": "pretrain fsdp (torchrun, 1 process)",
                      "status": "ok" if code == 0 else "error", "seconds": secs,
                      **({} if code == 0 else {"error": text})})
    if code == 0 and "dev_fp32" in losses:
        _curve_row(ctx, sec, "loss fsdp vs dev_fp32", _losses(root / "fsdp"),
                   losses["dev_fp32"], TOL_FSDP)
    model = root / "dev_bf16" / "hf"
    if not (model / "config.json").is_file():
        model = root / "cpu_fp32" / "hf"
    _teacher(root)
    smoke_cmds = {
        "convert": ["convert", "--teacher", str(root / "teacher"), "--data",
                    str(root / "data"), "--out", str(root / "conv"), "--stage1-tokens",
                    "512", "--stage2-tokens", "512", "--seq-len", "64", "--batch-size", "4",
                    "--dtype", "bfloat16", "--device", dev, "--no-progress"],
        "eval ppl cpu fp32": ["eval", "ppl", "--model", str(model), "--data",
                              str(root / "data"), "--lengths", "32", "64", "--device", "cpu",
                              "--out", str(root / "ppl_cpu"), "--no-progress"],
        "eval ppl dev bf16": ["eval", "ppl", "--model", str(model), "--data",
                              str(root / "data"), "--lengths", "32", "64", "--device", dev,
                              "--dtype", "bfloat16", "--out", str(root / "ppl_dev"),
                              "--no-progress"],
        "eval longctx": ["eval", "longctx", "--model", str(model), "--task", "niah",
                         "--lengths", "512", "--n", "1", "--device", dev, "--dtype",
                         "bfloat16", "--out", str(root / "longctx"), "--no-progress"],
    }
    for name, args in smoke_cmds.items():
        if ctx.expired():
            ctx.add_row(sec, {"check": name, "status": "skipped (budget)"})
            continue
        code, secs, text = _command(ctx, args, 600)
        ctx.add_row(sec, {"check": name, "status": "ok" if code == 0 else "error",
                          "seconds": secs, **({} if code == 0 else {"error": text})})
    try:
        cpu = json.loads((root / "ppl_cpu" / "ppl.json").read_text())
        gpu = json.loads((root / "ppl_dev" / "ppl.json").read_text())
        worst = _ppl_diff(cpu, gpu)
        ctx.add_row(sec, {"check": "eval ppl dev bf16 vs cpu fp32", "status": "ok",
                          "max_rel_diff": worst, "tolerance": TOL_PPL,
                          "within": worst <= TOL_PPL})
    except (OSError, ValueError, KeyError) as e:
        ctx.add_row(sec, {"check": "eval ppl dev bf16 vs cpu fp32", "status": "error",
                          "error": _short(e)})


def _ppl_diff(a: dict, b: dict) -> float:
    """Largest relative difference of b's perplexities from a's (two ppl.json files: every
    "ppl" record {length: value}, in order)."""
    def values(x) -> list[float]:
        if isinstance(x, dict):
            out = []
            for k, v in x.items():
                if k == "ppl" and isinstance(v, dict):
                    out += [float(p) for p in v.values()]
                else:
                    out += values(v)
            return out
        if isinstance(x, list):
            return [p for v in x for p in values(v)]
        return []

    va, vb = values(a), values(b)
    if not va or len(va) != len(vb):
        raise ValueError(f"ppl.json: {len(va)} against {len(vb)} perplexities")
    return max(abs(y - x) / abs(x) for x, y in zip(va, vb, strict=True))


def _teacher(root: Path) -> None:
    """A small random Llama with the corpus's tokenizer: the teacher of `convert`."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = root / "teacher"
    shutil.copytree(root / "tok", folder)
    vocab = json.loads((root / "data" / "meta.json").read_text())
    size = vocab.get("vocab_size") or vocab["tokenizer"]["vocab_size"]
    LlamaForCausalLM(LlamaConfig(vocab_size=size, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=256,
                                 tie_word_embeddings=True)).save_pretrained(folder)
