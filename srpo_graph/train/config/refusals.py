"""Trainer stage, config: the combinations of options a run refuses, decided from the configuration,
the workflow and the size of the job alone (docs/combinations.md).

Each check raises a :class:`~srpo_graph.errors.ConfigError` naming the field and the fix. They run
where the run starts (``Trainer``, the rollout stage) and, for a job of several processes, once in
the launcher of ``srpo-graph train --nproc N`` before torchrun starts the ranks (each rank would
print its own copy of the error). That launcher never runs a model, so this module imports no torch
(Note [A table without torch] in ``train/parallel/strategies.py``; ``tests/e2e/test_train_cli.py``).
Whether every rank samples (``rollout.every_rank``, ``train/rollout/ranks.py``) is decided, and
refused, there.
"""

from __future__ import annotations

from srpo_graph.backends import backend_spec
from srpo_graph.errors import ConfigError
from srpo_graph.train.config.defaults import check_staleness_corrected
from srpo_graph.train.config.schema import TrainConfig
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.workflow import Workflow


def check_async(config: TrainConfig, dist: DistInfo | None = None) -> None:
    """Refuse ``rollout.max_staleness >= 1`` where it cannot run yet.

    Raises:
        ConfigError: an in-process backend (it samples from the very model being updated), or
            torchrun (rank 0 broadcasts each batch in step order; not built for overlap yet).
            The transformers backend is accepted with ``rollout.worker = true``. Stale samples with
            ``loss.mismatch = none`` (``config/defaults.py``: overlapped rollouts default to ``decoupled``).
    """
    k = config.rollout.max_staleness
    if config.rollout.partial_rollouts and (k == 0 or config.rollout.backend != "sglang"):
        raise ConfigError.at("field `rollout.partial_rollouts`", "partial rollouts pause and resume SGLang requests "
                             "in flight across a weight sync: they need rollout.backend=sglang and "
                             "rollout.max_staleness >= 1", fix="set both, or rollout.partial_rollouts=false")
    if k == 0:
        return
    check_staleness_corrected(config.loss.mismatch, k)
    if backend_spec(config.rollout.backend).in_process and not config.rollout.worker:
        raise ConfigError.at("field `rollout.max_staleness`", f"overlapped rollouts (max_staleness={k}) need a "
                             f"server backend or a rollout worker; `{config.rollout.backend}` samples from the model "
                             "being updated in this process",
                             fix="rollout.worker=true (sampling in a process of its own), rollout.backend=sglang, "
                             "or rollout.max_staleness=0")
    if dist is not None and dist.enabled:
        what = " and partial rollouts" if config.rollout.partial_rollouts else ""
        raise ConfigError.at("field `rollout.max_staleness`", f"overlapped rollouts (max_staleness={k}){what} are not "
                             f"supported under torchrun yet ({dist.world_size} processes: --nproc or torchrun)",
                             fix="run one process, or use rollout.max_staleness=0")


def check_strategy(wf: Workflow, config: TrainConfig, world_size: int) -> None:
    """Refuse LoRA adapter policies under ``strategy = "fsdp"`` with several processes (also called by
    ``train --nproc`` before torchrun starts the ranks).

    Raises:
        ConfigError: naming the strategy, the adapters and the fix.
    """
    if config.strategy == "fsdp" and world_size > 1 and any(p.adapter is not None for p in wf.policies):
        names = [p.name for p in wf.policies if p.adapter is not None]
        raise ConfigError.at(
            "field `strategy`",
            f"LoRA adapter policies ({', '.join(names)}) do not run under fsdp",
            why="the adapters are small and replicated; the frozen base is shared",
            fix='use strategy = "ddp" (the default)',
        )


__all__ = ["check_async", "check_strategy"]
