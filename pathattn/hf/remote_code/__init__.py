"""The modules an export writes beside its weights, for `trust_remote_code=True` loading
(`pathattn.hf.export`): `configuration_pathattn.py` and `modeling_pathattn.py`, which
import the classes from the installed pathattn package. They are copied as they are, so
each is a complete module that needs nothing from this folder."""
