"""The config class of a pathattn model folder, for
`AutoConfig.from_pretrained(DIR, trust_remote_code=True)`: config.json's auto_map names
this module, which pathattn writes beside the weights; it imports `PaTHConfig` from the
installed pathattn package (pip install "pathattn[hf]")."""

try:
    from pathattn.hf import PaTHConfig
except ImportError as e:
    raise ImportError(f"this model folder holds a pathattn (PaTH attention) model, which "
                      f"needs the pathattn package with its Hugging Face extra: pip install "
                      f"'pathattn[hf]' ({type(e).__name__}: {e})") from e

__all__ = ["PaTHConfig"]
