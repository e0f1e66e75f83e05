"""Fewest layers that solve a task (the figure of merit of the paper's word-problem
experiment): for each attention type, train the same `TrainConfig` with 1, 2,
... layers and stop at the first depth whose final score reaches the threshold.

Score (`solve_score`, declared by each task, `pathattn.tasks.TaskMetrics.solve`): sequence
accuracy on "val" for the word problems (a5, s5), token accuracy on "val" for mqrar,
1 - error on "val" for flip-flop. "Solved" = score >= threshold (0.9, following Merrill et
al. 2024).

Output directory: one run per (attention type, depth) in `DIR/<attn>-L<layers>/` (a finished
run there with the same config is reused, so an interrupted sweep continues where it
stopped), plus `DIR/layers.md` (table) and `DIR/layers.json`.

Run folders (`pathattn.train.run_dir`): DIR is locked for the whole sweep, each run folder
by its own run. Any other run in a DIR/<attn>-L<layers>/ the sweep needs (unfinished, or of
another config) stops the sweep before anything trains, unless resume (unfinished runs are
continued from their checkpoints) or overwrite (every run trained afresh) is given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..tasks import get_task
from .checkpoint import atomic_write_bytes, remove_temp_files
from .config import TrainConfig
from .run_dir import check_sub_runs, lock_run_dir
from .trainer import train_or_reuse

__all__ = ["fewest_layers", "solve_score", "layers_table"]


def solve_score(metrics: dict, task: str) -> float:
    """The score that decides "solved" (module docstring) from a flat metrics record."""
    return get_task(task).solve_score(metrics)


def fewest_layers(base: TrainConfig, attns: Sequence[str], layers: Sequence[int],
                  out_dir: str | Path, threshold: float = 0.9, *, resume: bool = False,
                  overwrite: bool = False) -> dict[str, dict]:
    """Sweep depths `layers` (increasing) per attention type; returns {attn: {"solved_at":
    fewest solving depth or None, "runs": {layers: score}}} and writes the table.
    resume / overwrite: what to do with other runs in out_dir (module docstring)."""
    if not attns or len(set(attns)) != len(attns):
        raise ValueError(f"attns must be distinct attention types, got {list(attns)}")
    depths = sorted(set(int(n) for n in layers))
    if not depths or depths[0] < 1:
        raise ValueError(f"layers must be positive ints, got {list(layers)}")
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
    out = Path(out_dir)
    cfgs = {(attn, n): replace(base, attn=attn, layers=n,
                               out_dir=str(out / f"{attn}-L{n}")).validate()
            for attn in attns for n in depths}
    with lock_run_dir(out):
        check_sub_runs(cfgs.values(), resume=resume, overwrite=overwrite,
                       reuse_finished=True)
        remove_temp_files(out, ("layers.json", "layers.md"))  # of an interrupted sweep
        results: dict[str, dict] = {}
        for attn in attns:
            runs: dict[int, float] = {}
            solved = None
            for n in depths:
                metrics = train_or_reuse(cfgs[attn, n], resume=resume, overwrite=overwrite,
                                         reuse_finished=True)
                runs[n] = solve_score(metrics, base.task)
                if runs[n] >= threshold:
                    solved = n
                    break
            results[attn] = {"solved_at": solved, "runs": runs}
        atomic_write_bytes(out / "layers.json",
                           (json.dumps(results, indent=2) + "\n").encode())
        atomic_write_bytes(out / "layers.md",
                           layers_table(results, base, threshold).encode())
    return results


def layers_table(results: dict[str, dict], base: TrainConfig, threshold: float) -> str:
    """Markdown: one row per attention type, the score at each depth tried, the fewest
    solving depth."""
    depths = sorted({n for r in results.values() for n in r["runs"]})
    what = get_task(base.task).metrics.solve_label
    head = (f"| attention ({base.task}) | " + " | ".join(f"{n} layer{'s' * (n > 1)}"
                                                         for n in depths)
            + f" | fewest layers with {what} >= {100 * threshold:g} % |")
    rows = [head, "|" + " --- |" * (len(depths) + 2)]
    for attn, r in results.items():
        cells = [f"{100 * r['runs'][n]:.1f} %" if n in r["runs"] else "-" for n in depths]
        best = r["solved_at"] if r["solved_at"] is not None else f"> {max(r['runs'])}"
        rows.append(f"| {attn} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(rows) + "\n"
