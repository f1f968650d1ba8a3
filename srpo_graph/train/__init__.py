"""Trainer stage: config, the RL loop, checkpoints, metrics, plots and data-parallel launch.

Consumes a ``.wf`` workflow and a :class:`~srpo_graph.train.config.loading.TrainConfig`; produces a run
folder. Modules: ``config`` (TrainConfig, TOML, overrides), ``data`` (task files, task order,
workflow overrides), ``update`` (epochs x mini-batches x micro-batches on a SetBatch),
``trainer`` (``train``), ``checkpoint``, ``metrics``, ``plots``, ``progress``, ``distributed``,
``commands`` (``srpo-graph train``) and ``__main__`` (``torchrun -m srpo_graph.train``).
Heavy modules are not imported here, so ``import srpo_graph.train`` stays cheap.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _TrainModule(types.ModuleType):
    """``srpo_graph.train`` is both this package and the public verb ``srpo_graph.train(...)``.

    Importing any ``srpo_graph.train.*`` module binds the package to the attribute ``train`` of
    ``srpo_graph``, over the lazily exported function, so the package itself forwards a call to
    :func:`srpo_graph.train.trainer.train` (a module may change its ``__class__``, PEP 549's
    documented alternative). ``srpo_graph.train(path, config)`` therefore works whatever was
    imported before.
    """

    def __call__(self, *args: Any, **kw: Any) -> Any:
        from srpo_graph.train.trainer import train

        return train(*args, **kw)


sys.modules[__name__].__class__ = _TrainModule
