"""Trainer stage, rollouts on every rank: each rank of a torchrun job samples its share of a step's
tasks on its own in-process backend, and every rank ends up with the same list of episodes.

Consumes the step's task list, the rank (``DistInfo``) and this rank's :class:`RunResult`;
produces the whole step's episodes in (task, sample) order and the merged :class:`RunStats`, the
same on every rank. The rollout stage (``lockstep.rollout``) calls it when
:func:`samples_on_every_rank` says so.

* **Shares are whole groups.** Rank ``r`` of ``W`` samples the contiguous tasks
  :func:`rank_share` gives it (all ``G`` samples of each), so a group's advantage never needs
  episodes from two ranks and the split is uneven by at most one task.
* **Independent of the number of ranks.** Every request's seed derives from (run seed, task id,
  sample, output index) (``runtime.seeds.derive_seed`` / ``output_seed``) and the transformers
  backend draws each request from its own generator, so an episode is the same whichever rank
  samples it, beside whichever others.
* **JSON over the process group, never pickle.** Each rank's share travels as JSON lines (a
  header with its first task and its statistics, then one episode per line) through
  :func:`~srpo_graph.train.parallel.collectives.all_gather_bytes`, whose deadline is ``dist_timeout``.
* **Every rank stops together.** The statistics are merged (:func:`merge_stats`) before the
  failure budget is checked, so every rank sees the same counts and raises the same
  ``FailureBudgetExceeded``; a rank whose sampling raised sends its error instead of episodes,
  and every rank raises it (naming that rank), so none waits in a collective for a rank that left.

Not used (rank 0 samples alone and broadcasts, as before) for server backends -- one server
batches every request, so more client ranks add nothing -- and under ``strategy = "fsdp"``,
whose ranks hold only shards (rank 0's unsharded replica is the one model to sample from).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from srpo_graph.backends import backend_spec
from srpo_graph.errors import BackendError, ConfigError, RuntimeFailure
from srpo_graph.runtime.executor import RunResult, RunStats
from srpo_graph.runtime.trace import Episode
from srpo_graph.train.parallel.job import DistInfo


def samples_on_every_rank(config: Any, dist: DistInfo) -> bool:
    """Whether every rank samples its share of the step's tasks (``rollout.every_rank``).

    ``auto``: yes under torchrun with an in-process backend (``transformers``), ``strategy = "ddp"``
    and no rollout worker; ``false``: rank 0 alone; ``true``: yes, refused where it cannot work.

    Raises:
        ConfigError: ``every_rank = true`` with a server backend, ``strategy = "fsdp"`` or a rollout worker.
    """
    choice = config.rollout.every_rank
    if choice is False or not dist.enabled:
        return False
    if getattr(config.rollout, "worker", False):  # rank 0's rollout worker samples every task
        if choice is True:
            raise ConfigError.at(
                "field `rollout.every_rank`",
                "with rollout.worker = true, rank 0's rollout worker process samples every task",
                fix='rollout.every_rank = "auto" (or rollout.worker = false)',
            )
        return False
    in_process = backend_spec(config.rollout.backend).in_process
    if choice == "auto":
        return in_process and config.strategy != "fsdp"
    if not in_process:
        raise ConfigError.at(
            "field `rollout.every_rank`",
            f"rollout backend {config.rollout.backend!r} is a server: rank 0 alone sends it requests",
            why="one server batches every request, so more client ranks sample no faster",
            fix='rollout.every_rank = "auto" (or use the transformers backend)',
        )
    if config.strategy == "fsdp":
        raise ConfigError.at(
            "field `rollout.every_rank`",
            'strategy = "fsdp" samples on rank 0 only',
            why="the other ranks hold only shards of each policy; rank 0's unsharded replica is the "
            "one model to sample from",
            fix='rollout.every_rank = "auto" (or strategy = "ddp")',
        )
    return True


def rank_share(num_tasks: int, rank: int, world_size: int) -> range:
    """The contiguous tasks (indices into the step's list) ``rank`` samples: whole tasks, balanced
    to within one, in rank order.

    >>> [list(rank_share(3, r, 2)) for r in range(2)]
    [[0], [1, 2]]
    >>> [list(rank_share(1, r, 3)) for r in range(3)]
    [[], [], [0]]
    """
    return range(rank * num_tasks // world_size, (rank + 1) * num_tasks // world_size)


def merge_stats(parts: Sequence[RunStats]) -> RunStats:
    """The statistics of one run made of ``parts`` (in task order): counts add up, the mean reward is
    weighted by episodes, the wall time is the slowest part's, each first error is the first part's
    that has one (the first in task order, as one process reports it).

    >>> a = RunStats(episodes=2, mean_reward=1.0, tokens_generated=3, seconds=1.0, failures=1, truncated=0,
    ...              failed_by_kind={"tool": 1}, first_failure={"tool": "x"})
    >>> b = RunStats(episodes=6, mean_reward=0.0, tokens_generated=5, seconds=2.0, failures=0, truncated=1)
    >>> m = merge_stats([a, b]); (m.episodes, m.mean_reward, m.tokens_generated, m.seconds, m.failed_by_kind)
    (8, 0.25, 8, 2.0, {'tool': 1})
    """
    episodes = sum(p.episodes for p in parts)
    by_kind: dict[str, int] = {}
    first: dict[str, str] = {}
    for p in parts:
        for kind, n in p.failed_by_kind.items():
            by_kind[kind] = by_kind.get(kind, 0) + n
        for kind, msg in p.first_failure.items():
            first.setdefault(kind, msg)
    return RunStats(
        episodes=episodes,
        mean_reward=sum(p.mean_reward * p.episodes for p in parts) / episodes if episodes else 0.0,
        tokens_generated=sum(p.tokens_generated for p in parts),
        seconds=max((p.seconds for p in parts), default=0.0),
        failures=sum(p.failures for p in parts),
        truncated=sum(p.truncated for p in parts),
        generate_calls=sum(p.generate_calls for p in parts),
        backend_failures=sum(p.backend_failures for p in parts),
        backend_error=next((p.backend_error for p in parts if p.backend_error is not None), None),
        stale_outputs=sum(p.stale_outputs for p in parts),
        failed_by_kind=dict(sorted(by_kind.items())),
        first_failure=dict(sorted(first.items())),
    )


_RAISED = {"BackendError": BackendError, "ConfigError": ConfigError}  # else RuntimeFailure


def gather_rollout(
    result: RunResult | BaseException, share: range, samples: int, dist: DistInfo
) -> tuple[list[Episode], RunStats]:
    """Every rank's share of the step, put together on every rank. A collective: every rank calls it.

    Args:
        result: this rank's run of its ``share`` of the tasks, or the exception its sampling raised.
        share: this rank's tasks (:func:`rank_share`).
        samples: G, episodes per task.
    Returns:
        The episodes in (task index, sample) order and the merged statistics -- the same on every rank.
    Raises:
        The exception this rank's sampling raised; on the other ranks an error of the same kind
        (BackendError, ConfigError, else RuntimeFailure) naming the rank it came from.
    """
    if not isinstance(result, BaseException) and len(result.episodes) != len(share) * samples:
        result = RuntimeFailure(
            f"rank {dist.rank} sampled {len(result.episodes)} episodes for {len(share)} tasks x {samples} samples"
        )  # sent like any error: no rank waits for this one
    if isinstance(result, BaseException):
        head: dict[str, Any] = {
            "rank": dist.rank,
            "error": {"type": type(result).__name__, "message": str(result).strip() or repr(result)},
        }
        lines = [json.dumps(head)]
    else:
        head = {"rank": dist.rank, "start": share.start, "stats": result.stats.model_dump(mode="json")}
        lines = [json.dumps(head), *(ep.to_json() for ep in result.episodes)]
    # (imported here: the launcher of `--nproc` asks samples_on_every_rank without torch, refusals.py)
    from srpo_graph.train.parallel.collectives import all_gather_bytes

    parts = [blob.decode().split("\n") for blob in all_gather_bytes("\n".join(lines).encode(), dist)]
    heads = [json.loads(p[0]) for p in parts]
    for h in heads:  # the lowest failing rank's error, on every rank
        if "error" in h:
            if isinstance(result, BaseException):
                raise result
            cls = _RAISED.get(h["error"]["type"], RuntimeFailure)
            raise cls(f"rank {h['rank']}'s rollout failed: {h['error']['message']}")
    keyed: list[tuple[tuple[int, int], Episode]] = []
    for h, p in zip(heads, parts):
        for i, line in enumerate(x for x in p[1:] if x):
            ep = Episode.model_validate_json(line)
            keyed.append(((h["start"] + i // samples, ep.sample), ep))  # the executor's order: task-major
    keyed.sort(key=lambda kv: kv[0])
    return [ep for _, ep in keyed], merge_stats([RunStats.model_validate(h["stats"]) for h in heads])


__all__ = ["gather_rollout", "merge_stats", "rank_share", "samples_on_every_rank"]
