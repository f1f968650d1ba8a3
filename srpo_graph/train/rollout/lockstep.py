"""Trainer stage, rollouts: the episodes each training step learns from (the synchronous stage).

The loop asks :class:`Rollouts` for step ``s``'s episodes; it chooses the step's tasks (a seeded
cursor it owns and checkpoints, like a torchtitan dataloader), runs the workflow on the policies' backends
(``runtime.run``: G episodes per task, each
output tagged with the weight version it was sampled at) and hands back the episodes and the
rollout's statistics. Under torchrun every rank samples its share of the tasks and the shares are
gathered on every rank (in-process backends, ``ranks.py``), or rank 0 samples alone and
broadcasts the episodes (servers, fsdp, a rollout worker); either way as JSON lines (never
pickle), so every rank compiles the same batch. With ``rollout.worker``, rank 0's rollout worker
process (``worker/``) samples on its own copies of the policies.

This is the seam where the rollout stage changes shape (every rank sampling its share, rollouts
overlapping the update: ``overlapped.py``, chosen by ``rollout.max_staleness``): the loop only
calls ``Rollouts.get(step)`` and, after each update's sync, ``Rollouts.weights_updated(version)``;
the checkpointer saves ``state_dict()`` and a resumed run puts it back with ``load_state_dict``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from srpo_graph.backends import backend_spec
from srpo_graph.runtime.executor import run as run_episodes
from srpo_graph.runtime.seeds import rollout_seed
from srpo_graph.runtime.trace import Episode
from srpo_graph.train.config.schema import TrainConfig
from srpo_graph.train.parallel.collectives import broadcast_bytes
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.rollout.failures import FailureBudgetExceeded, check_failure_budget
from srpo_graph.train.rollout.ranks import gather_rollout, rank_share, samples_on_every_rank
from srpo_graph.train.rollout.tasks import task_indices
from srpo_graph.train.rollout.worker.client import close_worker, worker_of

_STOP = b"STOP\n"  # rank 0's broadcast when the failure budget stops the run (episode lines start with "{")


def rollout(
    wf,
    tasks,
    slots,
    config,
    seed: int,
    dist: DistInfo,
    samples: int,
    progress: bool = False,
    frozen: dict[str, Any] | None = None,
):
    """Sample ``samples`` episodes of each of ``tasks``: on every rank, each its share of the tasks
    (``ranks.py``), or on rank 0 alone, which broadcasts them. A collective under torchrun.

    Returns:
        The episodes in (task, sample) order (every rank has them) and the executor's statistics
        (every rank's merged when every rank samples; rank 0's, None elsewhere, otherwise).
    Raises:
        FailureBudgetExceeded: on every rank at once, when too many episodes failed.
    """
    on_backend_error = (
        "fail"
        if backend_spec(config.rollout.backend).remote or any(p.external is not None for p in wf.policies)
        else "raise"
    )

    def sample(some_tasks):  # frozen policies sample too, always at version 0 (never synced)
        worker = worker_of(slots)
        if worker is not None:  # rollout.worker: the whole batch in the worker process, on its copies;
            # each output records the version the worker holds (what it was pushed last), which is the
            # truth even when another thread is pushing newer weights right now (overlapped rollouts)
            return worker.run(
                wf,
                some_tasks,
                samples=samples,
                seed=seed,
                policy_versions=None,
                on_backend_error=on_backend_error,
                deadlines=config.rollout.deadlines,
                scheduler=config.rollout.scheduler,
            )
        return run_episodes(
            wf,
            some_tasks,
            {**(frozen or {}), **{s.name: s.backend for s in slots}},
            samples=samples,
            seed=seed,
            policy_versions={**{n: 0 for n in frozen or {}}, **{s.name: s.version for s in slots}},
            progress=progress,
            on_backend_error=on_backend_error,
            deadlines=config.rollout.deadlines,
            scheduler=config.rollout.scheduler,
        )

    if samples_on_every_rank(config, dist):
        share = rank_share(len(tasks), dist.rank, dist.world_size)
        result: Any
        try:
            result = sample([tasks[i] for i in share])
        except Exception as exc:  # sent to every rank, so none waits for this one in the gather
            result = exc
        episodes, stats = gather_rollout(result, share, samples, dist)
        check_failure_budget(stats, config)  # the merged counts: every rank raises together
        return episodes, stats
    data = None
    main_stats = None
    if dist.is_main:
        res = sample(tasks)
        stats = main_stats = res.stats
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
        raise FailureBudgetExceeded(data[len(_STOP) :].decode())
    episodes = [Episode.model_validate_json(line) for line in data.decode().splitlines() if line]
    return episodes, main_stats


@dataclass
class StepRollout:
    """One step's rollout: its episodes (every rank has them), the executor's statistics (merged over
    the sampling ranks; None on the ranks that did not sample), the rollout's wall time in seconds,
    and the stage's own metrics for the step's record (``time/rollout_wait``: seconds the loop waited
    for the batch; ``time/clock``: seconds since the stage started; the overlapped stage adds
    ``async/...``)."""

    episodes: list[Episode]
    stats: Any
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)


class Rollouts:
    """The synchronous rollout stage: step ``s`` samples its tasks with the weights of version ``s - 1``
    (every policy synced after each update), so no output is stale.

    Attributes:
        cursor: batches of tasks consumed from the seeded training order (``tasks.task_indices``).
    """

    def __init__(
        self,
        wf,
        train_tasks: list,
        slots: list,
        config: TrainConfig,
        dist: DistInfo,
        frozen: dict[str, Any] | None = None,
    ) -> None:
        self.wf, self.train_tasks, self.slots, self.config, self.dist, self.frozen = (
            wf,
            train_tasks,
            slots,
            config,
            dist,
            frozen,
        )
        self.cursor = 0
        self._t0 = time.perf_counter()

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps of the stage: its cursor."""
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a checkpoint's :meth:`state_dict`."""
        self.cursor = int(state["cursor"])

    def get(self, step: int) -> StepRollout:
        """Step ``step``'s episodes; advances the cursor by one batch of tasks."""
        r = self.config.rollout
        t0 = time.perf_counter()
        idx = task_indices(len(self.train_tasks), self.cursor, r.tasks_per_step, self.config.seed)
        self.cursor += 1
        episodes, stats = rollout(
            self.wf,
            [self.train_tasks[i] for i in idx],
            self.slots,
            self.config,
            rollout_seed(self.config.seed, step),
            self.dist,
            r.samples,
            frozen=self.frozen,
        )
        seconds = time.perf_counter() - t0
        return StepRollout(
            episodes, stats, seconds, {"time/rollout_wait": seconds, "time/clock": time.perf_counter() - self._t0}
        )

    def weights_updated(self, version: int) -> None:
        """Every policy's weights now have ``version`` (synced to the backends)."""

    def close(self) -> None:
        """Stop whatever the stage runs in the background (synchronously: the rollout worker, if any)."""
        close_worker(self.slots)
