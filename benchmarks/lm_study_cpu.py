"""The CPU-scale language-model study (the paper's section 4.2 pattern): PaTH, PaTH-FoX,
FoX and RoPE language models trained at one length L with the same token budget, then
evaluated beyond L: perplexity by context length on held-out code and accuracy on the
long-context tasks (needle in a haystack, variable tracking, PhoneBook) at L, 2L, 4L, 8L.

Stages (each skipped when its output exists, so an interrupted study resumes; a training
run resumes from its last checkpoint):

1. data: a byte-level BPE tokenizer of the default corpus (the running Python's standard
   library source); OUT/data_code, the default corpus alone (its held-out split is the
   held-out code of the perplexity evaluation); OUT/longctx_train/<task>.jsonl, training
   documents of the three long-context tasks (`write_training_docs`, split "train", so
   they never coincide with the evaluation examples) at prompt lengths up to L, as many as
   make `--task-share` of the training tokens; OUT/data, the standard library files plus
   those documents prepared into one folder. The files of the default corpus are passed
   one by one rather than as their folder: a walk of the standard library folder would
   also take its test folders and, where it lies inside, site-packages. A document's split
   depends only on its text and the seed, so OUT/data's held-out code is OUT/data_code's.
2. pretraining: `pathattn pretrain --preset cpu-small --seq-len L --tokens N` for every
   attention type on OUT/data (packed documents, float32, one seed).
3. evaluation: `pathattn eval ppl` of all models on OUT/data_code's held-out split at
   lengths L .. 16L, and `pathattn eval longctx` of every model on every task at L .. 8L
   with `--n` examples per length.
4. report: OUT/results.md (markdown tables, also printed), IMG/lm_study_results.json and
   IMG/lm_study_loss_by_position.png (IMG = --img-dir, default docs/img).

    python benchmarks/lm_study_cpu.py --out runs/lm_study                  # defaults
    python benchmarks/lm_study_cpu.py --out runs/lm_study --tokens 600000 --seq-len 512 \\
        --n 10 --attns path path_fox fox rope
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

from _env import system_info  # benchmarks/ is on sys.path

from pathattn.cli import main as cli
from pathattn.train import read_jsonl

ATTNS = ("path", "path_fox", "fox", "rope")
TASKS = ("niah", "vt", "phonebook")
NAMES = {"path": "PaTH", "path_fox": "PaTH-FoX", "fox": "FoX", "rope": "RoPE"}


def _run(args: list[str]) -> None:
    code = cli(args)
    if code:
        raise SystemExit(f"pathattn {' '.join(args[:2])} failed with exit code {code}")


class Stages:
    """Wall time of every stage run, kept in OUT/stages.json across resumed invocations."""

    def __init__(self, path: Path):
        self.path = path
        self.times = json.loads(path.read_text()) if path.exists() else {}

    def run(self, name: str, done: Path, fn) -> None:
        """fn() unless `done` exists; its wall time is recorded under `name`."""
        if done.exists():
            return
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        fn()
        self.times[name] = round(time.perf_counter() - start, 1)
        self.path.write_text(json.dumps(self.times, indent=2) + "\n")


# ---------------------------------------------------------------------------- data

def task_lengths(seq_len: int) -> list[int]:
    """Prompt lengths of the training documents: 3/8, 5/8 and 7/8 of L, so a document
    (prompt, answer of up to about 30 tokens, BOS, EOS) fits in one training row."""
    return [seq_len * k // 8 for k in (3, 5, 7)]


def write_task_docs(tokenizer_dir: Path, code_dir: Path, out: Path, seq_len: int,
                    share: float, seed: int) -> dict:
    """OUT/longctx_train/<task>.jsonl: n documents per task and length, n chosen so that
    the documents are `share` of code + documents (in tokens, estimated from 4 samples per
    task and length). Returns {"n_per_length", "lengths", "documents", "files"}."""
    from pathattn.data import TokenDataset, load_tokenizer
    from pathattn.evaluation.longctx import training_records, write_training_docs

    tok = load_tokenizer(tokenizer_dir)
    code_tokens = TokenDataset(code_dir, "train").num_tokens
    lengths = task_lengths(seq_len)
    per_round = 0.0  # tokens of one document per task and length, BOS and EOS included
    for task in TASKS:
        for rec in training_records(task, tok, lengths, 4, seed):
            per_round += (len(tok(rec["text"], add_special_tokens=False)["input_ids"]) + 2) / 4
    n = max(1, round(share / (1 - share) * code_tokens / per_round))
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for task in TASKS:
        path = out / f"{task}.jsonl"
        write_training_docs(task, tok, lengths, n, path, seed)
        files.append(str(path))
    info = {"n_per_length": n, "lengths": lengths, "documents": n * len(lengths) * len(TASKS),
            "files": files}
    (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def prepare_mixed(tokenizer_dir: Path, task_dir: Path, out: Path, seed: int) -> None:
    from pathattn.data.corpus import default_corpus_files

    inputs = [str(f) for f in default_corpus_files()]
    inputs += [str(task_dir / f"{task}.jsonl") for task in TASKS]
    _run(["prepare", "--input", *inputs, "--tokenizer", str(tokenizer_dir), "--out", str(out),
          "--seed", "0", "--workers", "2", "--no-progress"])


# ------------------------------------------------------------------------- results

def training_record(run: Path) -> dict:
    metrics = json.loads((run / "metrics.json").read_text())
    log = read_jsonl(run / "log.jsonl")
    cfg = json.loads((run / "config.json").read_text())
    return {"steps": cfg["steps"], "tokens": log[-1]["tokens"],
            "train_s": round(log[-1]["elapsed_s"], 1),
            "tokens_per_s": round(log[-1]["tokens"] / log[-1]["elapsed_s"], 1),
            "final_train_loss": log[-1]["loss"], "val_loss": metrics["val_loss"],
            "val_ppl": metrics["val_ppl"], "val_tokens": metrics.get("val_tokens")}


def longctx_record(folder: Path, task: str) -> dict:
    """{"variant", "accuracy": {length: accuracy in [0, 1]}, "prompt_tokens": {...}} of
    one `pathattn eval longctx` output."""
    (path,) = sorted(folder.glob(f"longctx_{task}_*.json"))
    res = json.loads(path.read_text())
    return {"variant": res["variant"], "n": res["n"], "seed": res["seed"],
            "accuracy": {str(r["length"]): r["accuracy"] for r in res["rows"]},
            "prompt_tokens": {str(r["length"]): r["prompt_tokens"] for r in res["rows"]}}


def markdown(results: dict) -> str:
    attns, ppl = results["args"]["attns"], results["ppl"]
    lengths = ppl["lengths"]
    L = results["args"]["seq_len"]
    lines = ["Perplexity of held-out code by context length (trained at L = "
             f"{L}; windows of the length tiling the held-out stream):", "",
             "| model | " + " | ".join(f"{n} ({n // L}L)" for n in lengths) + " |",
             "|---|" + "---:|" * len(lengths)]
    for attn in attns:
        row = ppl["models"][attn]
        lines.append(f"| {NAMES.get(attn, attn)} | "
                     + " | ".join(f"{row[str(n)]:.1f}" for n in lengths) + " |")
    for task, by_attn in results["longctx"].items():
        tl = list(next(iter(by_attn.values()))["accuracy"])
        n = next(iter(by_attn.values()))["n"]
        lines += ["", f"{task} ({next(iter(by_attn.values()))['variant']}): accuracy (%), "
                  f"{n} examples per length:", "",
                  "| model | " + " | ".join(f"{k} ({int(k) // L}L)" for k in tl) + " |",
                  "|---|" + "---:|" * len(tl)]
        for attn in attns:
            acc = by_attn[attn]["accuracy"]
            lines.append(f"| {NAMES.get(attn, attn)} | "
                         + " | ".join(f"{100 * acc[k]:.0f}" for k in tl) + " |")
    lines += ["", "| model | steps | training tokens | tokens / s | training time (s) | "
              "val loss (mixed split, tokens) |", "|---|---:|---:|---:|---:|---:|"]
    for attn in attns:
        t = results["training"][attn]
        lines.append(f"| {NAMES.get(attn, attn)} | {t['steps']} | {t['tokens']:,} | "
                     f"{t['tokens_per_s']:,.0f} | {t['train_s']:,.0f} | {t['val_loss']:.3f} "
                     f"({t['val_tokens']:,}) |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- main

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/lm_study"))
    p.add_argument("--img-dir", type=Path, default=Path("docs/img"),
                   help="where lm_study_results.json and lm_study_loss_by_position.png go")
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--attns", nargs="+", default=list(ATTNS))
    p.add_argument("--tokens", type=int, default=600_000, help="training tokens per model")
    p.add_argument("--seq-len", type=int, default=512, help="training length L")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--task-share", type=float, default=0.15,
                   help="share of the training tokens from long-context task documents")
    p.add_argument("--n", type=int, default=10, help="long-context examples per length")
    p.add_argument("--ppl-factors", nargs="+", type=int, default=[1, 2, 4, 8, 16],
                   help="perplexity lengths as multiples of L")
    p.add_argument("--longctx-factors", nargs="+", type=int, default=[1, 2, 4, 8],
                   help="long-context prompt lengths as multiples of L")
    p.add_argument("--ppl-max-docs", type=int,
                   help="score the first N held-out code documents only (default: all)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--final-eval-batches", type=int,
                   help="validation batches of each run's final evaluation (default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out, L = args.out, args.seq_len
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out / "stages.json")
    tok, code, tasks_dir, data = (out / "tokenizer", out / "data_code", out / "longctx_train",
                                  out / "data")

    # 1. data
    stages.run("tokenizer", tok / "tokenizer.json", lambda: _run(
        ["tokenizer", "--vocab-size", str(args.vocab_size), "--out", str(tok),
         "--no-progress"]))
    stages.run("prepare_code", code / "meta.json", lambda: _run(
        ["prepare", "--tokenizer", str(tok), "--out", str(code), "--workers", "2",
         "--no-progress"]))
    stages.run("task_docs", tasks_dir / "info.json", lambda: write_task_docs(
        tok, code, tasks_dir, L, args.task_share, args.seed))
    stages.run("prepare_mixed", data / "meta.json",
               lambda: prepare_mixed(tok, tasks_dir, data, args.seed))

    # 2. pretraining
    for attn in args.attns:
        run = out / attn
        stages.run(f"pretrain_{attn}", run / "metrics.json", lambda run=run, attn=attn: _run(
            ["pretrain", "--data", str(data), "--preset", args.preset, "--attn", attn,
             "--tokens", str(args.tokens), "--seq-len", str(L),
             "--batch-size", str(args.batch_size), "--eval-every", str(args.eval_every),
             "--seed", str(args.seed), "--no-progress", "--out", str(run),
             *(["--final-eval-batches", str(args.final_eval_batches)]
               if args.final_eval_batches else []),
             *(["--resume"] if (run / "checkpoints").exists() else [])]))

    # 3. evaluation
    ppl_lengths = [L * k for k in args.ppl_factors]
    ctx_lengths = [L * k for k in args.longctx_factors]
    stages.run("eval_ppl", out / "ppl" / "ppl.json", lambda: _run(
        ["eval", "ppl", "--model", *(str(out / a / "hf") for a in args.attns),
         "--data", str(code), "--lengths", *map(str, ppl_lengths), "--out", str(out / "ppl"),
         *(["--max-docs", str(args.ppl_max_docs)] if args.ppl_max_docs else []),
         "--no-progress"]))
    for attn in args.attns:
        for task in TASKS:
            folder = out / attn / "longctx"
            stages.run(f"eval_longctx_{attn}_{task}", folder / f".{task}.done",
                       lambda folder=folder, attn=attn, task=task: (_run(
                           ["eval", "longctx", "--model", str(out / attn / "hf"), "--task",
                            task, "--lengths", *map(str, ctx_lengths), "--n", str(args.n),
                            "--seed", str(args.seed), "--out", str(folder),
                            "--no-progress"]), (folder / f".{task}.done").touch()))

    # 4. report
    report(args, out, stages.times, ppl_lengths)


def report(args, out: Path, times: dict, ppl_lengths: list[int]) -> None:
    code_meta = json.loads((out / "data_code" / "meta.json").read_text())
    mixed_meta = json.loads((out / "data" / "meta.json").read_text())
    task_info = json.loads((out / "longctx_train" / "info.json").read_text())
    code_train = code_meta["splits"]["train"]["tokens"]
    mixed_train = mixed_meta["splits"]["train"]["tokens"]
    ppl_report = json.loads((out / "ppl" / "ppl.json").read_text())
    by_name = {m["name"]: m for m in ppl_report["models"]}
    results = {
        "system": system_info(),
        "args": vars(args) | {"out": str(args.out), "img_dir": str(args.img_dir)},
        "seeds": {"model_init_and_data_order": args.seed, "task_documents": args.seed,
                  "evaluation_examples": args.seed, "split": 0},
        "data": {"code_train_tokens": code_train,
                 "code_val_tokens": code_meta["splits"]["val"]["tokens"],
                 "code_val_documents": code_meta["splits"]["val"]["documents"],
                 "mixed_train_tokens": mixed_train,
                 "task_train_tokens": mixed_train - code_train,
                 "task_share_of_train_tokens": round((mixed_train - code_train) / mixed_train,
                                                     4),
                 "task_documents": task_info},
        "training": {a: training_record(out / a) for a in args.attns},
        "ppl": {"lengths": ppl_lengths, "held_out_documents": ppl_report["documents"],
                "held_out_tokens": ppl_report["tokens"],
                "models": {a: by_name[a]["ppl"] for a in args.attns},
                "windows": by_name[args.attns[0]]["windows"]},
        "longctx": {t: {a: longctx_record(out / a / "longctx", t) for a in args.attns}
                    for t in TASKS},
        "wall_s": times,
    }
    text = markdown(results)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    args.img_dir.mkdir(parents=True, exist_ok=True)
    (args.img_dir / "lm_study_results.json").write_text(json.dumps(results, indent=2) + "\n")
    shutil.copyfile(out / "ppl" / "loss_by_position.png",
                    args.img_dir / "lm_study_loss_by_position.png")
    print(text)
    if not math.isfinite(sum(results["ppl"]["models"][args.attns[0]].values())):
        print("warning: a perplexity is not finite")


if __name__ == "__main__":
    main()
