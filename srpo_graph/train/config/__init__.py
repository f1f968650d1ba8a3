"""Trainer stage, config: the run's :class:`~srpo_graph.train.config.schema.TrainConfig`.

Modules: ``schema.py`` (``TrainConfig`` and its sections: every field's unit and range; the
rollout section's backend sections generated from ``backends.BACKENDS``, the strategy's choices
from ``parallel.strategies.STRATEGIES``, the objective's row filling ``loss`` and ``compile``),
``loading.py`` (TOML, ``key=value`` overrides, errors naming the field, the combinations that cannot
train, writing ``config.toml``, the reference table), ``build.py`` (the config from the command
line's pieces, a resumed run's saved config first), ``defaults.py`` (the loss options a backend or
overlapped rollouts set unless the run does: stale samples are corrected by default), ``refusals.py``
(the combinations a run refuses from its configuration, workflow and job size alone, torch-free).
"""
