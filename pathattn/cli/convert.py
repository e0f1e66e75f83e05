"""`pathattn convert`: turn a pretrained RoPE model of the LLaMA family into a PaTH model by
distillation (`pathattn.convert.convert`).

    pathattn convert --teacher DIR --data DATA --out OUT [--attn path|path_fox]
                     [--stage1-tokens N] [--stage2-tokens N] [--seq-len L] [--batch-size B]
                     [--stage1-lr LR] [--stage2-lr LR] [--stage2-params all|attention]
                     [--resume | --overwrite] [--dp ddp|fsdp]

DIR: a LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM folder
(SmolLM2 included); DATA: a folder prepared with the teacher's tokenizer (`pathattn
prepare --tokenizer DIR`). Stage 1 aligns every attention layer with the teacher's
(attention-output MSE), stage 2 distils the next-token distributions (KL); OUT/hf is the
PaTH model with the teacher's tokenizer, OUT/metrics.json the teacher's and the student's
validation perplexity after each stage and the final KL. Continue with `pathattn pretrain
--init OUT/hf ...` for a third stage of ordinary training.

Under `torchrun --nproc_per_node=P -m pathattn convert ...` the stages are data-parallel
over P ranks; `--dp fsdp` shards the teacher and the student over them.
"""

from __future__ import annotations

import argparse
import json

from .args import add_device_flag, add_dp, add_run_folder_flags, model_args

HELP = "convert a pretrained RoPE model (Llama, Mistral, Qwen2, Qwen3) into PaTH"

# options whose default None leaves the distillation's default (`pathattn.convert.convert`)
LOOP_FIELDS = ("eval_every", "eval_batches", "final_eval_batches", "log_every",
               "checkpoint_every")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help=HELP, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn convert`; sets `run=run`."""
    p.add_argument("--teacher", required=True, help="teacher folder (from_pretrained)")
    p.add_argument("--data", required=True,
                   help="prepared folder tokenized with the teacher's tokenizer")
    p.add_argument("--attn", choices=("path", "path_fox"), default="path",
                   help="the student's attention (default path)")
    _add_stage_flags(p)
    p.add_argument("--init-beta", type=float, default=None,
                   help="initial beta of the new PaTH transforms (default 0.1)")
    p.add_argument("--student-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a ModelConfig field of the student, e.g. beta_max=1.99, w_rank=16 "
                        "(repeatable)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="bfloat16 autocast (default float32)")
    p.add_argument("--seed", type=int, default=0, help="init and data order (default 0)")
    _add_logging_flags(p)
    add_run_folder_flags(p, "output folder",
                         "continue the conversion in --out (finished stages are kept)",
                         "replace the conversion in --out", "no tqdm progress bars")
    add_dp(p, "under torchrun: replicate the teacher and the student (ddp, default) or "
           "shard both with FSDP2 (fsdp)")
    add_device_flag(p)
    p.set_defaults(run=run)


def _add_stage_flags(p: argparse.ArgumentParser) -> None:
    """Token budgets, batch shape, learning rates and trained parameters of the stages."""
    p.add_argument("--stage1-tokens", type=int, default=2_000_000,
                   help="stage-1 token budget (default 2M)")
    p.add_argument("--stage2-tokens", type=int, default=2_000_000,
                   help="stage-2 token budget, 0 = no stage 2 (default 2M)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (256)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per step (8)")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate of both stages (overridden per stage below)")
    p.add_argument("--stage1-lr", type=float, default=None, help="default 1e-3")
    p.add_argument("--stage2-lr", type=float, default=None, help="default 3e-4")
    p.add_argument("--stage2-params", choices=("all", "attention"), default="all",
                   help="parameters trained in stage 2 (default all)")


def _add_logging_flags(p: argparse.ArgumentParser) -> None:
    """The LOOP_FIELDS flags."""
    p.add_argument("--eval-every", type=int, default=None, help="steps (default 100)")
    p.add_argument("--eval-batches", type=int, default=None,
                   help="val batches per evaluation (default 4)")
    p.add_argument("--final-eval-batches", type=int, default=None,
                   help="val batches of the final evaluations (default: all)")
    p.add_argument("--log-every", type=int, default=None, help="steps (default 10)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps (default 100)")


def convert_options(args: argparse.Namespace) -> dict:
    """The `pathattn.convert.convert` options of parsed arguments."""
    from ..convert import PaTHInit

    opts = dict(stage1_tokens=args.stage1_tokens, stage2_tokens=args.stage2_tokens,
                seq_len=args.seq_len, batch_size=args.batch_size, attn_type=args.attn,
                stage2_params=args.stage2_params, dtype=args.dtype, seed=args.seed,
                progress=not args.no_progress,
                student_options=model_args(args.student_arg))
    if args.stage2_tokens < 0:
        raise ValueError(f"--stage2-tokens must be >= 0, got {args.stage2_tokens}")
    for stage in (1, 2):
        lr = getattr(args, f"stage{stage}_lr")
        lr = args.lr if lr is None else lr
        if lr is not None:
            opts[f"stage{stage}_lr"] = lr
    if args.init_beta is not None:
        opts["init"] = PaTHInit(beta=args.init_beta)
    opts.update({name: getattr(args, name) for name in LOOP_FIELDS
                 if getattr(args, name) is not None})
    return opts


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `pathattn convert`; a bad option, teacher or data folder goes to
    `parser.error`."""
    from ..convert import convert
    from ..data import DataError
    from ..utils.device import resolve_device

    try:
        device = resolve_device(args.device)
        options = convert_options(args)
        summary = convert(args.teacher, args.data, args.out, resume=args.resume,
                          overwrite=args.overwrite, dp=args.dp, device=device, **options)
    except (ValueError, DataError, OSError) as e:
        parser.error(str(e))
    _close_process_group()
    if "teacher_ppl" in summary:
        print(f"wrote {args.out}/hf and {args.out}/metrics.json")
        print(json.dumps({k: summary[k] for k in ("teacher_ppl", "final_ppl", "final_kl",
                                                  "ppl_ratio")}))
    return 0


def _close_process_group() -> None:
    """Under torchrun: wait for every rank, then tear the process group down."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
