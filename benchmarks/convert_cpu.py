"""The CPU-scale conversion: train a small RoPE teacher (a transformers `LlamaForCausalLM`,
about 1.3M parameters, half of them the tied embedding), convert it into PaTH with
`pathattn convert`'s two distillation stages, and report the teacher's and the student's
validation perplexity after each stage.

Steps (each reused or resumed when the folder already holds it, so a killed run continues
where it stopped: rerun the same command):

1. a byte-level BPE tokenizer and a prepared folder of the default corpus (the running
   Python's standard library source): OUT/tokenizer, OUT/data;
2. the teacher, trained from scratch by pathattn's training loop (`Trainer`, AdamW, warmup
   + cosine, atomic checkpoints) on plain windows of the training split: OUT/teacher/hf is
   a transformers Llama folder with the tokenizer;
3. `pathattn.convert.convert`: stage 1 (attention-output MSE) and stage 2 (KL) into
   OUT/convert (OUT/convert/hf, OUT/convert/metrics.json);
4. OUT/results.md and OUT/results.json: the table of validation perplexities.

    python benchmarks/convert_cpu.py --out runs/convert_cpu                     # defaults
    python benchmarks/convert_cpu.py --teacher-tokens 1200000 --stage1-tokens 300000 \\
        --stage2-tokens 300000 --out runs/convert_cpu

The goal: the student's validation perplexity after stage 2 within 10 % of the teacher's.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from _env import system_info  # benchmarks/ is on sys.path

from pathattn.cli import main as cli
from pathattn.convert.pipeline import convert
from pathattn.data import EvalLoader, TokenDataset, TokenLoader, load_tokenizer
from pathattn.models import IGNORE_INDEX
from pathattn.train import LoopConfig, Trainer, text_loss
from pathattn.train.pretrain import TextSteps
from pathattn.train.run_dir import finished_metrics


@dataclass
class TeacherConfig(LoopConfig):
    """The teacher's training run: the loop's fields plus data, shape and model size."""

    data: str = ""
    seq_len: int = 256
    batch_size: int = 16
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    weight_decay: float = 0.01
    warmup_start_ratio: float = 0.03
    min_lr_ratio: float = 0.03


class AlignedLabels(nn.Module):
    """A transformers causal LM with the loop's label convention: forward(input_ids, labels)
    -> (logits, mean cross-entropy of logits[t] against labels[t], already aligned)."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **unused):
        logits = self.hf(input_ids=input_ids, use_cache=False).logits  # [B, T, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                   labels.reshape(-1), ignore_index=IGNORE_INDEX)
        return logits, loss


def build_teacher(cfg: TeacherConfig, vocab: int, ids: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size,
                         num_hidden_layers=cfg.num_hidden_layers,
                         num_attention_heads=cfg.num_attention_heads,
                         num_key_value_heads=cfg.num_key_value_heads,
                         max_position_embeddings=max(1024, cfg.seq_len),
                         tie_word_embeddings=True, rms_norm_eps=1e-6,
                         attn_implementation="sdpa", **ids)
    return LlamaForCausalLM(config)


def train_teacher(out: Path, data: Path, tokens: int, args) -> Path:
    """Train (or resume, or reuse) the teacher; returns its HF folder."""
    hf_dir = out / "hf"
    tok = load_tokenizer(TokenDataset(data, "train").meta["tokenizer"]["path"])
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("bos", "eos", "pad")}
    steps = math.ceil(tokens / (args.seq_len * args.teacher_batch_size))
    cfg = TeacherConfig(data=str(data), seq_len=args.seq_len,
                        batch_size=args.teacher_batch_size, steps=steps, lr=args.teacher_lr,
                        warmup_steps=max(1, steps // 50), eval_every=max(1, steps // 8),
                        eval_batches=4, final_eval_batches=args.eval_batches,
                        checkpoint_every=max(1, steps // 10), out_dir=str(out),
                        seed=args.seed, progress=True)
    if finished_metrics(cfg) is not None and (hf_dir / "config.json").exists():
        return hf_dir
    vocab = TokenDataset(data, "train").vocab_size
    model = AlignedLabels(build_teacher(cfg, vocab, ids))
    loader = TokenLoader(data, cfg.seq_len, cfg.batch_size, mode="windows", seed=cfg.seed)
    val = EvalLoader(data, cfg.seq_len, cfg.batch_size, mode="windows")

    def evaluate(m, batches):
        return {"val": text_loss(m, val, cfg.eval_batches if batches is None else batches)}

    resume = (out / "checkpoints").exists()
    with Trainer(model, TextSteps(loader, 1), evaluate, cfg, resume=resume,
                 overwrite=not resume, name="teacher/llama") as trainer:
        trainer.train()
        model.hf.save_pretrained(hf_dir)
        tok.save_pretrained(hf_dir)
    return hf_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/convert_cpu"))
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--teacher-tokens", type=int, default=1_200_000)
    p.add_argument("--teacher-batch-size", type=int, default=16)
    p.add_argument("--teacher-lr", type=float, default=2e-3)
    p.add_argument("--attn", default="path", choices=("path", "path_fox"))
    p.add_argument("--stage1-tokens", type=int, default=300_000)
    p.add_argument("--stage2-tokens", type=int, default=300_000)
    p.add_argument("--batch-size", type=int, default=8, help="distillation rows per step")
    p.add_argument("--stage1-lr", type=float, default=1e-3)
    p.add_argument("--stage2-lr", type=float, default=3e-4)
    p.add_argument("--eval-batches", type=int, default=16,
                   help="val batches of every final evaluation")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tok, data = out / "tokenizer", out / "data"
    start = time.perf_counter()
    if not (tok / "tokenizer.json").exists():
        assert cli(["tokenizer", "--vocab-size", str(args.vocab_size), "--out", str(tok)]) == 0
    if not (data / "meta.json").exists():
        assert cli(["prepare", "--tokenizer", str(tok), "--out", str(data),
                    "--workers", "2"]) == 0
    teacher = train_teacher(out / "teacher", data, args.teacher_tokens, args)
    summary = convert(teacher, data, out / "convert", resume=True, attn_type=args.attn,
                      stage1_tokens=args.stage1_tokens, stage2_tokens=args.stage2_tokens,
                      seq_len=args.seq_len, batch_size=args.batch_size,
                      stage1_lr=args.stage1_lr, stage2_lr=args.stage2_lr, seed=args.seed,
                      final_eval_batches=args.eval_batches, eval_every=50, log_every=10)
    rows = [("teacher (Llama, RoPE)", summary["teacher"]["val_ppl"], None),
            (f"student {args.attn}, init (no training)", summary["init"]["val_student_ppl"],
             summary["init"]["val_kl"]),
            (f"student {args.attn}, after stage 1 ({args.stage1_tokens:,} tokens)",
             summary["stage1"]["val_student_ppl"], summary["stage1"]["val_kl"]),
            (f"student {args.attn}, after stage 2 ({args.stage2_tokens:,} tokens)",
             summary["stage2"]["val_student_ppl"], summary["stage2"]["val_kl"])]
    teacher_ppl = summary["teacher"]["val_ppl"]
    lines = ["| model | val ppl | / teacher | val KL(teacher \\|\\| student) |",
             "| --- | --- | --- | --- |"]
    for name, ppl, kl in rows:
        lines.append(f"| {name} | {ppl:.2f} | {ppl / teacher_ppl:.3f} | "
                     f"{'-' if kl is None else f'{kl:.4f}'} |")
    table = "\n".join(lines) + "\n"
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps({
        "system": system_info(), "args": vars(args) | {"out": str(out)},
        "wall_s_this_invocation": time.perf_counter() - start,
        "summary": {k: v for k, v in summary.items() if k != "configs"}}, indent=2) + "\n")
    print(table, end="")
    print(f"goal (stage-2 ppl within 10 % of the teacher's): "
          f"{'met' if summary['ppl_ratio'] <= 1.10 else 'missed'} "
          f"(ratio {summary['ppl_ratio']:.3f})")


if __name__ == "__main__":
    main()
