"""The session's language-model assets (`tests.faults.lm_assets`), built once."""

import pytest

from tests.faults.lm_assets import LMAssets, make_assets


@pytest.fixture(scope="session")
def lm(tmp_path_factory) -> LMAssets:
    return make_assets(tmp_path_factory.mktemp("lm"))
