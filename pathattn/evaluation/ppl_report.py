"""The report of `pathattn eval ppl` (`pathattn.evaluation.ppl_models.evaluate_models`):
its markdown table, ppl.json and the loss-by-position figure, each file replaced
atomically."""

from __future__ import annotations

import os
from pathlib import Path

from ..utils.io import atomic_path, atomic_write_json
from .ppl import PplError

__all__ = ["markdown_table", "plot_loss_by_position", "write_report"]


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
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def write_report(report: dict, out: str | os.PathLike) -> tuple[Path, Path]:
    """Write out/ppl.json and out/loss_by_position.png (each atomically,
    `pathattn.utils.io`; `out` is created when missing, other files are left alone).
    Returns the two paths; PplError("out") when `out` is a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PplError("out", f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "ppl.json", out / "loss_by_position.png"
    atomic_write_json(json_path, report, indent=2)
    plot_loss_by_position(report, png_path)
    return json_path, png_path
