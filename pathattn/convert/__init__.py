"""Converting pretrained RoPE models into PaTH by distillation (paper section 4.3, after
RADLADS): `student_from_teacher` maps a LLaMA-family Hugging Face model onto a
`PaTHForCausalLM` (`mapping`, `student`), `distill` trains it in two stages (stage 1:
per-layer attention-output MSE with the teacher's hidden states as inputs; stage 2:
KL(teacher || student) on next-token distributions), and `pathattn convert` runs both
from the command line (`pathattn.cli.convert`)."""

from .distill import (
    DistillConfig,
    DistillModel,
    distill_metrics,
    export_student,
    kl_divergence,
    load_teacher,
    stage_workload,
    trainable_parameters,
)
from .mapping import FAMILIES, Family, UnsupportedTeacher, copy_teacher_weights, family_of
from .pipeline import convert, stage_configs
from .student import PaTHInit, init_new_parameters, student_config, student_from_teacher

__all__ = ["DistillConfig", "DistillModel", "distill_metrics", "export_student",
           "kl_divergence", "load_teacher", "stage_workload", "trainable_parameters",
           "convert", "stage_configs",
           "FAMILIES", "Family", "UnsupportedTeacher", "copy_teacher_weights", "family_of",
           "PaTHInit", "init_new_parameters", "student_config", "student_from_teacher"]
