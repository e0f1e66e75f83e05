"""Packing is exact: `PaTHLM`'s loss of a packed batch (mean cross-entropy over its scored
positions) equals the token-weighted mean of the losses of its pieces, each run alone as
its own sequence, to 1e-10 in float64, for every attention type; whole documents among
the pieces are thus trained exactly as if alone. Checked on training batches and on the
evaluation pass (its last batch padded), with the tiny preset and the vocab-300 tokenizer."""

from __future__ import annotations

import pytest
import torch

from pathattn.data import EvalLoader, TokenLoader, prepare_dataset
from pathattn.models import ATTN_TYPES, IGNORE_INDEX, ModelConfig, PaTHLM

from . import VOCAB, snippets, tiny_tokenizer, write_jsonl

TOL = 1e-10


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packing")
    tok = tiny_tokenizer(tmp / "tok")
    path = write_jsonl(tmp / "docs.jsonl", snippets(30, seed=4, max_chars=200))
    prepare_dataset([str(path)], tok, tmp / "data", val_fraction=0.3, workers=1,
                    progress=False)
    return tmp / "data"


def batches(data_dir, which: str):
    if which == "train":
        return [TokenLoader(data_dir, 128, 2, seed=1).batch(k) for k in (0, 5)]
    return list(EvalLoader(data_dir, 128, 2))  # the last one is padded


@pytest.mark.parametrize("which", ["train", "eval"])
@pytest.mark.parametrize("attn_type", ATTN_TYPES)
def test_packed_loss_is_the_token_weighted_mean_of_pieces_alone(data_dir, attn_type, which):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB, attn_type=attn_type,
                             initializer_range=0.2)
    model = PaTHLM(cfg).double().eval()
    whole_documents = 0
    for batch in batches(data_dir, which):
        with torch.no_grad():
            _, packed = model(**batch.model_inputs())
            total, scored = torch.zeros((), dtype=torch.float64), 0
            bounds = batch.cu_seqlens.tolist()
            for start, end in zip(bounds[:-1], bounds[1:], strict=True):
                ids, labels = batch.input_ids[:, start:end], batch.labels[:, start:end]
                n = int((labels != IGNORE_INDEX).sum())
                if n == 0:  # padding, or a document's last token alone
                    continue
                _, alone = model(ids, labels)
                total, scored = total + alone * n, scored + n
                whole_documents += bool(ids[0, 0] == 0 and labels[0, -1] == IGNORE_INDEX)
        assert scored == batch.num_scored > 0
        assert abs(float(packed) - float(total / scored)) <= TOL * float(packed)
    assert whole_documents > 0  # BOS (id 0) first, EOS last: a document alone
