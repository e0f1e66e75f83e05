"""Several seeds per configuration, for the commands that train many runs (`compare`,
`fewest_layers`): which seeds, where each seed's run lives, and how a result spreads over
the seeds.

A run's seed (`SyntheticConfig.seed`) draws both the model's initialisation and its data, the
evaluation splits included. One seed per configuration says little where training is not
stable (PaTH's out-of-distribution flip-flop errors differ from seed to seed at a CPU
budget), so the commands report every seed's value and their median, min and max.

Folders: the run of the config's own seed (`base.seed`, `--seed`, default 0) stays where a
one-seed command has always put it (e.g. compare's DIR/<attn>/); every other seed S goes
to a sibling folder with "-seed<S>" appended (DIR/<attn>-seed<S>/). So a one-seed run
already in DIR is reused when the same command is given more seeds, and an interrupted
multi-seed command continues where it stopped.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["check_seeds", "seed_dir", "seeds_on_disk", "spread", "seed_label"]


def check_seeds(seeds: Sequence[int] | None, default: int) -> list[int]:
    """The seeds to run: [default] when `seeds` is None, else `seeds` as a list, which must
    be non-empty, of distinct non-negative ints (ValueError naming the bad values)."""
    if seeds is None:
        return [default]
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise ValueError(f"seeds must be a list of non-negative ints, got {seeds!r}")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed, got an empty list")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, numbers.Integral)
           or s < 0]
    if bad:
        raise ValueError(f"seeds must be non-negative ints, got {bad} in {seeds}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"seeds must be distinct, got {repeated} more than once in {seeds}")
    return [int(s) for s in seeds]


def seed_dir(out: str | Path, name: str, seed: int, base_seed: int) -> Path:
    """The folder of the run `name` (e.g. "path", "path-L2") with `seed`: out/name for the
    config's own seed `base_seed`, out/name-seed<seed> for any other (module docstring)."""
    return Path(out) / (name if seed == base_seed else f"{name}-seed{seed}")


def seeds_on_disk(out: str | Path, name: str, base_seed: int) -> list[int]:
    """The seeds with a folder of the run `name` in out (`seed_dir`'s folders: out/name for
    `base_seed`, out/name-seed<S>), ascending; whether a run there is finished, and of which
    config, is for the caller to check."""
    out = Path(out)
    found = {base_seed} if (out / name).is_dir() else set()
    prefix = f"{name}-seed"
    for folder in out.glob(prefix + "*"):
        tail = folder.name[len(prefix):]
        if folder.is_dir() and tail.isdigit() and str(int(tail)) == tail:
            found.add(int(tail))
    return sorted(found)


def seed_label(name: str, seed: int, seeds: Sequence[int]) -> str:
    """The row label of a run in a table: `name` alone when it is the only seed, else
    "name, seed S"."""
    return name if len(seeds) == 1 else f"{name}, seed {seed}"


def spread(per_seed: Mapping[int, float | None]) -> dict:
    """{"per_seed": {seed: value}, "median": .., "min": .., "max": ..} of the values of
    several seeds. The median of an even count is the mean of the middle two. None (a
    layer sweep that did not solve) ranks above every number; a statistic that falls on
    it (or between it and a number) is None."""
    if not per_seed:
        raise ValueError("per_seed must hold the value of at least one seed, got none")
    ranked = [math.inf if v is None else v for v in per_seed.values()]

    def finite(x: float) -> float | None:
        return None if math.isinf(x) else x

    return {"per_seed": dict(per_seed), "median": finite(statistics.median(ranked)),
            "min": finite(min(ranked)), "max": finite(max(ranked))}
