"""The model classes of a pathattn model folder, for `AutoModel` /
`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`: config.json's
auto_map names this module, which pathattn writes beside the weights; it imports
`PaTHModel` and `PaTHForCausalLM` from the installed pathattn package
(pip install "pathattn[hf]")."""

try:
    from pathattn.hf import PaTHConfig, PaTHForCausalLM, PaTHModel
except ImportError as e:
    raise ImportError(f"this model folder holds a pathattn (PaTH attention) model, which "
                      f"needs the pathattn package with its Hugging Face extra: pip install "
                      f"'pathattn[hf]' ({type(e).__name__}: {e})") from e

__all__ = ["PaTHConfig", "PaTHModel", "PaTHForCausalLM"]
