"""`import pathattn` registers model_type "pathattn" with the Auto classes whether
transformers is imported before or after it, and does not import transformers itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers")

CHECK = ("from transformers import AutoConfig, AutoModelForCausalLM\n"
         "c = AutoConfig.for_model('pathattn', vocab_size=8, hidden_size=16, "
         "intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)\n"
         "m = AutoModelForCausalLM.from_config(c)\n"
         "assert type(m).__name__ == 'PaTHForCausalLM', type(m)\n")


@pytest.mark.parametrize("code", [
    "import pathattn, sys\nassert 'transformers' not in sys.modules\n" + CHECK,
    "import transformers\nimport pathattn\n" + CHECK,
    "import pathattn\nfrom pathattn import PaTHForCausalLM, PaTHConfig\n" + CHECK,
], ids=["pathattn-first", "transformers-first", "lazy-attribute"])
def test_auto_registration(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
