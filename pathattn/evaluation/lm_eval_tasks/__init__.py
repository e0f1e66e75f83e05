"""lm-evaluation-harness task templates of pathattn (package data): `ppl.yaml` (held-out
perplexity of a prepared corpus), `longctx.yaml` (a long-context task at one length) and
`utils.py` (their `process_results`). `pathattn.evaluation.lmeval.write_ppl_task` and
`write_longctx_tasks` fill the templates with the paths of the generated data and write
them, with utils.py, into a task folder for lm-eval's include path."""
