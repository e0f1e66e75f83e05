"""Non-finite training: a NaN or infinite loss, gradient norm, weight or validation metric
stops the run (`NonFiniteTraining`) instead of being trained on, checkpointed or exported.

The `Trainer` checks the step's loss and gradient norm before the optimizer applies the
update (so the weights stay those of the previous step), every weight before a checkpoint
is written, and every validation metric before it is logged; `export_hf` and the
conversion's exports check the weights again. The error names the step, what was not
finite, the last checkpoint on disk (every checkpoint written passed the check) and the
usual causes; the command line prints it as one line and exits with 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch

__all__ = ["NonFiniteTraining", "non_finite", "non_finite_parameters", "check_finite_weights",
           "CAUSES"]

CAUSES = ("a learning rate too high for the model (lr; the default is 1e-3), no or too "
          "short a warmup (warmup_steps), no gradient clipping (grad_clip 0), an overflow "
          "in bfloat16 / float16 (dtype), or token ids outside the vocabulary")


class NonFiniteTraining(RuntimeError):
    """Training produced a NaN or infinity (module docstring). Attributes: step (the step
    whose values were not finite), what (a description of them), checkpoint (the step of
    the last checkpoint on disk, or None) and out_dir."""

    def __init__(self, step: int, what: str, checkpoint: int | None,
                 out_dir: str | Path | None = None):
        self.step, self.what, self.checkpoint = step, what, checkpoint
        self.out_dir = None if out_dir is None else Path(out_dir)
        if checkpoint is None:
            last = "no checkpoint was written yet"
        else:
            where = "" if out_dir is None else f" in {self.out_dir / 'checkpoints'}"
            last = f"the last checkpoint (finite) is that of step {checkpoint}{where}"
        super().__init__(f"training stopped at step {step}: {what} not finite; nothing "
                         f"non-finite was saved, {last}; usual causes: {CAUSES}; fix the "
                         "cause and start over (--overwrite)")


def non_finite(values: dict) -> list[str]:
    """The keys of `values` (nested dicts flattened as "a.b") whose value is a float NaN or
    infinity."""
    bad = []
    for key, value in values.items():
        if isinstance(value, dict):
            bad += [f"{key}.{inner}" for inner in non_finite(value)]
        elif isinstance(value, float) and not math.isfinite(value):
            bad.append(key)
    return bad


@torch.no_grad()
def non_finite_parameters(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the tensors (parameters, buffers) holding a NaN or infinity."""
    return [name for name, t in named
            if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite_weights(model: torch.nn.Module, step: int, checkpoint: int | None = None,
                         out_dir: str | Path | None = None) -> None:
    """NonFiniteTraining when a parameter or buffer of `model` is not finite."""
    bad = non_finite_parameters(model.state_dict().items())
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise NonFiniteTraining(step, f"the weights ({shown}) are", checkpoint, out_dir)
