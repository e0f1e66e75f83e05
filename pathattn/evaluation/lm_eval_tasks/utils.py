"""`process_results` of pathattn's lm-eval tasks (copied next to the generated YAML files,
where lm-eval's `!function utils.NAME` looks for it)."""

from __future__ import annotations

import re


def process_ppl(doc: dict, results: list) -> dict:
    """Per document: (log-likelihood, count) for the perplexities over tokens (the record's
    num_tokens), words (whitespace-separated, as lm-eval counts them) and UTF-8 bytes."""
    (loglikelihood,) = results
    text = doc["text"]
    size = len(text.encode("utf-8"))
    return {"token_perplexity": (loglikelihood, doc["num_tokens"]),
            "word_perplexity": (loglikelihood, len(re.split(r"\s+", text))),
            "byte_perplexity": (loglikelihood, size),
            "bits_per_byte": (loglikelihood, size)}


def process_longctx(doc: dict, results: list) -> dict:
    """The fraction of the expected answers found in the generated text."""
    from pathattn.evaluation.longctx import score

    return {"score": score(results[0], doc["answers"])}
