"""Trainer stage, observing (stage 4 of the loop): what each step did, to every sink.

Modules: ``record.py`` (``StepRecord``, the typed record of a step, and how it becomes metric
names), ``observer.py`` (the sinks: metrics, traces, plots, progress, failure report),
``evaluator.py`` (the held-out evaluation every ``eval.every`` steps), ``metrics.py``
(``metrics.jsonl`` and TensorBoard), ``transitions.py`` (per-transition rewards and route
statistics), ``mismatch.py`` (the sampler/trainer log-prob gap), ``failures.py`` (failed episodes
per kind, reported once), ``progress.py`` (the progress line), ``plots.py``, ``wandb_sink.py``
(Weights & Biases, an optional extra).
"""
