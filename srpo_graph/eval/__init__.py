"""Scoring stage: episodes -> Avg@k, Pass@k and their intervals, paired comparisons (no torch).

Consumes a checked workflow, its episodes (``runtime``'s traces) and the tasks they ran; produces
an :class:`~srpo_graph.eval.score.EvalReport` per source and :class:`~srpo_graph.eval.score.Comparison`
of two. Modules: ``score.py`` (Avg@k, the unbiased Pass@k estimator, bootstrap intervals over
problems, per task family / route / answering agent, paired differences with a sign-flip test).
Used by ``srpo-graph eval`` (``train/eval_command.py``), the trainer's ``eval.every``
(``train/observe/evaluator.py``) and ``benchmarks/study.py``; it imports no model code.
"""
