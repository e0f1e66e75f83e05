"""`pathattn eval ppl`: perplexity by context length and loss by token position of one or
more causal language models on the held-out documents of a prepared folder
(`pathattn.evaluation.ppl`).

    pathattn eval ppl --model DIR [DIR ...] --data DIR [--lengths L ...] [--out DIR]
                      [--split val] [--max-docs N] [--batch-size B]
                      [--dtype float32|bfloat16] [--device cpu] [--chunk-size N]
                      [--per-document] [--no-progress]

--model: folders loadable by `AutoModelForCausalLM.from_pretrained` (a `pathattn
pretrain` RUN/hf, or any Hugging Face causal LM saved with `save_pretrained`, e.g. a RoPE
Llama) with the data's tokenizer saved next to the weights. Every length L scores windows
of L tokens that tile the held-out token stream (documents joined by their BOS / EOS), so
each length needs at least L + 1 held-out tokens. The LM head runs on --chunk-size tokens
at a time, so the [L, V] logits never exist at once (with a pathattn model, memory is
linear in L). With --per-document every held-out document is instead scored alone,
from its first token after BOS, in windows of at most L tokens (the token positions and
windows of lm-evaluation-harness's loglikelihood_rolling: the perplexity at L equals
`pathattn eval lm-eval --data DIR --max-length L`'s token_perplexity on the same documents).
Prints a markdown table (rows: models,
columns: lengths); with --out also writes DIR/ppl.json (the report of
`evaluate_models`) and DIR/loss_by_position.png (loss against position, log x, one line
per model, training lengths as dashed vertical lines), each replaced atomically.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .ppl import DEFAULT_CHUNK_SIZE, DEFAULT_LENGTHS, DTYPES, PplError

__all__ = ["HELP", "add_arguments", "run", "markdown_table", "plot_loss_by_position",
           "write_report"]

HELP = "perplexity by context length and loss by token position of causal LMs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn eval ppl` (module docstring)."""
    lengths = " ".join(map(str, DEFAULT_LENGTHS))
    p.add_argument("--model", nargs="+", required=True, metavar="DIR",
                   help="model folders (save_pretrained + tokenizer), e.g. RUN/hf")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="prepared folder (pathattn prepare) whose held-out split is scored")
    p.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS),
                   metavar="L", help=f"context lengths in tokens (default {lengths})")
    p.add_argument("--out", metavar="DIR",
                   help="write ppl.json and loss_by_position.png there (default: print only)")
    p.add_argument("--split", default="val", help="split of --data to score (default val)")
    p.add_argument("--max-docs", type=int, metavar="N",
                   help="score the split's first N documents only (default: all)")
    p.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="windows per forward pass (default 1)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="float32, or bfloat16 autocast (default float32)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, metavar="N",
                   help=f"tokens per LM-head chunk, 0 = all logits at once (default "
                   f"{DEFAULT_CHUNK_SIZE})")
    p.add_argument("--per-document", action="store_true",
                   help="score each held-out document alone, in windows of at most L "
                   "tokens (lm-eval's rolling log-likelihood), instead of windows of L "
                   "tokens tiling the concatenated documents")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run `pathattn eval ppl`; a bad argument goes to `parser.error` naming the option
    (or is raised as PplError when parser is None). Returns the exit code (0)."""
    from .ppl_models import evaluate_models

    try:
        if args.chunk_size is not None and args.chunk_size < 0:
            raise PplError("chunk_size", f"must be a non-negative int, got {args.chunk_size}")
        if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
            raise PplError("out", f"{args.out} exists and is not a folder")
        report = evaluate_models(
            args.model, args.data, args.lengths, split=args.split, max_docs=args.max_docs,
            batch_size=args.batch_size, chunk_size=args.chunk_size or None, dtype=args.dtype,
            device=args.device, progress=not args.no_progress,
            per_document=args.per_document)
        print(markdown_table(report))
        if args.out is not None:
            for path in write_report(report, args.out):
                print(f"wrote {path}")
    except PplError as e:
        if parser is None:
            raise
        parser.error(f"--{e.argument.replace('_', '-')}: {e.message}")
    return 0


def markdown_table(report: dict) -> str:
    """Perplexity table: one row per model, one column per length (plus the train
    length)."""
    lengths = report["lengths"]
    at = "max " if report.get("mode") == "per-document" else ""
    head = ["model", "train length", *(f"ppl @ {at}{L}" for L in lengths)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in report["models"]:
        cells = [m["name"], "?" if m["train_length"] is None else str(m["train_length"]),
                 *(f"{m['ppl'][str(L)]:.3f}" for L in lengths)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _atomic_write(path: Path, write) -> None:
    """write(temp_path) then os.replace into `path` (same folder, so the move is atomic)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_loss_by_position(report: dict, path: str | os.PathLike) -> None:
    """loss_by_position.png: loss against position (log x), one line per model, each
    model's training length a dashed vertical line of its colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in report["models"]:
        bins = m["loss_by_position"]["bins"]
        (line,) = ax.plot([b["center"] for b in bins], [b["loss"] for b in bins],
                          label=m["name"])
        if m["train_length"] is not None:
            ax.axvline(m["train_length"], color=line.get_color(), linestyle="--", alpha=0.7,
                       label=f"{m['name']}: train length {m['train_length']}")
    ax.set_xscale("log")
    if report.get("mode") == "per-document":
        ax.set_xlabel("position in the document (tokens)")
        title = f"each document alone, windows of at most {report['lengths'][-1]} tokens"
    else:
        ax.set_xlabel("position (tokens of context)")
        title = f"windows of {report['lengths'][-1]} tokens"
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title(f"loss by position, {report['split']} split, {title}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def write_report(report: dict, out: str | os.PathLike) -> tuple[Path, Path]:
    """Write out/ppl.json and out/loss_by_position.png (each atomically: a temp file in
    `out`, then os.replace; `out` is created when missing, other files are left alone).
    Returns the two paths."""
    import json

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PplError("out", f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "ppl.json", out / "loss_by_position.png"
    text = json.dumps(report, indent=2) + "\n"
    _atomic_write(json_path, lambda tmp: tmp.write_text(text))
    plot_loss_by_position(report, png_path)
    return json_path, png_path
