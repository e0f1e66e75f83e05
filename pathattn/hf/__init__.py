"""Hugging Face adapter (needs `transformers >= 5`): `PaTHConfig`, `PaTHModel`,
`PaTHForCausalLM`, `PaTHGenerationCache`, and `register()`, which registers model_type
"pathattn" with AutoConfig, AutoModel and AutoModelForCausalLM.

`import pathattn` registers the classes as soon as transformers is imported (at once when
it already is, otherwise by a one-shot import hook, so `import pathattn` alone stays free
of transformers' import time).
"""

from __future__ import annotations

from .cache import PaTHGenerationCache
from .configuration import MODEL_TYPE, PaTHConfig
from .modeling import PaTHForCausalLM, PaTHModel, PaTHPreTrainedModel

__all__ = ["PaTHConfig", "PaTHModel", "PaTHForCausalLM", "PaTHPreTrainedModel",
           "PaTHGenerationCache", "register", "MODEL_TYPE"]


def register() -> None:
    """Register PaTHConfig / PaTHModel / PaTHForCausalLM with the Auto classes (idempotent)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if MODEL_TYPE not in CONFIG_MAPPING:
        AutoConfig.register(MODEL_TYPE, PaTHConfig)
    for auto, cls in ((AutoModel, PaTHModel), (AutoModelForCausalLM, PaTHForCausalLM)):
        if PaTHConfig not in auto._model_mapping:
            auto.register(PaTHConfig, cls)


register()
_READY = True
