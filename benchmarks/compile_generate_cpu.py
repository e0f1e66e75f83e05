"""Hugging Face `generate()` with a compiled forward: graphs, graph breaks, tokens and time
per token against eager, on the CPU.

One `PaTHForCausalLM` (random weights, float32, B = 1) generates --new-tokens greedy
tokens after a random --prompt-len prompt, eager first (twice: a warm-up, then timed);
then its `forward` is replaced by `torch.compile(forward, dynamic=True, fullgraph=True)`
and the same call runs twice (the first compiles). Printed: whether the compiled tokens
equal the eager ones, how many graphs were compiled and how many graph breaks met (both
over the two compiled calls: a decode loop that recompiled per token would show one graph
per token), and the time per new token of eager and of the second compiled call (whole
call / new tokens, the prompt's prefill included, so keep --new-tokens well above 1).

    python benchmarks/compile_generate_cpu.py                       # path, prompt 64, 150
    python benchmarks/compile_generate_cpu.py --attn path_fox --new-tokens 300
"""

from __future__ import annotations

import argparse
import time

import torch
from _env import system_info  # benchmarks/ is on sys.path
from torch._dynamo.utils import counters

from pathattn.hf import PaTHConfig, PaTHForCausalLM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="path", help="attention type (path)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=150)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    config = PaTHConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                        intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, attn_type=args.attn,
                        max_position_embeddings=args.prompt_len + args.new_tokens + 16)
    model = PaTHForCausalLM(config).eval()
    prompt = torch.randint(0, args.vocab, (1, args.prompt_len))
    n = args.new_tokens

    def generate() -> tuple[torch.Tensor, float]:
        t = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out, (time.perf_counter() - t) / n * 1e3

    with torch.no_grad():
        generate()  # warm-up
        want, eager_ms = generate()
        model.forward = torch.compile(model.forward, dynamic=True, fullgraph=True)
        counters.clear()
        first, first_ms = generate()
        got, compiled_ms = generate()
    info = system_info()
    print(f"# {args.attn}, width {args.hidden}, {args.layers} layers, {args.heads} heads, "
          f"prompt {args.prompt_len}, {n} new tokens; {info['threads']} threads, "
          f"{info['cpu']}, torch {info['torch']}")
    print(f"compiled tokens equal eager: {torch.equal(first, want) and torch.equal(got, want)}")
    print(f"graphs compiled: {counters['stats']['unique_graphs']}, graph breaks: "
          f"{sum(counters['graph_break'].values())}")
    print(f"ms per new token: eager {eager_ms:.2f}, compiled {compiled_ms:.2f} "
          f"({compiled_ms / eager_ms:.2f}x; first compiled call {first_ms:.2f}, compiling)")


if __name__ == "__main__":
    main()
