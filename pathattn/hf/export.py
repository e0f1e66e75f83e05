"""What makes a model folder load by name in a process that never imported pathattn:
`auto_map` plus the modules it names, and a tokenizer that adds no BOS of its own.

Every `PaTHConfig.save_pretrained` (and so every `PaTHForCausalLM.save_pretrained`, the
exports of `pathattn pretrain` and `pathattn convert` included) writes config.json with
`AUTO_MAP` and, beside it, the modules of `REMOTE_CODE_FILES` (`write_remote_code`). Those
modules only import the classes from the installed pathattn package, so

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)

works in a fresh process (lm-eval's CLI, `pipeline`, other training scripts) and runs the
installed code, never a copy of it; without pathattn installed, the ImportError names the
package to install. After `import pathattn` the folder also loads without
trust_remote_code, and a folder exported before auto_map existed loads as before.

Tokenizer (`save_tokenizer`): an export's tokenizer encodes a text without a BOS of its
own: the BOS special tokens are dropped from its post-processor template (the vocabulary,
merges and special ids are unchanged). Tools that score text put the BOS in front
themselves (lm-eval's prefix token), so a tokenizer that also added one would score a
second BOS, a token the model never learned to predict; with this setting lm-eval's
defaults score exactly what `pathattn eval lm-eval` scores. Code that generates from a
prompt and wants the BOS that began every training document adds it explicitly
(`[tokenizer.bos_token_id] + ids`).
"""

from __future__ import annotations

import copy
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from ..utils.io import atomic_write_bytes

__all__ = ["AUTO_MAP", "REMOTE_CODE_FILES", "write_remote_code", "save_tokenizer",
           "without_bos"]

REMOTE_CODE_PACKAGE = "pathattn.hf.remote_code"
REMOTE_CODE_FILES = ("configuration_pathattn.py", "modeling_pathattn.py")
AUTO_MAP = {
    "AutoConfig": "configuration_pathattn.PaTHConfig",
    "AutoModel": "modeling_pathattn.PaTHModel",
    "AutoModelForCausalLM": "modeling_pathattn.PaTHForCausalLM",
}


def write_remote_code(folder: str | os.PathLike) -> list[Path]:
    """Write the modules of REMOTE_CODE_FILES into `folder` (an existing folder; each file
    written atomically, replacing an older copy). Returns their paths."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"folder: {str(folder)!r} is not a folder (save the config first)")
    files = resources.files(REMOTE_CODE_PACKAGE)
    return [atomic_write_bytes(folder / name, files.joinpath(name).read_bytes())
            for name in REMOTE_CODE_FILES]


def _drop_bos(spec: dict[str, Any], bos: str) -> dict[str, Any]:
    """A post-processor spec (the `tokenizers` JSON) without the `bos` special tokens of its
    templates; a Sequence of processors is searched, other processors are kept."""
    if spec.get("type") == "Sequence":
        return {**spec, "processors": [_drop_bos(p, bos) for p in spec["processors"]]}
    if spec.get("type") != "TemplateProcessing":
        return spec
    def keep(items):
        return [i for i in items if i.get("SpecialToken", {}).get("id") != bos]
    return {**spec, "single": keep(spec["single"]), "pair": keep(spec["pair"])}


def without_bos(tokenizer):
    """A copy of `tokenizer` whose `tokenizer(text)` adds no BOS (module docstring); the
    tokenizer itself when it adds none or has no `tokenizers` backend to change."""
    from tokenizers import Tokenizer

    bos = tokenizer.bos_token
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if bos is None or backend is None:
        return tokenizer
    spec = json.loads(backend.to_str())
    if not spec.get("post_processor"):
        return tokenizer
    stripped = _drop_bos(spec["post_processor"], bos)
    if stripped == spec["post_processor"]:
        return tokenizer
    out = copy.deepcopy(tokenizer)
    spec["post_processor"] = stripped
    out.backend_tokenizer.post_processor = Tokenizer.from_str(json.dumps(spec)).post_processor
    return out


def save_tokenizer(tokenizer, folder: str | os.PathLike) -> Path:
    """`save_pretrained` of `without_bos(tokenizer)` into `folder` (the tokenizer of an
    export; `tokenizer` itself is left unchanged). Returns the folder."""
    if not hasattr(tokenizer, "save_pretrained"):
        raise ValueError(f"tokenizer must be a transformers tokenizer, got "
                         f"{type(tokenizer).__name__}")
    without_bos(tokenizer).save_pretrained(folder)
    return Path(folder)
