"""The long-context generators: every answer recomputed from the prompt text alone (the
prompt parsed back with regular expressions), prompt lengths within 3 % of the target for
a BPE and a character-level tokenizer, determinism by seed, the registry, training
documents."""

from __future__ import annotations

import json
import re

import pytest

from pathattn.evaluation.longctx import (
    TASKS,
    LongContextTask,
    count_tokens,
    make_task,
    read_corpus,
    register_task,
    task_names,
    write_training_docs,
)

from .conftest import STDLIB

CASES = [("niah", "single", {}), ("niah", "multikey", {}), ("niah", "multivalue", {}),
         ("niah", "multiquery", {}), ("vt", None, {}), ("vt", None, {"num_chains": 3,
                                                                     "num_hops": 2}),
         ("phonebook", None, {})]
IDS = [f"{t}-{v or 'default'}" + ("-" + "-".join(f"{k}{o}" for k, o in opts.items())
                                  if opts else "") for t, v, opts in CASES]


def niah_answers(prompt: str) -> list[str]:
    needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: "
                         r"(\d{7})\.", prompt)
    question = re.search(r"\nWhat (?:is|are all) the special magic numbers? for (.+) "
                         r"mentioned in the text above\?\n", prompt).group(1)
    keys = re.split(r", | and ", question)
    assert keys and set(keys) <= {k for k, _ in needles}
    return [v for k in keys for kk, v in needles if kk == k]


def vt_answers(prompt: str) -> list[str]:
    """Run the assignments in order; the variables whose value is the queried one."""
    env: dict[str, str] = {}
    for var, src_var, number in re.findall(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d{5}))\.",
                                           prompt):
        assert var not in env  # every variable is assigned once
        env[var] = number or env[src_var]  # KeyError: used before it was assigned
    value = re.search(r"\nQuestion: Which variables are assigned the value (\d{5}),",
                      prompt).group(1)
    return [v for v, x in env.items() if x == value]


def phonebook_answers(prompt: str) -> list[str]:
    book = re.findall(r"^([A-Z][a-z]+ [A-Z][a-z]+): (555-\d{4})$", prompt, re.MULTILINE)
    names = [name for name, _ in book]
    assert len(set(names)) == len(names)
    name = re.search(r"\nWhat is the phone number of (.+)\?\n", prompt).group(1)
    return [number for n, number in book if n == name]


RECOMPUTE = {"niah": niah_answers, "vt": vt_answers, "phonebook": phonebook_answers}
PREFIX = {"niah": r"\nAnswer: The special magic numbers? for .+ mentioned in the text "
                  r"above (is|are):$",
          "vt": r"\nAnswer: The variables that hold the value \d{5} are:$",
          "phonebook": r"\nAnswer: The phone number of [A-Z][a-z]+ [A-Z][a-z]+ is$"}


@pytest.mark.parametrize(("name", "variant", "options"), CASES, ids=IDS)
def test_answers_follow_from_the_prompt(name, variant, options, tokenizer):
    task = make_task(name, variant, **options)
    for index in range(4):
        ex = task.example(tokenizer, 1500, index, seed=7)
        recomputed = RECOMPUTE[name](ex.prompt)
        order = list if name == "vt" else sorted  # vt: in the order of assignment
        assert order(recomputed) == order(ex.answers) and len(ex.answers) >= 1
        assert re.search(PREFIX[name], ex.prompt)
        assert ex.target.strip(" .").replace(" and ", ", ").split(", ") == list(ex.answers)


def test_variant_counts(bpe):
    needles = re.compile(r"special magic numbers for [a-z]+-[a-z]+ is")
    for variant, (keys, values, queries) in (("single", (1, 1, 1)), ("multikey", (4, 1, 1)),
                                             ("multivalue", (1, 4, 1)),
                                             ("multiquery", (4, 1, 4))):
        ex = make_task("niah", variant).example(bpe, 1024)
        assert len(needles.findall(ex.prompt)) == keys * values
        assert len(ex.answers) == values * queries
    ex = make_task("vt", num_chains=3, num_hops=2).example(bpe, 1024)
    assert len(re.findall(r"VAR [A-Z]{5} =", ex.prompt)) == 9 and len(ex.answers) == 3


@pytest.mark.parametrize("length", [1024, 4096])
@pytest.mark.parametrize(("name", "variant", "options"), CASES, ids=IDS)
def test_length_within_three_percent(name, variant, options, length, tokenizer):
    ex = make_task(name, variant, **options).example(tokenizer, length, seed=1)
    assert ex.num_tokens == len(tokenizer(ex.prompt)["input_ids"])
    assert 0.97 * length <= ex.num_tokens <= length


def test_corpus_haystack(bpe, tmp_path):
    docs = [(STDLIB / "json" / name).read_text() for name in ("decoder.py", "scanner.py")]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    corpus = read_corpus([tmp_path / "docs.jsonl"])
    assert corpus == docs
    for name in ("niah", "vt"):
        ex = make_task(name, corpus=corpus).example(bpe, 8192)
        assert 0.97 * 8192 <= ex.num_tokens <= 8192
        assert RECOMPUTE[name](ex.prompt) == list(ex.answers)
        assert "def " in ex.prompt  # the haystack is the corpus (cycled: 8K > its length)


def test_fixed_depths_place_the_needle(bpe):
    for depth in (0.0, 0.5, 1.0):
        ex = make_task("niah", depths=[depth]).example(bpe, 2048)
        context = ex.prompt.split("\n")[1]
        at = context.index("One of the special magic numbers") / len(context)
        assert abs(at - depth) < 0.05


def test_seeded_and_deterministic(bpe):
    task = make_task("niah", "multikey")
    first = task.examples(bpe, 1024, 3, seed=0)
    assert first == task.examples(bpe, 1024, 3, seed=0)
    assert first[1] == task.example(bpe, 1024, index=1, seed=0)
    assert len({ex.prompt for ex in first}) == 3
    assert task.example(bpe, 1024, 0, seed=1).prompt != first[0].prompt
    assert task.example(bpe, 1024, 0, split="train").prompt != first[0].prompt
    assert make_task("niah", "multikey").example(bpe, 1024) == first[0]


def test_errors(bpe):
    with pytest.raises(ValueError, match="shorter than the task's fixed text"):
        make_task("niah", "multiquery").example(bpe, 50)
    with pytest.raises(ValueError, match="unknown variant"):
        make_task("niah", "sideways")
    with pytest.raises(ValueError, match="unknown long-context task"):
        make_task("ruler")
    with pytest.raises(ValueError, match="depths"):
        make_task("niah", "multikey", depths=[0.5])


def test_registration(bpe):
    @register_task
    class Echo(LongContextTask):
        name = "echo-test"

        def build(self, rng, tokenizer, length):
            word = str(rng.randrange(100))
            return f"Say {word}:", [word], {}

    try:
        assert "echo-test" in task_names()
        ex = make_task("echo-test").example(bpe, 64, seed=3)
        assert ex.prompt == f"Say {ex.answers[0]}:" and ex.target == f" {ex.answers[0]}."
        with pytest.raises(ValueError, match="already registered"):
            register_task(type("Other", (Echo,), {}))
    finally:
        TASKS.pop("echo-test")


def test_training_docs(bpe, tmp_path):
    path = tmp_path / "vt.jsonl"
    assert write_training_docs("vt", bpe, [600, 900], 2, path, seed=0) == 4
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["length"], r["index"]) for r in records] == [(600, 0), (600, 1), (900, 0),
                                                           (900, 1)]
    task = make_task("vt")
    for r in records:
        prompt, answer = r["text"].rsplit(":", 1)
        assert answer.strip(" .").replace(" and ", ", ").split(", ") == vt_answers(r["text"])
        assert count_tokens(bpe, prompt + ":") <= r["length"]
        assert task.example(bpe, r["length"], r["index"], seed=0).prompt != prompt + ":"
    assert [p.name for p in tmp_path.iterdir()] == ["vt.jsonl"]  # no temp file left
