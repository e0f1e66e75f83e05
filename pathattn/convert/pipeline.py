"""`convert`: the whole conversion of a teacher folder into a PaTH model folder, the two
distillation stages one after the other (`pathattn.convert.distill`), resumable.

Layout of the output folder `out`:

    out/stage1/          stage 1's run (config.json, log.jsonl, eval.jsonl, metrics.json,
                         checkpoints/) and its student, out/stage1/hf/
    out/stage2/          stage 2's run, started from out/stage1/hf
    out/hf/              the final student and the teacher's tokenizer
                         (`AutoModelForCausalLM.from_pretrained`, generate())
    out/init_metrics.json  the student before any training (teacher weights, new PaTH
                         parameters at their init), on the validation split
    out/metrics.json     {"teacher": {...}, "init": {...}, "stage1": {...}, "stage2": {...},
                         "final_kl", "final_ppl", "teacher_ppl", "ppl_ratio"}

Before any work the teacher must be a local folder whose tokenizer is the data's (or hold
none: the data's is exported then) and `out` writable (`teacher_tokenizer`). Each stage is
one run folder of the training loop: `resume=True` continues a stage from its
last checkpoint and skips a stage that has finished (same config, exported student), so
an interrupted conversion picks up where it stopped; `overwrite=True` starts over,
deleting only the files this layout names.

Under torchrun (`dp="ddp"` or `"fsdp"`, `pathattn.convert.distill`) every rank runs the
same stages; rank 0 decides what is finished (and tells the others), locks `out`, writes
the files of this layout and the exports (a sharded student is gathered onto rank 0
first), and every rank waits for its writes before the next stage reads them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..distributed import DP_MODES, full_state_dict, init_from_env
from ..train.checkpoint import remove_tree
from ..train.run_dir import finished_metrics, lock_run_dir
from ..utils.io import atomic_dir, atomic_write_json, remove_file, writable_dir
from .distill import DistillConfig, export_student, unsharded_student
from .student import DEFAULT_INIT, PaTHInit

__all__ = ["convert", "stage_configs", "steps_for_tokens", "teacher_tokenizer"]

_OWN_FILES = ("metrics.json", "init_metrics.json")


def steps_for_tokens(tokens: int, seq_len: int, batch_size: int) -> int:
    """Optimizer steps of a token budget: ceil(tokens / (seq_len * batch_size))."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive int, got {tokens!r}")
    return math.ceil(tokens / (seq_len * batch_size))


def stage_configs(teacher: str, data: str, out: str, *, stage1_tokens: int,
                  stage2_tokens: int, seq_len: int = 256, batch_size: int = 8,
                  attn_type: str = "path", stage1_lr: float = 1e-3, stage2_lr: float = 3e-4,
                  stage2_params: str = "all", init: PaTHInit = DEFAULT_INIT,
                  student_options: dict | None = None, **loop) -> list[DistillConfig]:
    """The DistillConfigs of the stages (stage 2 left out when stage2_tokens is 0). loop:
    further `LoopConfig` fields shared by both stages (dtype, seed, eval_every, ...); each
    stage warms up over 5 % of its steps unless warmup_steps is given."""
    common = dict(teacher=str(teacher), data=str(data), seq_len=seq_len,
                  batch_size=batch_size, **loop)
    steps1 = steps_for_tokens(stage1_tokens, seq_len, batch_size)
    cfgs = [DistillConfig(stage=1, attn_type=attn_type, student_options=dict(
        student_options or {}), init_beta=init.beta, init_forget_bias=list(init.forget_bias),
        steps=steps1, lr=stage1_lr, out_dir=str(Path(out) / "stage1"),
        **{"warmup_steps": max(1, steps1 // 20), **common})]
    if stage2_tokens:
        steps2 = steps_for_tokens(stage2_tokens, seq_len, batch_size)
        cfgs.append(DistillConfig(stage=2, student=str(Path(out) / "stage1" / "hf"),
                                  params=stage2_params, steps=steps2, lr=stage2_lr,
                                  out_dir=str(Path(out) / "stage2"),
                                  **{"warmup_steps": max(1, steps2 // 20), **common}))
    return cfgs


def teacher_tokenizer(teacher: str, data: str):
    """The tokenizer the student is exported with: the teacher folder's, which must be the
    one the data was prepared with and fit the teacher's vocabulary, or, when the teacher
    folder holds none, the data's own (checked against its meta.json). DataError naming
    both identities otherwise (`pathattn.data.identity`)."""
    from ..data import TokenDataset
    from ..data.identity import (
        check_same,
        data_identity,
        data_tokenizer,
        model_tokenizer,
        tokenizer_identity,
    )
    from ..data.tokenizer import TOKENIZER_FILE_NAMES

    meta = TokenDataset(data, "train").meta
    if not any((Path(teacher) / name).is_file() for name in TOKENIZER_FILE_NAMES):
        return data_tokenizer(data, meta)
    tok, found = model_tokenizer(teacher, "teacher")
    expected = data_identity(meta)
    if expected is None:  # prepared before identities: its tokenizer folder tells
        expected = tokenizer_identity(data_tokenizer(data, meta))
    check_same(expected, found, f"the tokenizer {data} was prepared with",
               f"the teacher's ({teacher}; prepare the data with --tokenizer {teacher})",
               "data")
    return tok


def _check_folders(teacher: str, out: Path, resume: bool) -> None:
    """Start-up checks of the folders: the teacher a local folder, `out` writable, the
    stage folders real folders (a symlink in their place is replaced by a folder, or
    refused on resume: it is never followed). ValueError naming the argument."""
    if not Path(teacher).is_dir():
        raise ValueError(f"teacher: no such folder {teacher} (a local model folder with "
                         "config.json; fetch a Hub model first, e.g. `huggingface-cli "
                         "download ID --local-dir DIR`)")
    writable_dir(out, "out")
    for name in ("stage1", "stage2", "hf"):
        if (out / name).is_symlink():
            if resume:
                raise ValueError(f"out: {out / name} is a symlink; a conversion writes "
                                 "into real folders only: move the folder it points to in "
                                 "its place, then resume")
            remove_file(out / name)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    atomic_write_json(path, data, indent=2)


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _from_main(value):
    """Rank 0's value on every rank (the value itself in one process)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _export(trainer, export_to: Path, tokenizer) -> None:
    """`export_student` of the trainer's student by rank 0; a sharded student is gathered
    onto rank 0 first (a collective every rank calls)."""
    student = trainer.model.student
    if trainer.sharded:
        state = full_state_dict(trainer.model)  # {"student.<name>": tensor} on rank 0
        if not trainer.is_main:
            return
        student = unsharded_student(student.config, state)
    if trainer.is_main:
        export_student(student, export_to, tokenizer, trainer.step)


def _run_stage(cfg: DistillConfig, export_to: Path, tokenizer, *, resume: bool,
               overwrite: bool, init_file: Path | None = None, dp: str = "ddp",
               device: torch.device | str = "cpu") -> dict[str, Any]:
    """Train one stage (or reuse it when finished and resume), export its student to
    export_to; returns its final metrics ({"step": k} when stopped early, and on ranks
    other than 0). init_file: where the first stage writes the metrics of the untrained
    student (computed once). dp: the Trainer's under torchrun; device: where it computes."""
    from ..train.trainer import open_run

    if resume and not overwrite:
        done = finished_metrics(cfg)
        done = _from_main(done if done is not None and (export_to / "config.json").exists()
                          else None)
        if done is not None:
            return done
    options = {"dp": dp, "device": device} if dist.is_initialized() else {"device": device}
    with open_run(cfg, resume=resume, overwrite=overwrite, **options) as trainer:
        if (init_file is not None and trainer.step == 0
                and _from_main(_read_json(init_file) is None)
                and (trainer.is_main or trainer.sharded)):  # sharded: a collective
            init = trainer.evaluate(cfg.final_eval_batches)["val"]
            if trainer.is_main:
                _write_json(init_file, {"step": 0, **{f"val_{k}": v for k, v in init.items()}})
        metrics = trainer.train()
        if trainer.step == cfg.steps:
            _export(trainer, export_to, tokenizer)
        _barrier()  # the export and the logs are on disk for every rank
    return metrics


def _summary(metrics: list[dict], init: dict | None) -> dict[str, Any]:
    def pick(m: dict) -> dict:
        return {k: m[k] for k in ("step", "val_student_loss", "val_student_ppl", "val_kl",
                                  "val_mse", "val_tokens") if k in m}

    first, last = metrics[0], metrics[-1]
    out = {"teacher": {"val_loss": first["val_teacher_loss"],
                       "val_ppl": first["val_teacher_ppl"]},
           "init": None if init is None else pick(init)}
    for i, m in enumerate(metrics, start=1):
        out[f"stage{i}"] = pick(m)
    out.update(teacher_ppl=first["val_teacher_ppl"], final_ppl=last["val_student_ppl"],
               final_kl=last["val_kl"],
               ppl_ratio=last["val_student_ppl"] / first["val_teacher_ppl"])
    return out


def convert(teacher: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike, *,
            resume: bool = False, overwrite: bool = False, dp: str = "ddp",
            device: torch.device | str = "cpu", **options) -> dict[str, Any]:
    """Convert the teacher folder into a PaTH model in out/hf (module docstring).

    Args:
        teacher: a LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
            Qwen3ForCausalLM folder (SmolLM2 included), loaded in float32.
        data: a prepared folder (`pathattn prepare`) tokenized with the teacher's tokenizer.
        out: the output folder.
        resume: continue an interrupted conversion (finished stages are kept).
        overwrite: start over in a folder that holds a conversion.
        dp: under torchrun, "ddp" (every rank holds the teacher and the student) or "fsdp"
            (both sharded over the ranks; `pathattn.convert.distill`).
        device: where teacher and student compute (`pathattn.utils.device.resolve_device`;
            a CUDA device under torchrun: each rank's GPU, NCCL between them).
        **options: `stage_configs` options (stage1_tokens, stage2_tokens, seq_len,
            batch_size, attn_type, stage1_lr, stage2_lr, stage2_params, init,
            student_options, and LoopConfig fields such as dtype, seed, progress).

    Returns the summary written to out/metrics.json ({"step": k} when a stage stopped
    early, and on ranks other than 0 under torchrun).
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other (--resume continues the "
                         "conversion in the folder, --overwrite replaces it)")
    if dp not in DP_MODES:
        raise ValueError(f"dp must be one of {DP_MODES}, got {dp!r}")
    if not init_from_env(device) and dp != "ddp":
        raise ValueError(f"dp={dp!r} needs torch.distributed (launch with torchrun "
                         "--nproc_per_node ...)")
    out = Path(out)
    cfgs = stage_configs(str(teacher), str(data), str(out), **options)
    main = _is_main()
    if main:
        _check_folders(str(teacher), out, resume)
    tokenizer = teacher_tokenizer(str(teacher), str(data))
    lock = lock_run_dir(out) if main else None
    try:
        if overwrite and main:
            for name in _OWN_FILES:
                remove_file(out / name)
            remove_tree(out / "hf")
        _barrier()
        metrics = []
        for i, cfg in enumerate(cfgs):
            last = i == len(cfgs) - 1
            export_to = out / "hf" if last and cfg.stage == 2 else Path(cfg.out_dir) / "hf"
            metrics.append(_run_stage(cfg, export_to, tokenizer, resume=resume,
                                      overwrite=overwrite, dp=dp, device=device,
                                      init_file=out / "init_metrics.json" if i == 0 else None))
            if metrics[-1]["step"] < cfg.steps:  # stopped early: nothing more to do
                return {"step": metrics[-1]["step"]}
        if not main:
            return {"step": cfgs[-1].steps}
        if cfgs[-1].stage == 1:  # no stage 2: the stage-1 student is the result
            with atomic_dir(out / "hf") as tmp:
                shutil.copytree(Path(cfgs[0].out_dir) / "hf", tmp, dirs_exist_ok=True)
        summary = _summary(metrics, _read_json(out / "init_metrics.json"))
        summary["configs"] = [c.to_dict() for c in cfgs]
        _write_json(out / "metrics.json", summary)
        return summary
    finally:
        if lock is not None:
            lock.release()
