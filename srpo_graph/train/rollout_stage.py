"""Trainer stage, rollouts: the episodes each training step learns from.

The loop asks :class:`Rollouts` for step ``s``'s episodes; it chooses the step's tasks (a seeded
cursor), runs the workflow on the policies' backends (``runtime.run``: G episodes per task, each
output tagged with the weight version it was sampled at) and hands back the episodes and the
rollout's statistics. Today one process samples: rank 0 under torchrun, which broadcasts the
episodes as JSON lines (never pickle) so every rank compiles the same batch -- or, with
``rollout.worker``, rank 0's rollout worker process (``rollout_worker.py``) on its own copies.

This is the seam where the rollout stage changes shape (every rank sampling its share, rollouts
overlapping the update): the loop only calls ``Rollouts.get(step, state)`` and, after each update,
``Rollouts.weights_updated(version)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from srpo_graph.backends import backend_spec
from srpo_graph.runtime.executor import run as run_episodes
from srpo_graph.runtime.trace import Episode
from srpo_graph.train.config import TrainConfig
from srpo_graph.train.data import task_indices
from srpo_graph.train.distributed import DistInfo, broadcast_bytes
from srpo_graph.train.rollout_worker import close_worker, worker_of
from srpo_graph.train.stops import FailureBudgetExceeded, check_failure_budget

_STOP = b"STOP\n"  # rank 0's broadcast when the failure budget stops the run (episode lines start with "{")


def rollout(wf, tasks, slots, config, seed: int, dist: DistInfo, samples: int, progress: bool = False,
             frozen: dict[str, Any] | None = None):
    data = None
    stats = None
    if dist.is_main:  # frozen policies sample too, always at version 0 (never synced)
        on_backend_error = "fail" if backend_spec(config.rollout.backend).remote \
            or any(p.external is not None for p in wf.policies) else "raise"
        worker = worker_of(slots)
        if worker is not None:  # rollout.worker: the whole batch in the worker process, on its copies;
            # each output records the version the worker holds (what it was pushed last), which is the
            # truth even when another thread is pushing newer weights right now (overlapped rollouts)
            res = worker.run(wf, tasks, samples=samples, seed=seed, policy_versions=None,
                             on_backend_error=on_backend_error, deadlines=config.rollout.deadlines,
                             scheduler=config.rollout.scheduler)
        else:
            res = run_episodes(wf, tasks, {**(frozen or {}), **{s.name: s.backend for s in slots}}, samples=samples,
                               seed=seed, policy_versions={**{n: 0 for n in frozen or {}}, **{s.name: s.version for s in slots}},
                               progress=progress, on_backend_error=on_backend_error,
                               deadlines=config.rollout.deadlines, scheduler=config.rollout.scheduler)
        stats = res.stats
        try:
            check_failure_budget(stats, config)  # every failure class counts: stop clearly past the budget
        except FailureBudgetExceeded as exc:
            if not dist.enabled:
                raise
            data = _STOP + exc.args[0].encode()  # every rank stops with it (none waits in a collective)
        if not dist.enabled:  # one process: the episodes as they are (compile validates them once)
            return list(res.episodes), stats
        if data is None:
            data = "\n".join(ep.to_json() for ep in res.episodes).encode()
    data = broadcast_bytes(data, dist)
    if data.startswith(_STOP):
        raise FailureBudgetExceeded(data[len(_STOP):].decode())
    episodes = [Episode.model_validate_json(line) for line in data.decode().splitlines() if line]
    return episodes, stats


@dataclass
class StepRollout:
    """One step's rollout: its episodes (every rank has them), the executor's statistics (the sampling
    rank's; None elsewhere) and the rollout's wall time in seconds."""

    episodes: list[Episode]
    stats: Any
    seconds: float


class Rollouts:
    """The synchronous rollout stage: step ``s`` samples its tasks with the weights of version ``s - 1``
    (every policy synced after each update), so no output is stale."""

    def __init__(self, wf, train_tasks: list, slots: list, config: TrainConfig, dist: DistInfo,
                 frozen: dict[str, Any] | None = None) -> None:
        self.wf, self.train_tasks, self.slots, self.config, self.dist, self.frozen = \
            wf, train_tasks, slots, config, dist, frozen

    def get(self, step: int, state) -> StepRollout:
        """Step ``step``'s episodes; advances ``state.cursor`` (batches of tasks consumed) by one."""
        r = self.config.rollout
        t0 = time.perf_counter()
        idx = task_indices(len(self.train_tasks), state.cursor, r.tasks_per_step, self.config.seed)
        state.cursor += 1
        episodes, stats = rollout(self.wf, [self.train_tasks[i] for i in idx], self.slots, self.config,
                                  self.config.seed * 1_000_003 + step, self.dist, r.samples, frozen=self.frozen)
        return StepRollout(episodes, stats, time.perf_counter() - t0)

    def weights_updated(self, version: int) -> None:
        """Every policy's weights now have ``version`` (synced to the backends)."""

    def close(self) -> None:
        """Stop whatever the stage runs in the background (synchronously: the rollout worker, if any)."""
        close_worker(self.slots)
