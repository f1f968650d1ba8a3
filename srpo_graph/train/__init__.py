"""Trainer stage: ``srpo_graph.train(workflow, config)``, the RL loop, as packages in pipeline order.

Consumes a ``.wf`` workflow and a :class:`~srpo_graph.train.config.schema.TrainConfig`; produces a
run folder. The loop is ``trainer.py``'s :class:`~srpo_graph.train.trainer.Trainer`: rollout ->
compile + update -> sync -> evaluate/log -> checkpoint. Its parts, each importing only the ones
before it (``tests/test_layers.py``)::

    parallel/    process groups, collectives, DDP/FSDP strategies, torchrun launch, placement
    config/      TrainConfig: schema, loading, the command line's config
    checkpoint/  the layout, the full and DCP formats, the Checkpointer
    policies/    trained (full, LoRA, sharded), frozen and external policies
    rollout/     stage 1: task order, lockstep and overlapped rollouts, gates, ranks, backends, worker/
    learn/       stage 2: compile + update
    sync.py      stage 3: the new weights to every backend
    observe/     stage 4: step records, metrics, evaluation, progress, plots
    stops.py, run_folder.py    how a run stops and resumes; who owns the run folder
    trainer.py, eval_command.py, commands.py, __main__.py    the loop, ``eval``, the CLI, torchrun's entry

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
