"""Evaluation of causal language models (pathattn's and any Hugging Face causal LM given by
a folder), the paper's section 4.2 measurements at any scale:

* `pathattn.evaluation.ppl`: perplexity by context length and loss by token position of a
  model on held-out prepared text (the length-extrapolation curve), and
  `pathattn.evaluation.ppl_models`: the model folders that `pathattn eval ppl` checks,
  loads and evaluates;
* `pathattn.evaluation.lmeval`: lm-evaluation-harness on model objects, with local tasks
  for held-out perplexity and the long-context tasks (`pathattn eval lm-eval`);
* `pathattn.evaluation.longctx`: seeded long-context tasks at a target length in tokens
  (needle in a haystack, variable tracking, phone-book lookup) with their scorer
  (`pathattn eval longctx`).

The submodules are imported on use: `from pathattn.evaluation.ppl import evaluate_ppl`.
"""
