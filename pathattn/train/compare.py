"""Compare attention types on one task: the same `SyntheticConfig` trained once per attention
type and seed, then markdown tables of the final metrics and a PNG of the evaluation error
against the training step.

Seeds (`pathattn.train.seeds`): by default the config's own seed only; with several, every
(attention type, seed) is its own run and the reports give each seed's error and the
median, min and max over the seeds per attention type.

Layout of the output directory: one run directory per attention type and seed, as
`pathattn train` writes it: `DIR/<attn>/` for the config's seed (the one-seed layout),
`DIR/<attn>-seed<S>/` for each other seed S; plus `DIR/results.md`, `DIR/results.json` and
`DIR/error_vs_step.png`.

Run folders (`pathattn.train.run_dir`): DIR is locked for the whole comparison, each run
folder by its own run. The runs are what is protected: when one of the run folders holds
a run, nothing trains unless resume (finished runs of the same config are reused, the
others continued from their checkpoints) or overwrite (every run trained afresh) is given.
The tables, JSON and plot are derived from the runs and rewritten every time: the runs of
the requested seeds, then every other seed's finished run of the same config (same
`run_identity` but the seed) already in DIR, so that a comparison extended seed by seed
(`--seeds 0 1`, later `--seeds 2`) reports all its seeds instead of the last command's.
Runs of another config, or unfinished, are left out.

Errors shown: the headline metric each task declares (`pathattn.tasks.TaskMetrics`), as
an error, on each evaluation split: for flip-flop the error rates at the `r` positions of
each split ("val", "val_sparse", "val_dense"); for word problems and MQRAR 1 - sequence
accuracy on "val".

results.json (also what `compare` returns; JSON turns the int seeds into strings):
{attn: {"seeds": {seed: final metrics of that run},
        "errors": {name: {"per_seed": {seed: error}, "median": .., "min": .., "max": ..}}}}
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..tasks import get_task
from ..utils.io import atomic_path, atomic_write_json, atomic_write_text, remove_temp_files
from .run_dir import check_sub_runs, finished_metrics, lock_run_dir, read_jsonl
from .seeds import check_seeds, seed_dir, seed_label, seeds_on_disk, spread
from .synthetic import SyntheticConfig
from .trainer import train_or_reuse

__all__ = ["compare", "earlier_seeds", "error_series", "markdown_table", "seed_report",
           "spread_table", "results_markdown"]


def error_series(metrics: dict, task: str) -> dict[str, float]:
    """The errors of one flat metrics record of `task` (module docstring), name ->
    fraction."""
    return get_task(task).errors(metrics)


def markdown_table(final: dict[str, dict], task: str) -> str:
    """One row per run, {row label: final metrics}, errors in percent."""
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


def seed_report(final: dict[str, dict[int, dict]], task: str) -> dict[str, dict]:
    """{attn: {seed: final metrics}} -> the report of results.json (module docstring)."""
    report = {}
    for attn, runs in final.items():
        errors = {seed: error_series(metrics, task) for seed, metrics in runs.items()}
        names = dict.fromkeys(n for e in errors.values() for n in e)
        report[attn] = {"seeds": dict(runs), "errors": {
            name: spread({seed: e[name] for seed, e in errors.items() if name in e})
            for name in names}}
    return report


def spread_table(report: dict[str, dict], task: str) -> str:
    """Markdown: one row per attention type, each error as "median [min, max]" over its
    seeds, in percent."""
    names = list(dict.fromkeys(n for r in report.values() for n in r["errors"]))
    head = (f"| attention ({task}) | seeds | "
            + " | ".join(f"{n} error: median [min, max]" for n in names) + " |")
    rows = [head, "|" + " --- |" * (2 + len(names))]
    for attn, r in report.items():
        cells = []
        for name in names:
            s = r["errors"].get(name)
            cells.append("-" if s is None else f"{100 * s['median']:.4g} % "
                         f"[{100 * s['min']:.4g} %, {100 * s['max']:.4g} %]")
        seeds = " ".join(str(seed) for seed in r["seeds"])
        rows.append(f"| {attn} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def results_markdown(report: dict[str, dict], task: str) -> str:
    """results.md: the table of every run (`markdown_table`; rows "attn, seed S" when there
    are several seeds), preceded by the median / min / max table (`spread_table`) when an
    attention type has more than one seed."""
    runs = {seed_label(attn, seed, list(r["seeds"])): metrics
            for attn, r in report.items() for seed, metrics in r["seeds"].items()}
    table = markdown_table(runs, task)
    if all(len(r["seeds"]) == 1 for r in report.values()):
        return table
    return spread_table(report, task) + "\n" + table


def _plot(histories: dict[str, dict[int, list[dict]]], path: Path, task: str) -> None:
    """One line per (attention type, error): the median over the seeds at each evaluated
    step, in a band from the min to the max when there are several seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    counts = set()
    for attn, per_seed in histories.items():
        counts.add(len(per_seed))
        # name -> step -> the errors of the seeds evaluated at that step
        series: dict[str, dict[int, list[float]]] = {}
        for records in per_seed.values():
            for rec in records:
                for name, err in error_series(rec, task).items():
                    series.setdefault(name, {}).setdefault(rec["step"], []).append(err)
        for name, by_step in series.items():
            steps = sorted(by_step)
            median = [100 * statistics.median(by_step[s]) for s in steps]
            (line,) = ax.plot(steps, median, marker="o", label=f"{attn}: {name}")
            if len(per_seed) > 1:
                ax.fill_between(steps, [100 * min(by_step[s]) for s in steps],
                                [100 * max(by_step[s]) for s in steps],
                                color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("training step")
    ax.set_ylabel("error (%)")
    ax.set_yscale("symlog", linthresh=0.01)  # errors span 100 % down to 0
    seeds = max(counts, default=1)
    ax.set_title(f"{task}: evaluation error against step"
                 + (f"\nmedian over {seeds} seeds, band from min to max" if seeds > 1 else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def _run_config(base: SyntheticConfig, out: Path, attn: str, seed: int) -> SyntheticConfig:
    """The config of the run (attn, seed) of a comparison of `base` in out."""
    return replace(base, attn=attn, seed=seed,
                   out_dir=str(seed_dir(out, attn, seed, base.seed))).validate()


def earlier_seeds(base: SyntheticConfig, attn: str, out: Path, skip: Sequence[int]
                  ) -> dict[int, tuple[SyntheticConfig, dict]]:
    """{seed: (config, final metrics)} of the finished runs of `base` with attention `attn`
    and a seed not in `skip` already in out (in `seeds.seed_dir`'s folders), ascending."""
    runs = {}
    for seed in seeds_on_disk(out, attn, base.seed):
        if seed in skip:
            continue
        cfg = _run_config(base, out, attn, seed)
        metrics = finished_metrics(cfg)
        if metrics is not None:
            runs[seed] = (cfg, metrics)
    return runs


def compare(base: SyntheticConfig, attns: Sequence[str], out_dir: str | Path, *,
            seeds: Sequence[int] | None = None, resume: bool = False,
            overwrite: bool = False) -> dict[str, dict]:
    """Train `base` once per attention type in `attns` and seed in `seeds` (default
    [base.seed]; each run in its folder of out_dir, module docstring) and write the tables,
    the JSON report and the plot. Returns the report of results.json: per attention type
    the final metrics of each seed and each error's per-seed values, median, min and max,
    over `seeds` (in that order) and the other seeds' finished runs of the same config
    already in out_dir (`earlier_seeds`).
    resume / overwrite: what to do with runs already in out_dir (module docstring);
    RunDirError when there are some and neither is given."""
    if not attns or len(set(attns)) != len(attns):
        raise ValueError(f"attns must be distinct attention types, got {list(attns)}")
    seeds = check_seeds(seeds, base.seed)
    out = Path(out_dir)
    cfgs = {(a, s): _run_config(base, out, a, s)
            for s in seeds for a in attns}  # seed by seed: a stopped comparison has pairs
    with lock_run_dir(out):
        check_sub_runs(cfgs.values(), resume=resume, overwrite=overwrite)
        remove_temp_files(out, ("results.md", "results.json"))  # of an interrupted compare
        final: dict[str, dict[int, dict]] = {a: {} for a in attns}
        histories: dict[str, dict[int, list[dict]]] = {a: {} for a in attns}
        for (a, s), cfg in cfgs.items():
            final[a][s] = train_or_reuse(cfg, resume=resume, overwrite=overwrite)
            histories[a][s] = read_jsonl(Path(cfg.out_dir) / "eval.jsonl")
        for a in attns:
            for s, (cfg, metrics) in earlier_seeds(base, a, out, seeds).items():
                final[a][s] = metrics
                histories[a][s] = read_jsonl(Path(cfg.out_dir) / "eval.jsonl")
        report = seed_report(final, base.task)
        atomic_write_text(out / "results.md", results_markdown(report, base.task))
        atomic_write_json(out / "results.json", report, indent=2)
        _plot(histories, out / "error_vs_step.png", base.task)
    return report
