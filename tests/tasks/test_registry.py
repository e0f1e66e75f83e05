"""The task registry: every registered task's declared options, splits and metrics agree
with what its config, streams and evaluation produce; a task registered here only (a toy
"copy" task) goes through `SyntheticConfig`, `pathattn data`, `pathattn train` and the
evaluation with nothing else changed, and is gone once unregistered."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

import pathattn.tasks as tasks
from pathattn.cli import main
from pathattn.models import PaTHLM
from pathattn.tasks import (
    IGNORE_INDEX,
    METRICS,
    TaskMetrics,
    TaskOption,
    TaskSpec,
    Vocab,
    flatten_metrics,
    get_task,
    make_generator,
    options_by_name,
    register_task,
    registered_task,
    task_names,
    unregister_task,
)
from pathattn.train import SyntheticConfig, TaskStream, build_task, evaluate
from pathattn.train.compare import error_series
from pathattn.train.sweep import layers_table, solve_score
from pathattn.train.synthetic import build_model_config, model_vocab_size, option_fields

# small option values per built-in task, so that every test runs in a blink
SMALL = {"flipflop": {"num_pairs": 4}, "a5": {"length": 4}, "s5": {"length": 4},
         "mqrar": {"length": 16, "keys": 2}}  # 8 pairs of 2 keys: some 2-back targets


def small_config(task: str, **over) -> SyntheticConfig:
    kw = dict(task=task, dim=16, heads=2, batch_size=3, eval_batches=2, progress=False,
              **option_fields(SMALL.get(task, {})))
    return SyntheticConfig(**{**kw, **over})


# ------------------------------------------------------------------ built-in tasks


def test_builtin_tasks_in_registration_order():
    assert tasks.TASKS == task_names() == ("flipflop", "a5", "s5", "mqrar")


@pytest.mark.parametrize("name", task_names())
def test_declared_options_build_the_config(name):
    spec = get_task(name)
    for option in spec.options:
        option.check(option.default)
        assert option.choices is None or option.default in option.choices
    defaults = {o.name: o.default for o in spec.options}
    assert spec.resolve() == defaults
    cfg = SyntheticConfig(task=name, **option_fields(defaults))  # the defaults, given explicitly
    assert build_task(cfg).cfg == build_task(SyntheticConfig(task=name)).cfg
    with pytest.raises(ValueError, match="not an option"):
        spec.resolve({"no_such_option": 1})


@pytest.mark.parametrize("name", task_names())
def test_declared_splits_give_distinct_streams(name):
    spec = get_task(name)
    assert list(spec.splits)[0] == "train" and spec.eval_splits
    cfg = small_config(name)
    first = {}
    for split in spec.splits:
        stream = TaskStream.for_split(cfg, split)
        assert stream.task.name == name and stream.stream == spec.stream(split)
        tokens, targets = next(stream)  # [B, T] each
        assert tokens.shape == targets.shape and tokens.shape[0] == cfg.batch_size
        assert 0 <= int(tokens.min()) and int(tokens.max()) < model_vocab_size(stream.task)
        scored = targets[targets != IGNORE_INDEX]
        assert scored.numel() and int(scored.max()) < len(stream.task.vocab)
        first[split] = tokens
    assert len({tuple(t.flatten().tolist()) for t in first.values()}) == len(first)
    with pytest.raises(ValueError, match="split"):
        spec.stream("no_such_split")


@pytest.mark.parametrize("name", task_names())
def test_training_stream_is_the_task_iterated(name):
    """The training stream draws `iter(task)`'s batches (after a BOS column if declared)."""
    spec = get_task(name)
    cfg = small_config(name)
    want = next(iter(build_task(cfg)))
    got = next(TaskStream.for_split(cfg, "train"))
    skip = int(spec.bos)
    assert torch.equal(got[0][:, skip:], want[0]) and torch.equal(got[1][:, skip:], want[1])
    if spec.bos:
        assert (got[0][:, 0] == len(build_task(cfg).vocab)).all()
        assert (got[1][:, 0] == IGNORE_INDEX).all()


@pytest.mark.parametrize("name", task_names())
def test_declared_metrics_match_the_evaluation(name):
    spec = get_task(name)
    metrics = spec.metrics
    assert set(metrics.reported) <= set(METRICS)
    assert {metrics.headline, metrics.solve} <= set(metrics.reported)
    cfg = small_config(name)
    task = build_task(cfg)
    torch.manual_seed(0)
    model = PaTHLM(build_model_config(cfg, model_vocab_size(task), 64))
    nested = evaluate(model, cfg)
    assert tuple(nested) == spec.eval_splits
    for values in nested.values():
        assert list(values) == [*metrics.reported, "scored", "sequences"]
        assert values["sequences"] == cfg.batch_size * cfg.eval_batches
    flat = flatten_metrics(nested)
    errors = error_series(flat, name)
    assert len(errors) == len(spec.eval_splits)
    assert all(0.0 <= e <= 1.0 for e in errors.values())
    assert 0.0 <= solve_score(flat, name) <= 1.0


@pytest.mark.parametrize("command", ["data", "train", "compare", "layers"])
def test_options_of_one_name_are_one_flag(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    for name, owners in options_by_name().items():
        assert len({(o.type, o.choices) for _, o in owners}) == 1
        assert "--" + name.replace("_", "-") in text


@pytest.mark.parametrize("name", list(options_by_name()))
def test_an_option_of_another_task_is_refused(name):
    owners = [spec.name for spec, _ in options_by_name()[name]]
    other = next(t for t in task_names() if t not in owners)
    option = options_by_name()[name][0][1]
    with pytest.raises(ValueError, match=f"{name} applies to task {', '.join(owners)} only"):
        SyntheticConfig(task=other, **option_fields({name: option.default}))


def test_register_refuses_clashes():
    flipflop = get_task("flipflop")
    with pytest.raises(ValueError, match="already registered"):
        register_task(flipflop)
    clash = TaskSpec(name="clash", config=flipflop.config, task=flipflop.task,
                     options=(TaskOption("length", str, "long", "a word"),))
    with pytest.raises(ValueError, match="length differs"):
        register_task(clash)
    assert "clash" not in task_names()
    with pytest.raises(ValueError, match="splits"):
        TaskSpec(name="x", config=flipflop.config, task=flipflop.task, splits={"val": 1})
    with pytest.raises(ValueError, match="own seed stream"):
        TaskSpec(name="x", config=flipflop.config, task=flipflop.task,
                 splits={"train": 0, "val": 0})
    with pytest.raises(ValueError, match="none of"):
        TaskSpec(name="x", config=flipflop.config, task=flipflop.task,
                 options=(TaskOption("seed", int, 1, "a seed"),))
    with pytest.raises(ValueError, match="headline"):
        TaskMetrics(reported=("token_acc",), headline="seq_acc")
    with pytest.raises(ValueError, match="unknown_task"):
        unregister_task("unknown_task")


# ------------------------------------------------------- a task registered in the test


@dataclass
class CopyConfig:
    symbols: int = 8
    length: int = 10
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.symbols < 2:
            raise ValueError(f"symbols must be >= 2, got {self.symbols}")


class Copy:
    """Random words over `symbols` symbols; the target at t is the token at t - 1."""

    name = "copy"

    def __init__(self, cfg: CopyConfig):
        self.cfg = cfg
        self.vocab = Vocab([f"s{i}" for i in range(cfg.symbols)])

    def batch(self, generator):
        B, T = self.cfg.batch_size, self.cfg.length
        tokens = torch.randint(self.cfg.symbols, (B, T), generator=generator)  # [B, T]
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[:, 1:] = tokens[:, :-1]
        return tokens, targets

    def __iter__(self):
        g = make_generator(self.cfg.seed)
        while True:
            yield self.batch(g)


def copy_config(split: str, **kwargs) -> CopyConfig:
    return CopyConfig(**kwargs)


COPY = TaskSpec(name="copy", config=copy_config, task=Copy,
                options=(TaskOption("symbols", int, CopyConfig.symbols, "distinct symbols"),),
                metrics=TaskMetrics(solve="token_acc"))


@pytest.fixture
def copy_task():
    with registered_task(COPY) as spec:
        yield spec


def test_new_task_config_validation(copy_task):
    assert tasks.TASKS[-1] == "copy"
    cfg = SyntheticConfig(task="copy", task_options={"symbols": 3}, batch_size=2)
    assert build_task(cfg, "val").cfg == CopyConfig(symbols=3, batch_size=2)
    assert SyntheticConfig.from_dict(cfg.to_dict()) == cfg
    assert build_task(SyntheticConfig(task="copy")).cfg.symbols == 8  # the declared default
    with pytest.raises(ValueError, match="num_pairs applies to task flipflop only"):
        SyntheticConfig(task="copy", num_pairs=3)
    with pytest.raises(ValueError, match="symbols applies to task copy only"):
        SyntheticConfig(task="a5", task_options={"symbols": 3})
    with pytest.raises(ValueError, match="symbols must be None or a positive int"):
        SyntheticConfig(task="copy", task_options={"symbols": 0})
    with pytest.raises(ValueError, match="task options: symbols must be >= 2"):
        SyntheticConfig(task="copy", task_options={"symbols": 1})
    with pytest.raises(ValueError, match="task_options"):
        SyntheticConfig(task="copy", task_options={"colour": "red"})
    with pytest.raises(ValueError, match="task_options"):
        SyntheticConfig(task="a5", task_options={"length": 3})  # has a field of its own


def test_new_task_data_command(copy_task, tmp_path, capsys):
    out = tmp_path / "copy.jsonl"
    assert main(["data", "copy", "--symbols", "3", "--n", "5", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5
    for rec in records:
        assert set(rec["tokens"]) <= {"s0", "s1", "s2"} and len(rec["tokens"]) == 10
        assert rec["targets"] == [None, *rec["tokens"][:-1]]
    for argv in (["flipflop", "--symbols", "3"], ["copy", "--split", "val"],
                 ["copy", "--num-pairs", "3"], ["copy", "--symbols", "1"]):
        with pytest.raises(SystemExit) as e:
            main(["data", *argv, "--n", "1", "--out", str(tmp_path / "x.jsonl")])
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--symbols applies to copy only" in err and "--split applies to flipflop only" in err


def test_new_task_trains_and_evaluates(copy_task, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--symbols", "3", "--dim", "16", "--heads", "2",
            "--steps", "2", "--batch-size", "2", "--eval-every", "1", "--eval-batches", "1",
            "--final-eval-batches", "2", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["task"] == "copy" and config["task_options"] == {"symbols": 3}
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"step", "val_token_acc", "val_seq_acc", "val_scored",
                            "val_sequences"}
    assert metrics["val_scored"] == 2 * 2 * 9 and metrics["val_sequences"] == 4
    records = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert error_series(metrics, "copy") == {"val (1 - seq acc)": 1.0 - metrics["val_seq_acc"]}
    assert solve_score(metrics, "copy") == metrics["val_token_acc"]
    base = SyntheticConfig(task="copy")
    table = layers_table({"path": {"solved_at": 1, "runs": {1: 0.95}}}, base, 0.9)
    assert "fewest layers with token acc >= 90 %" in table
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0


def test_unregistered_task_is_gone(tmp_path):
    with registered_task(COPY):
        assert "copy" in task_names()
    assert "copy" not in task_names() and "symbols" not in options_by_name()
    with pytest.raises(ValueError, match="task must be one of"):
        SyntheticConfig(task="copy")
    with pytest.raises(SystemExit):
        main(["data", "copy", "--n", "1", "--out", str(tmp_path / "x.jsonl")])
