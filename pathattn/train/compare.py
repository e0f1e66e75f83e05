"""Compare attention types on one task: the same `TrainConfig` trained once per attention
type, then a markdown table of the final metrics and a PNG of the evaluation error against
the training step.

Layout of the output directory: one run directory per attention type (`DIR/<attn>/`, as
`pathattn train` writes it), plus `DIR/results.md`, `DIR/results.json` and
`DIR/error_vs_step.png`.

Run folders (`pathattn.train.run_dir`): DIR is locked for the whole comparison, each
DIR/<attn>/ by its own run. The runs are what is protected: when one of DIR/<attn>/ holds
a run, nothing trains unless resume (finished runs of the same config are reused, the
others continued from their checkpoints) or overwrite (every run trained afresh) is given.
The table, JSON and plot are derived from the runs and rewritten every time.

Errors shown: the headline metric each task declares (`pathattn.tasks.TaskMetrics`), as
an error, on each evaluation split: for flip-flop the error rates at the `r` positions of
each split ("val", "val_sparse", "val_dense"); for word problems and MQRAR 1 - sequence
accuracy on "val".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..tasks import get_task
from .checkpoint import atomic_write_bytes, remove_temp_files
from .config import TrainConfig
from .run_dir import check_sub_runs, lock_run_dir, read_jsonl
from .trainer import train_or_reuse

__all__ = ["compare", "error_series", "markdown_table"]


def error_series(metrics: dict, task: str) -> dict[str, float]:
    """The errors of one flat metrics record of `task` (module docstring), name ->
    fraction."""
    return get_task(task).errors(metrics)


def markdown_table(final: dict[str, dict], task: str) -> str:
    """One row per attention type, errors in percent."""
    names = list(dict.fromkeys(n for m in final.values() for n in error_series(m, task)))
    head = f"| attention ({task}) | step | " + " | ".join(f"{n} error" for n in names) + " |"
    rows = [head, "|" + " --- |" * (2 + len(names))]
    for attn, metrics in final.items():
        errors = error_series(metrics, task)
        cells = [_cell(errors[n], metrics.get(f"{n}_scored")) if n in errors else "-"
                 for n in names]
        rows.append(f"| {attn} | {metrics.get('step', '-')} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _cell(error: float, scored) -> str:
    """An error in percent, with (wrong / scored) when the count of scored positions is
    known (flip-flop reads)."""
    if isinstance(scored, int) and scored > 0:
        return f"{100 * error:.4g} % ({round(error * scored)} / {scored})"
    return f"{100 * error:.4g} %"


def _history(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "eval.jsonl")


def _plot(histories: dict[str, list[dict]], path: Path, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for attn, records in histories.items():
        series: dict[str, list[tuple[int, float]]] = {}
        for rec in records:
            for name, err in error_series(rec, task).items():
                series.setdefault(name, []).append((rec["step"], err))
        for name, points in series.items():
            steps, errs = zip(*points, strict=True)
            ax.plot(steps, [100 * e for e in errs], marker="o", label=f"{attn}: {name}")
    ax.set_xlabel("training step")
    ax.set_ylabel("error (%)")
    ax.set_yscale("symlog", linthresh=0.01)  # errors span 100 % down to 0
    ax.set_title(f"{task}: evaluation error against step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(base: TrainConfig, attns: Sequence[str], out_dir: str | Path, *,
            resume: bool = False, overwrite: bool = False) -> dict[str, dict]:
    """Train `base` once per attention type in `attns` (each in out_dir/<attn>) and write the
    table, the JSON of final metrics and the plot. Returns {attn: final metrics}.
    resume / overwrite: what to do with runs already in out_dir (module docstring);
    RunDirError when there are some and neither is given."""
    if not attns or len(set(attns)) != len(attns):
        raise ValueError(f"attns must be distinct attention types, got {list(attns)}")
    out = Path(out_dir)
    cfgs = {a: replace(base, attn=a, out_dir=str(out / a)).validate() for a in attns}
    with lock_run_dir(out):
        check_sub_runs(cfgs.values(), resume=resume, overwrite=overwrite)
        remove_temp_files(out, ("results.md", "results.json"))  # of an interrupted compare
        final = {a: train_or_reuse(cfg, resume=resume, overwrite=overwrite)
                 for a, cfg in cfgs.items()}
        histories = {a: _history(out / a) for a in attns}
        atomic_write_bytes(out / "results.md", markdown_table(final, base.task).encode())
        atomic_write_bytes(out / "results.json",
                           (json.dumps(final, indent=2) + "\n").encode())
        _plot(histories, out / "error_vs_step.png", base.task)
    return final
