"""GSM8K in the PostTrainBench shape, as a task plugin; in progress (docs/tasks.md says how far).

So far the benchmark's own rules, pure and unit-tested: the prompt and chat template the task fixes
(`prompt.py`), answer extraction and exact match as lm-evaluation-harness defines them
(`scoring.py`), and the reported score, a mean over seeds with a bootstrap 95% interval
(`statistics.py`). The task's definition, repos and grader build on them.
"""
