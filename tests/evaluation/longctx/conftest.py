"""Two offline tokenizers for the long-context tasks, built in memory in well under a
second: a byte-level BPE with 400 tokens trained on a stdlib file and the noise text, and a
character-level one (the same byte alphabet with no merges: one token per ASCII
character). Both add a BOS, as pathattn's tokenizers do."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def make_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pathattn.evaluation.longctx import NOISE

    texts = [(STDLIB / "json" / "encoder.py").read_text(), NOISE * 20,
             "VAR ABCDE = 12345. One of the special magic numbers for calm-otter is: 1234567."]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|eos|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0],
                                   eos_token=specials[1], pad_token=specials[2],
                                   add_bos_token=True)


@pytest.fixture(scope="session")
def bpe():
    return make_tokenizer(400)


@pytest.fixture(scope="session")
def chars():
    tok = make_tokenizer(256 + 3)
    assert len(tok("One of the")["input_ids"]) == 1 + len("One of the")
    return tok


@pytest.fixture(params=["bpe", "chars"])
def tokenizer(request):
    return request.getfixturevalue(request.param)
