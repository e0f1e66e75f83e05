"""Fewest layers that solve a task (the figure of merit of the paper's word-problem
experiment): for each attention type (and seed), train the same `SyntheticConfig` with 1, 2,
... layers and stop at the first depth whose final score reaches the threshold.

Score (`solve_score`, declared by each task, `pathattn.tasks.TaskMetrics.solve`): sequence
accuracy on "val" for the word problems (a5, s5), token accuracy on "val" for mqrar,
1 - error on "val" for flip-flop. "Solved" = score >= threshold (0.9, following Merrill et
al. 2024).

Seeds (`pathattn.train.seeds`): by default the config's own seed only; with several, each
(attention type, seed) is swept on its own, and the reports give the fewest layers of each
seed and their median, min and max per attention type (a seed that solves at no depth
tried counts as more layers than any, and a statistic that falls on it is "not solved",
null in the JSON).

Output directory: one run per (attention type, depth, seed) in `DIR/<attn>-L<layers>/` for
the config's seed and `DIR/<attn>-L<layers>-seed<S>/` for each other seed S (a finished run
there with the same config is reused, so an interrupted sweep continues where it stopped),
plus `DIR/layers.md` (tables) and `DIR/layers.json`:
{attn: {"seeds": {seed: {"solved_at": fewest solving depth or null,
                         "runs": {layers: score}}},
        "solved_at": {"per_seed": {seed: depth or null}, "median": .., "min": .., "max": ..}}}
(JSON turns the int seeds and depths into strings).

The reports cover the seeds asked for, then every other seed whose sweep of the same
config (same `run_identity` but the seed and depth) over the same depths is complete in
DIR: finished runs up to its first solving depth, or at every depth. So a sweep extended
seed by seed reports all its seeds; an incomplete sweep of another seed is left out.

Run folders (`pathattn.train.run_dir`): DIR is locked for the whole sweep, each run folder
by its own run. Any other run in a run folder the sweep needs (unfinished, or of another
config) stops the sweep before anything trains, unless resume (unfinished runs are
continued from their checkpoints) or overwrite (every run trained afresh) is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..tasks import get_task
from ..utils.io import atomic_write_json, atomic_write_text, remove_temp_files
from .run_dir import check_sub_runs, finished_metrics, lock_run_dir
from .seeds import check_seeds, seed_dir, seed_label, seeds_on_disk, spread
from .synthetic import SyntheticConfig
from .trainer import train_or_reuse

__all__ = ["fewest_layers", "solve_score", "layers_table", "layers_spread_table",
           "layers_markdown"]


def solve_score(metrics: dict, task: str) -> float:
    """The score that decides "solved" (module docstring) from a flat metrics record."""
    return get_task(task).solve_score(metrics)


def fewest_layers(base: SyntheticConfig, attns: Sequence[str], layers: Sequence[int],
                  out_dir: str | Path, threshold: float = 0.9, *,
                  seeds: Sequence[int] | None = None, resume: bool = False,
                  overwrite: bool = False) -> dict[str, dict]:
    """Sweep depths `layers` (increasing) per attention type and seed in `seeds` (default
    [base.seed]); returns the report of layers.json (module docstring): per attention type
    each seed's fewest solving depth (None if none) and scores, and the median, min and max
    of the fewest depth over the seeds. Writes the tables.
    resume / overwrite: what to do with other runs in out_dir (module docstring)."""
    if not attns or len(set(attns)) != len(attns):
        raise ValueError(f"attns must be distinct attention types, got {list(attns)}")
    depths = sorted(set(int(n) for n in layers))
    if not depths or depths[0] < 1:
        raise ValueError(f"layers must be positive ints, got {list(layers)}")
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
    seeds = check_seeds(seeds, base.seed)
    out = Path(out_dir)
    cfgs = {(attn, s, n): _run_config(base, out, attn, n, s)
            for s in seeds for attn in attns for n in depths}
    with lock_run_dir(out):
        check_sub_runs(cfgs.values(), resume=resume, overwrite=overwrite,
                       reuse_finished=True)
        remove_temp_files(out, ("layers.json", "layers.md"))  # of an interrupted sweep
        per_seed: dict[str, dict[int, dict]] = {attn: {} for attn in attns}
        for s in seeds:  # seed by seed: a stopped sweep has every attention type's seeds
            for attn in attns:
                per_seed[attn][s] = _sweep(
                    lambda n, a=attn, s=s: train_or_reuse(
                        cfgs[a, s, n], resume=resume, overwrite=overwrite,
                        reuse_finished=True), depths, threshold, base.task)
        for attn in attns:
            per_seed[attn].update(_earlier_sweeps(base, attn, out, depths, threshold, seeds))
        results = {attn: {"seeds": runs, "solved_at": spread(
            {s: r["solved_at"] for s, r in runs.items()})} for attn, runs in per_seed.items()}
        atomic_write_json(out / "layers.json", results, indent=2)
        atomic_write_text(out / "layers.md", layers_markdown(results, base, threshold))
    return results


def _run_config(base: SyntheticConfig, out: Path, attn: str, layers: int, seed: int
                ) -> SyntheticConfig:
    """The config of the run (attn, layers, seed) of a sweep of `base` in out."""
    return replace(base, attn=attn, layers=layers, seed=seed, out_dir=str(
        seed_dir(out, f"{attn}-L{layers}", seed, base.seed))).validate()


def _sweep(metrics_at, depths: list[int], threshold: float, task: str) -> dict | None:
    """{"solved_at", "runs"} of one attention type and seed: depths in order, up to the
    first that solves; metrics_at(depth) gives a run's final metrics, or None when there
    are none (the sweep is then incomplete: None)."""
    runs: dict[int, float] = {}
    for n in depths:
        metrics = metrics_at(n)
        if metrics is None:
            return None
        runs[n] = solve_score(metrics, task)
        if runs[n] >= threshold:
            return {"solved_at": n, "runs": runs}
    return {"solved_at": None, "runs": runs}


def _earlier_sweeps(base: SyntheticConfig, attn: str, out: Path, depths: list[int],
                    threshold: float, skip: Sequence[int]) -> dict[int, dict]:
    """{seed: {"solved_at", "runs"}} of the complete sweeps on disk (module docstring) of
    `attn` with a seed not in `skip`, ascending; nothing trains."""
    found = sorted({s for n in depths for s in seeds_on_disk(out, f"{attn}-L{n}", base.seed)
                    if s not in skip})
    sweeps = {}
    for seed in found:
        sweep = _sweep(lambda n, s=seed: finished_metrics(_run_config(base, out, attn, n, s)),
                       depths, threshold, base.task)
        if sweep is not None:
            sweeps[seed] = sweep
    return sweeps


def _fewest(solved_at: float | None, tried: int) -> str:
    """A fewest depth for a table (a median may be a half); "> tried" when not solved."""
    return format(solved_at, "g") if solved_at is not None else f"> {tried}"


def layers_table(results: dict[str, dict], base: SyntheticConfig, threshold: float) -> str:
    """Markdown: one row per sweep, {row label: {"solved_at", "runs": {layers: score}}}, the
    score at each depth tried, the fewest solving depth."""
    depths = sorted({n for r in results.values() for n in r["runs"]})
    what = get_task(base.task).metrics.solve_label
    head = (f"| attention ({base.task}) | " + " | ".join(f"{n} layer{'s' * (n > 1)}"
                                                         for n in depths)
            + f" | fewest layers with {what} >= {100 * threshold:g} % |")
    rows = [head, "|" + " --- |" * (len(depths) + 2)]
    for attn, r in results.items():
        cells = [f"{100 * r['runs'][n]:.1f} %" if n in r["runs"] else "-" for n in depths]
        rows.append(f"| {attn} | " + " | ".join(cells)
                    + f" | {_fewest(r['solved_at'], max(r['runs']))} |")
    return "\n".join(rows) + "\n"


def layers_spread_table(results: dict[str, dict], base: SyntheticConfig,
                        threshold: float) -> str:
    """Markdown: one row per attention type, the fewest solving depth of each seed and
    their median, min and max ("> N": not solved with the N layers tried)."""
    seeds = list(dict.fromkeys(s for r in results.values() for s in r["seeds"]))
    what = get_task(base.task).metrics.solve_label
    head = (f"| attention ({base.task}): fewest layers with {what} >= {100 * threshold:g} % | "
            + " | ".join(f"seed {s}" for s in seeds) + " | median | min | max |")
    rows = [head, "|" + " --- |" * (len(seeds) + 4)]
    for attn, r in results.items():
        tried = max(n for run in r["seeds"].values() for n in run["runs"])
        cells = [_fewest(r["seeds"][s]["solved_at"], tried) if s in r["seeds"] else "-"
                 for s in seeds]
        cells += [_fewest(r["solved_at"][k], tried) for k in ("median", "min", "max")]
        rows.append(f"| {attn} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def layers_markdown(results: dict[str, dict], base: SyntheticConfig, threshold: float) -> str:
    """layers.md: the scores of every sweep (`layers_table`; rows "attn, seed S" when there
    are several seeds), preceded by the per-seed fewest depths and their median / min /
    max (`layers_spread_table`) when an attention type has more than one seed."""
    sweeps = {seed_label(attn, s, list(r["seeds"])): run
              for attn, r in results.items() for s, run in r["seeds"].items()}
    table = layers_table(sweeps, base, threshold)
    if all(len(r["seeds"]) == 1 for r in results.values()):
        return table
    return layers_spread_table(results, base, threshold) + "\n" + table
