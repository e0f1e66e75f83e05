"""CPU timing of Hugging Face `generate()` decoding: PaTH against transformers' Llama.

Three models of the same size (width, layers, heads, vocabulary, MLP width, tied
embeddings), built locally from configs with random weights, float32, B = 1:

    llama   transformers' LlamaForCausalLM (the baseline; its own DynamicCache, SDPA)
    path    PaTHForCausalLM, attn_type "path" (decode: `PaTHAttention.decode`)
    rope    PaTHForCausalLM, attn_type "rope" (pathattn's own RoPE baseline)

Per decoded token: (time of generate(max_new_tokens=129) - time of
generate(max_new_tokens=1)) / 128 after the same --prompt-len prompt (default 2048), both
greedy and forced to their full length, so the prompt's prefill cancels out. Each time is
the minimum over --repeats; the models alternate call by call (rotating order), so slow
phases of a shared machine hit all of them. Ratios are model / llama. Two clocks: wall
time, and the process's CPU time (time.process_time), which leaves out the time other
processes hold the cores: on a shared machine with --threads 1 the CPU-time ratios are the
steadier ones (with more threads, waiting workers may spin and count as CPU time).

    python benchmarks/bench_generate_cpu.py                 # prompt 2048, 5 repeats
    python benchmarks/bench_generate_cpu.py --quick         # smoke test
    python benchmarks/bench_generate_cpu.py --profile path  # where a decoded token's time goes

--profile NAME skips the timing and prints torch.profiler's table of the ops of 64 decode
steps of that model (after the prompt), sorted by their own CPU time.
Results also go to --out/bench_generate_cpu.json (config, system info, raw times in ms).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _env import load_average, system_info  # benchmarks/ is on sys.path
from transformers import LlamaConfig, LlamaForCausalLM

from pathattn.hf import PaTHConfig, PaTHForCausalLM

OUT_NAME = "bench_generate_cpu"
GOAL = 1.1  # path per token <= 1.1x llama


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (2048)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="tokens of the long generate() call (129); the short one makes 1")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per model (5)")
    p.add_argument("--hidden", type=int, default=256, help="width (256)")
    p.add_argument("--layers", type=int, default=4, help="layers (4)")
    p.add_argument("--heads", type=int, default=4, help="heads (4)")
    p.add_argument("--intermediate", type=int, default=688, help="MLP width (688)")
    p.add_argument("--vocab", type=int, default=8192, help="vocabulary (8192)")
    p.add_argument("--models", nargs="+", default=["llama", "path", "rope"],
                   choices=("llama", "path", "rope", "path_fox"), help="models to time")
    p.add_argument("--profile", default=None, choices=("llama", "path", "rope", "path_fox"),
                   help="profile this model's decode steps instead of timing")
    p.add_argument("--quick", action="store_true", help="prompt 256, 33 tokens, 2 repeats")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"),
                   help="directory for the JSON results (default benchmarks/out)")
    args = p.parse_args(argv)
    for name, (full, quick) in {"prompt_len": (2048, 256), "new_tokens": (129, 33),
                                "repeats": (5, 2)}.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def build_model(name: str, args: argparse.Namespace) -> torch.nn.Module:
    """One model of the shared size, random weights, eval mode."""
    max_pos = args.prompt_len + args.new_tokens + 16
    size = dict(vocab_size=args.vocab, hidden_size=args.hidden,
                intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                num_attention_heads=args.heads, max_position_embeddings=max_pos,
                tie_word_embeddings=True)
    torch.manual_seed(args.seed)
    if name == "llama":
        model = LlamaForCausalLM(LlamaConfig(**size, attn_implementation="sdpa"))
    else:
        model = PaTHForCausalLM(PaTHConfig(**size, attn_type=name))
    return model.eval()


def generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> None:
    """Greedy generate() of exactly `new` tokens (no EOS stop)."""
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                   min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(fn) -> dict[str, float]:
    """Milliseconds of one call on each clock."""
    t0 = {c: clock() for c, clock in CLOCKS.items()}
    fn()
    return {c: (clock() - t0[c]) * 1e3 for c, clock in CLOCKS.items()}


def bench(models: dict, ids: torch.Tensor, args: argparse.Namespace) -> dict:
    """Raw times (ms) of the short and long calls, per clock and model, interleaved."""
    names = list(models)
    times = {c: {n: {"short": [], "long": []} for n in names} for c in CLOCKS}
    with torch.no_grad():
        for n in names:  # warm-up
            generate(models[n], ids, 2)
        for r in range(args.repeats):
            for n in names[r % len(names):] + names[: r % len(names)]:
                for call, new in (("short", 1), ("long", args.new_tokens)):
                    t = timed(lambda n=n, new=new: generate(models[n], ids, new))
                    for c in CLOCKS:
                        times[c][n][call].append(t[c])
    return times


def per_token(t: dict, new_tokens: int) -> float:
    """(min long - min short) / (new_tokens - 1), ms."""
    return (min(t["long"]) - min(t["short"])) / (new_tokens - 1)


def print_table(clock: str, times: dict, new_tokens: int) -> dict:
    """One clock's table; returns its summary."""
    print(f"\n{clock} time, per token = (generate {new_tokens} - generate 1) / "
          f"{new_tokens - 1}, minima over the repeats")
    head = f"{'model':>9} | {'1 token ms':>10} | {f'{new_tokens} tokens ms':>14} | " \
           f"{'per token ms':>12} | ratio"
    print(head)
    print("-" * len(head))
    base = per_token(times["llama"], new_tokens) if "llama" in times else None
    summary = {}
    for n, t in times.items():
        pt = per_token(t, new_tokens)
        summary[n] = {"short_min": min(t["short"]), "long_min": min(t["long"]),
                      "per_token": pt, "ratio": None if base is None else pt / base}
        ratio = "baseline" if n == "llama" or base is None else f"{pt / base:.2f}x"
        print(f"{n:>9} | {min(t['short']):10.1f} | {min(t['long']):14.1f} | {pt:12.3f} | "
              f"{ratio}")
    return summary


def profile(model: torch.nn.Module, ids: torch.Tensor, steps: int = 64) -> None:
    """torch.profiler table of `steps` decode steps after the prompt."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(4):  # warm-up steps
            out = model(tok, past_key_values=cache, use_cache=True)
        t0 = time.perf_counter()
        with prof(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(steps):
                out = model(tok, past_key_values=cache, use_cache=True)
                tok = out.logits[:, -1:].argmax(-1)
        wall = (time.perf_counter() - t0) * 1e3 / steps
    print(f"{steps} decode steps, {wall:.3f} ms per step with the profiler on")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = system_info()
    print(f"torch {info['torch']} | threads {info['threads']} | CPU: {info['cpu']} | "
          f"load {info['loadavg_start']}")
    print(f"B=1 float32 | width {args.hidden}, {args.layers} layers, {args.heads} heads, "
          f"MLP {args.intermediate}, vocab {args.vocab} | prompt {args.prompt_len}")
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, args.vocab, (1, args.prompt_len), generator=gen)
    if args.profile is not None:
        profile(build_model(args.profile, args), ids)
        return 0
    models = {n: build_model(n, args) for n in args.models}
    t0 = time.perf_counter()
    times = bench(models, ids, args)
    print(f"\n{args.repeats} repeats in {time.perf_counter() - t0:.1f} s")
    summary = {c: print_table(c, times[c], args.new_tokens) for c in CLOCKS}
    if "llama" in models:
        print(f"\ngoal: path <= {GOAL:g}x llama")
    info["loadavg_end"] = load_average()
    print(f"load average {info['loadavg_start']} -> {info['loadavg_end']} (timings on a "
          "loaded machine are noisy; the interleaved ratios are what count)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{OUT_NAME}.json"
    cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path.write_text(json.dumps({"system": info, "config": cfg, "times_ms": times,
                                "summary": summary}, indent=2))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
