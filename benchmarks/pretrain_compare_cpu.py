"""The CPU-scale pretraining comparison: PaTH, PaTH-FoX, FoX and RoPE language models of
one preset trained with the same token budget on the same prepared text, side by side.

Builds (once, reused when present) a byte-level BPE tokenizer and a prepared folder of the
default corpus (the running Python's standard library source), then runs `pathattn
pretrain` for each attention type and writes OUT/results.md (validation perplexity, loss,
tokens per second, wall time) and OUT/results.json, and OUT/val_loss.png (validation loss
against tokens, one line per type).

    python benchmarks/pretrain_compare_cpu.py --out runs/pretrain_cpu            # defaults
    python benchmarks/pretrain_compare_cpu.py --tokens 2000000 --preset cpu-small \\
        --seq-len 512 --batch-size 8 --vocab-size 8192 --out runs/pretrain_cpu
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _env import system_info  # benchmarks/ is on sys.path

from pathattn.cli import main as cli
from pathattn.train import read_jsonl

ATTNS = ("path", "path_fox", "fox", "rope")


def _run(args: list[str]) -> None:
    code = cli(args)
    if code:
        raise SystemExit(f"pathattn {args[0]} failed with exit code {code}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/pretrain_cpu"))
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--attns", nargs="+", default=list(ATTNS))
    p.add_argument("--tokens", type=int, default=1_000_000, help="training tokens per model")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tok, data = out / "tokenizer", out / "data"
    if not (tok / "tokenizer.json").exists():
        _run(["tokenizer", "--vocab-size", str(args.vocab_size), "--out", str(tok)])
    if not (data / "meta.json").exists():
        _run(["prepare", "--tokenizer", str(tok), "--out", str(data), "--workers", "2"])
    rows = {}
    for attn in args.attns:
        run = out / attn
        start = time.perf_counter()
        done = (run / "metrics.json").exists()
        if not done:
            _run(["pretrain", "--data", str(data), "--preset", args.preset, "--attn", attn,
                  "--tokens", str(args.tokens), "--seq-len", str(args.seq_len),
                  "--batch-size", str(args.batch_size), "--eval-every", str(args.eval_every),
                  "--seed", str(args.seed), "--no-progress", "--out", str(run),
                  *(["--resume"] if (run / "checkpoints").exists() else [])])
        metrics = json.loads((run / "metrics.json").read_text())
        log = read_jsonl(run / "log.jsonl")
        rows[attn] = {"val_ppl": metrics["val_ppl"], "val_loss": metrics["val_loss"],
                      "tokens": log[-1]["tokens"],
                      "tokens_per_s": log[-1]["tokens"] / log[-1]["elapsed_s"],
                      "wall_s": None if done else time.perf_counter() - start}
    info = system_info()
    (out / "results.json").write_text(json.dumps({"system": info, "args": vars(args) | {
        "out": str(out)}, "results": rows}, indent=2) + "\n")
    lines = ["| attention | val ppl | val loss | tokens | tokens / s |",
             "| --- | --- | --- | --- | --- |"]
    for attn, r in rows.items():
        lines.append(f"| {attn} | {r['val_ppl']:.2f} | {r['val_loss']:.4f} | {r['tokens']:,} | "
                     f"{r['tokens_per_s']:,.0f} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(out, args.attns)


def _plot(out: Path, attns) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for attn in attns:
        evals = read_jsonl(out / attn / "eval.jsonl")
        log = {r["step"]: r["tokens"] for r in read_jsonl(out / attn / "log.jsonl")}
        cfg = json.loads((out / attn / "config.json").read_text())
        per_step = cfg["seq_len"] * cfg["batch_size"] * cfg["accum"]
        # periodic evaluations (the first eval_batches of the val split) as a line; the
        # final one (the whole split) as a marker: they are not the same tokens
        periodic = [r for r in evals if r["step"] < cfg["steps"]]
        line, = ax.plot([log.get(r["step"], r["step"] * per_step) for r in periodic],
                        [r["val_loss"] for r in periodic], label=attn)
        final = [r for r in evals if r["step"] == cfg["steps"]]
        if final:
            ax.plot([cfg["steps"] * per_step], [final[-1]["val_loss"]], "o",
                    color=line.get_color())
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss")
    ax.set_title("line: first eval batches of val; dot: the whole val split", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "val_loss.png", dpi=120)


if __name__ == "__main__":
    main()
