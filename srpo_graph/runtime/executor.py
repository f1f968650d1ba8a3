"""Run a workflow on tasks: ``run``, the runtime stage's one entry point.

Runtime stage. Consumes a checked :class:`~srpo_graph.workflow.Workflow`, tasks and one
:class:`~srpo_graph.backends.base.Backend` per policy; produces :class:`RunResult` (trace
:class:`~srpo_graph.runtime.trace.Episode` objects and run statistics). It sets the run up --
one :class:`~srpo_graph.runtime.episode.EpisodeRun` per (task, sample), the agents' sampling
plans, the user-code deadlines -- and hands the episodes to one of two schedulers:

* lockstep (``lockstep.py``): every live episode's pending agents make one batch per round,
  the in-process default (one batched forward);
* streaming (``streaming.py``): each episode advances as soon as its own outputs return, for
  servers that batch continuously.

Both build their requests and take their answers through ``requests.py``. Every request
carries a seed derived from (run seed, task, sample, output index) -- the episode seed by
``seeds.derive_seed``, then ``seeds.output_seed`` per output --, and the transformers backend
draws each request from its own generator, so results do not depend on how episodes happened
to be batched: a run is reproducible with any ``max_concurrent`` and either scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from pydantic import BaseModel

from srpo_graph.backends.base import Backend
from srpo_graph.errors import RuntimeFailure
from srpo_graph.runtime.episode import Callables, EpisodeRun
from srpo_graph.runtime.lockstep import run_lockstep
from srpo_graph.runtime.prompts import plan_agents
from srpo_graph.runtime.seeds import derive_seed
from srpo_graph.runtime.streaming import prefers_streaming, stream
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.trace import Episode, WorkflowRef
from srpo_graph.runtime.usercode import Deadlines
from srpo_graph.workflow import Workflow


class RunStats(BaseModel):
    """Summary of a run."""

    episodes: int
    mean_reward: float
    tokens_generated: int
    seconds: float
    failures: int
    truncated: int
    generate_calls: int = 0  # backend.generate calls (batches)
    backend_failures: int = 0  # episodes failed because their request failed (on_backend_error="fail")
    backend_error: str | None = None  # the first such error
    stale_outputs: int = 0  # outputs whose engine reported another weight version than expected
    # failed episodes per class (usercode.FAILURE_KINDS: backend, tool, extractor, reward, prompt,
    # timeout, workflow) and the first error of each, with its .wf location
    failed_by_kind: dict[str, int] = {}
    first_failure: dict[str, str] = {}

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.seconds if self.seconds > 0 else 0.0


@dataclass
class RunResult:
    """Episodes in (task, sample) order, and the run's statistics."""

    episodes: list[Episode]
    stats: RunStats


def run(
    workflow: Workflow,
    tasks: Sequence[Task],
    backends: Mapping[str, Backend],
    *,
    samples: int,
    seed: int = 0,
    policy_versions: Mapping[str, int] | None = None,
    progress: bool = False,
    max_concurrent: int | None = None,
    tool_workers: int = 8,
    on_episode: Callable[[Episode], None] | None = None,
    on_backend_error: str = "raise",
    deadlines: Deadlines | None = None,
    scheduler: str = "auto",
) -> RunResult:
    """Run every task ``samples`` times (a group per task).

    Args:
        workflow: a checked workflow.
        tasks: the tasks (see :func:`~srpo_graph.runtime.tasks.load_tasks`).
        backends: policy name -> backend, for every policy of the workflow.
        samples: G, episodes per task (``sample`` 0..G-1, ``group_id`` = ``"<task id>@<seed>"``).
        seed: the run seed (per-request seeds derive from it).
        policy_versions: the weight version recorded per policy (default: the backend's).
        progress: show a progress bar (rich).
        max_concurrent: most episodes alive at once (default: all).
        tool_workers: ignored (kept for callers): every tool job runs in its own daemon thread,
            so a hanging tool neither blocks the others nor the process's exit.
        on_episode: called with each episode as soon as it is over (in the order they finish),
            e.g. to stream it to disk, so a run that dies later keeps what it finished.
        on_backend_error: ``"raise"`` stops the run at the first backend failure; ``"fail"``
            fails the episodes whose requests failed (status ``failed``, the error recorded,
            counted in ``stats.backend_failures``) and runs the others on -- a server that
            dies mid-rollout under training, which then applies its failure budget.
        deadlines: seconds per user call (tool, reward, extractor); past it the episode fails
            (kind ``timeout``). Default: :class:`~srpo_graph.runtime.usercode.Deadlines`.
        scheduler: ``"lockstep"`` (one batch of every live episode's pending agents per round),
            ``"streaming"`` (each episode advances as soon as its own outputs return, requests in
            flight up to each backend's ``concurrency``; ``runtime/streaming.py``) or ``"auto"``:
            streaming when every backend is a server (SGLang, an external endpoint), lockstep
            otherwise. The same seeds give the same traces under both wherever the backend is
            deterministic; failures, their kinds and the user-code deadlines are the same.
    Returns:
        The episodes (task-major) and statistics.
    Raises:
        RuntimeFailure: a policy without a backend, or an ``allow`` token the tokenizer lacks.
        BackendError: the backend failed and ``on_backend_error="raise"`` (episodes finished
            before went to ``on_episode``).
    """
    if samples < 1:
        raise RuntimeFailure(f"samples must be >= 1, got {samples}")
    missing = [p.name for p in workflow.policies if p.name not in backends]
    if missing:
        raise RuntimeFailure(f"no backend for policies {missing} of workflow {workflow.name!r}")
    plans = plan_agents(workflow, backends)
    callables = Callables(workflow, deadlines)
    tool_seconds = callables.deadlines.tool
    versions = dict(policy_versions or {})
    ref = WorkflowRef(name=workflow.name, hash=workflow.source_hash)
    runs = [
        EpisodeRun(workflow, callables, t.id, t.fields, f"{t.id}@{seed}", s, derive_seed(seed, t.id, s))
        for t in tasks for s in range(samples)
    ]
    finished: list[Episode | None] = [None] * len(runs)
    limit = max_concurrent or len(runs)
    started = time.perf_counter()
    if on_backend_error not in ("raise", "fail"):
        raise RuntimeFailure(f"on_backend_error must be 'raise' or 'fail', got {on_backend_error!r}")
    if scheduler not in ("auto", "lockstep", "streaming"):
        raise RuntimeFailure(f"scheduler must be 'auto', 'lockstep' or 'streaming', got {scheduler!r}")
    stats: dict = {"tokens": 0, "calls": 0, "backend_failures": 0, "backend_error": None, "stale": 0,
                   "on_backend_error": on_backend_error}
    bar = _Progress(len(runs)) if progress else None
    streaming = scheduler == "streaming" or (scheduler == "auto" and prefers_streaming(backends))
    schedule = stream if streaming else run_lockstep
    try:
        schedule(runs, limit=limit, plans=plans, backends=backends, versions=versions, stats=stats, ref=ref,
                 finished=finished, on_episode=on_episode, bar=bar, tool_seconds=tool_seconds)
    finally:
        if bar is not None:
            bar.close()
    return _result(runs, finished, stats, started)


def _result(runs: Sequence[EpisodeRun], finished: list[Episode | None], stats: dict, started: float) -> RunResult:
    episodes: list[Episode] = finished  # type: ignore[assignment]  # every slot is filled by now
    seconds = time.perf_counter() - started
    by_kind: dict[str, int] = {}
    first: dict[str, str] = {}
    for ep in runs:
        if ep.status == "failed":
            kind = ep.failure_kind or "workflow"
            by_kind[kind] = by_kind.get(kind, 0) + 1
            first.setdefault(kind, ep.error or "")
    return RunResult(episodes, RunStats(
        episodes=len(episodes),
        mean_reward=sum(e.reward for e in episodes) / len(episodes) if episodes else 0.0,
        tokens_generated=stats["tokens"], seconds=seconds,
        failures=sum(e.status == "failed" for e in episodes),
        truncated=sum(e.status == "truncated" for e in episodes),
        generate_calls=stats["calls"], backend_failures=stats["backend_failures"],
        backend_error=stats["backend_error"], stale_outputs=stats["stale"],
        failed_by_kind=by_kind, first_failure=first,
    ))


class _Progress:
    """A rich progress bar over episodes (only created when asked for)."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           transient=False)
        self._p.start()
        self._task = self._p.add_task("run", total=total)

    def advance(self, n: int) -> None:
        if n:
            self._p.advance(self._task, n)

    def close(self) -> None:
        self._p.stop()


__all__ = ["RunResult", "RunStats", "run"]
