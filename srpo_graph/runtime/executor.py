"""Run a workflow on tasks: many episodes at once, one big generation batch per round (lockstep)
or each episode on its own as its answers return (streaming, ``runtime/streaming.py``).

Runtime stage. Consumes a checked :class:`~srpo_graph.workflow.Workflow`, tasks and one
:class:`~srpo_graph.backends.base.Backend` per policy; produces :class:`RunResult` (trace
:class:`~srpo_graph.runtime.trace.Episode` objects and run statistics).

The loop, one round at a time:

1. every live episode fires what is ready (``EpisodeRun.advance``); a firing with tools is
   submitted to a thread pool and that episode waits, the others go on;
2. the pending agents of **all** episodes become one batch of requests per backend (policies
   sharing a backend object share the batch), rendered and tokenized once, sampled in one call;
3. outputs go back to their episodes; finished tool jobs are applied; when nothing can be
   generated the loop waits for the first tool to finish.

Every request carries a seed derived from (run seed, task, sample, output index) -- the
episode seed by :func:`derive_seed`, then :func:`output_seed` per output --, and the
transformers backend draws each request from its own generator, so results do not depend on
how episodes happened to be batched: a run is reproducible with any ``max_concurrent``.
"""

from __future__ import annotations

import hashlib
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pydantic import BaseModel

from srpo_graph.backends.base import Backend, Completion, GenerationRequest
from srpo_graph.errors import BackendError, RuntimeFailure, SrpoGraphError
from srpo_graph.runtime.chat import chat_prompt
from srpo_graph.runtime.episode import Callables, EpisodeRun, Sampled, ToolJob, at_node
from srpo_graph.runtime.prompts import AgentPlan, plan_agents, trim_at_stop
from srpo_graph.runtime.render import render
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.trace import LOGPROB_TOL, Episode, WorkflowRef
from srpo_graph.runtime.usercode import Deadlines, start
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


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (same parts, same seed, on every machine).

    >>> derive_seed(0, "task-1", 3) == derive_seed(0, "task-1", 3) != derive_seed(0, "task-1", 4)
    True
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


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
    if scheduler == "streaming" or (scheduler == "auto" and _prefers_streaming(backends)):
        from srpo_graph.runtime.streaming import stream

        try:
            stream(runs, limit=limit, plans=plans, backends=backends, versions=versions, stats=stats, ref=ref,
                   finished=finished, on_episode=on_episode, bar=bar, tool_seconds=tool_seconds)
        finally:
            if bar is not None:
                bar.close()
        return _result(runs, finished, stats, started)
    # tool jobs run in daemon threads (usercode.start): never joined, so a hanging tool fails its
    # episode at its deadline, and one Ctrl-C / SIGTERM stops the run at once (the waits below
    # are interruptible); a ThreadPoolExecutor would join it on the way out
    futures: dict[Future, tuple[EpisodeRun, ToolJob]] = {}

    def step(ep: EpisodeRun) -> None:
        job = ep.advance()
        if job is not None:
            futures[start(job, name="srpo-tool")] = (ep, job)

    try:
        admitted = 0
        live: list[tuple[int, EpisodeRun]] = []
        while admitted < len(runs) or live:
            while admitted < len(runs) and len(live) < limit:
                live.append((admitted, runs[admitted]))
                step(runs[admitted])
                admitted += 1
            now = time.monotonic()
            for fut in [f for f in futures if f.done() or futures[f][1].overdue.late(tool_seconds, now)]:
                ep, job = futures.pop(fut)
                if fut.done():
                    ep.tool_done(fut.result() if fut.exception() is None else None, fut.exception())
                else:  # past its deadline: the thread is abandoned, the episode fails naming the tool
                    ep.tool_done(None, job.timeout(tool_seconds))
                step(ep)
            work = [(ep, a) for _, ep in live for a in ep.wants_generation()]
            if work:
                _generate_round(work, plans, backends, versions, stats)
                for ep in {id(ep): ep for ep, _ in work}.values():
                    step(ep)
            elif futures:
                now = time.monotonic()
                soonest = min(job.overdue.remaining(tool_seconds, now) for _, job in futures.values())
                wait(list(futures), timeout=soonest + 0.001, return_when=FIRST_COMPLETED)
            still = []
            for i, ep in live:
                if not ep.done:
                    still.append((i, ep))
                    continue
                finished[i] = episode = ep.to_episode(ref)
                if on_episode is not None:
                    on_episode(episode)
            if bar is not None:
                bar.advance(len(live) - len(still))
            live = still
    finally:
        if bar is not None:
            bar.close()
    return _result(runs, finished, stats, started)


def _prefers_streaming(backends: Mapping[str, Backend]) -> bool:
    from srpo_graph.runtime.streaming import prefers_streaming

    return prefers_streaming(backends)


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


def _generate_round(work: list[tuple[EpisodeRun, str]], plans: Mapping[str, AgentPlan],
                    backends: Mapping[str, Backend], versions: Mapping[str, int], stats: dict) -> None:
    """Render, tokenize and sample every pending agent of every episode; hand outputs back.

    The per-output work is kept small: prompts are tokenized in one call per agent (and each
    distinct text once), completions decoded through a cache, one record built per output.
    """
    batches, order = _requests(work, plans, backends)
    answers = []
    for items in batches.values():
        backend = backends[items[0][1].agent.policy]
        completions, errors = _sample(backend, items, stats["on_backend_error"])
        stats["calls"] += 1
        answers.append((items, completions, errors, backend, _vocab_size(backend)))  # vocab once per batch
    if len(answers) == 1:
        _hand_back(*answers[0][:4], versions, stats, answers[0][4])
        return
    at = {key: i for i, key in enumerate(batches)}  # several backends: hand back in request order
    for key, j in order:
        items, completions, errors, backend, vocab = answers[at[key]]
        _hand_back(items[j:j + 1], completions[j:j + 1], errors[j:j + 1], backend, versions, stats, vocab)


Item = tuple[EpisodeRun, AgentPlan, GenerationRequest]


def _requests(work: list[tuple[EpisodeRun, str]], plans: Mapping[str, AgentPlan],
              backends: Mapping[str, Backend]) -> tuple[dict[int, list[Item]], list[tuple[int, int]]]:
    """The requests of ``work`` (episode, pending agent), grouped by backend object, and the
    request order as (backend key, position in its batch): outputs are handed back in it, so an
    episode's output ids follow its request ids whatever the batching.

    Each output's seed and request id come from its episode and its index there
    (``len(ep.outputs)`` plus the episode's requests earlier in ``work``), never from the batch;
    every request carries its rendered prompt as ``prompt_text`` (a text-only external policy
    sends that). An episode whose prompt cannot be rendered, or whose request would not fit in
    the backend's ``context_length`` (:func:`_over_context`), is failed here (kind ``prompt``).
    """
    rendered: list[tuple[EpisodeRun, AgentPlan, str]] = []
    chat_ids: dict[int, tuple[int, ...]] = {}  # chat agents' prompts come from their conversation
    for ep, agent in work:
        plan = plans[agent]
        try:
            if plan.chat is not None:
                ids, text = chat_prompt(ep, plan.chat)
                chat_ids[len(rendered)] = ids
                rendered.append((ep, plan, text))
            else:
                rendered.append((ep, plan, render(plan.agent.template, ep.state)))
        except Exception as exc:  # noqa: BLE001 - e.g. an absent reference
            ep.fail(at_node(plan.agent.template, f"prompt of agent {agent!r}: {exc}"), "prompt")
    by_agent: dict[str, list[int]] = {}
    for i, (_, plan, _) in enumerate(rendered):
        if i not in chat_ids:
            by_agent.setdefault(plan.agent.name, []).append(i)
    prompts: list[tuple[int, ...]] = [()] * len(rendered)
    for i, ids in chat_ids.items():
        prompts[i] = ids
    for idx in by_agent.values():
        for i, ids in zip(idx, rendered[idx[0]][1].encode_many([rendered[i][2] for i in idx])):
            prompts[i] = ids
    batches: dict[int, list[Item]] = {}
    order: list[tuple[int, int]] = []
    issued: dict[int, int] = {}  # episode -> requests made this round: each output its own seed
    for (ep, plan, text), prompt in zip(rendered, prompts):
        k = issued.get(id(ep), 0)
        issued[id(ep)] = k + 1
        n = len(ep.outputs) + k
        req = plan.request(prompt, seed=output_seed(ep.seed, n), request_id=f"{ep.group_id}/{ep.sample}/o{n}",
                           prompt_text=text)
        too_long = _over_context(ep, plan, req, backends[plan.agent.policy])
        if too_long:
            ep.fail(too_long, "prompt")
            continue
        key = id(backends[plan.agent.policy])
        batch = batches.setdefault(key, [])
        order.append((key, len(batch)))
        batch.append((ep, plan, req))
    return batches, order


def _over_context(ep: EpisodeRun, plan: AgentPlan, req: GenerationRequest, backend: Backend) -> str | None:
    """Why ``req`` cannot be sent (its prompt and ``max_tokens`` do not fit in the backend's
    ``context_length``), naming the agent and its turn; None when it fits or the length is unknown.
    A chat agent's conversation grows with every turn, so this is where a long one ends."""
    limit = getattr(backend, "context_length", None)
    need = len(req.prompt_ids) + int(req.max_new_tokens)
    if not limit or need <= limit:
        return None
    agent = plan.agent
    turn = 1 + sum(o.agent == agent.name for o in ep.outputs)
    grows = agent.chat is not None and agent.chat.memory == "chat"
    return at_node(agent, f"agent {agent.name!r}, turn {turn}: the prompt ({len(req.prompt_ids)} tokens) and "
                          f"max_tokens ({req.max_new_tokens}) need {need} positions, more than the "
                          f"{limit} of policy {agent.policy!r}'s model"
                   + ("; its conversation (`memory: chat`) grew past the context: bound the cycle with "
                      "`max_rounds`, lower `max_tokens`, or use `memory: none`" if grows else
                      "; shorten the prompt or lower `max_tokens`"))


def _sample(backend: Backend, items: Sequence[Item], on_backend_error: str,
            ) -> tuple[list[Completion | None], list[str | None]]:
    """``backend.generate`` on the items' requests: (completions, errors), aligned with ``items``.

    Safe to call from a worker thread (touches no episode). A failed request is None with its
    error when ``on_backend_error == "fail"``; otherwise the BackendError propagates.
    """
    policy0 = items[0][1].agent.policy
    try:
        completions: list[Completion | None] = list(backend.generate([req for _, _, req in items]))
        errors: list[str | None] = [None] * len(items)
    except BackendError as exc:
        partial = getattr(exc, "partial", None)  # sglang's BatchError: what did come back
        if on_backend_error == "raise":
            raise
        completions = list(partial) if partial is not None and len(partial) == len(items) else [None] * len(items)
        errors = list(getattr(exc, "errors", None) or [str(exc)] * len(items))
    except SrpoGraphError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a device error: stop the run with a clear message
        raise BackendError(f"policy {policy0!r}: the backend failed on a batch of {len(items)} requests:"
                           f" {type(exc).__name__}: {exc}") from exc
    if len(completions) != len(items):
        raise BackendError(f"policy {policy0!r}: the backend answered {len(completions)} of {len(items)} requests")
    return completions, errors


def _hand_back(items: Sequence[Item], completions: Sequence[Completion | None], errors: Sequence[str | None],
               backend: Backend, versions: Mapping[str, int], stats: dict, vocab_size: int | None) -> None:
    """Check each answer and give it to its episode (in ``items`` order), or fail the episode
    (kind ``backend``)."""
    default_version = getattr(backend, "weight_version", 0)
    reports_versions = bool(getattr(backend, "reports_weight_versions", False))
    for (ep, plan, req), comp, err in zip(items, completions, errors):
        if comp is None:
            if not ep.done:
                stats["backend_failures"] += 1
                stats["backend_error"] = stats["backend_error"] or f"policy {plan.agent.policy!r}: {err}"
                ep.fail(at_node(plan.agent, f"backend error on agent {plan.agent.name!r} (policy "
                                        f"{plan.agent.policy!r}): {err}"), "backend")
            continue
        stats["tokens"] += len(comp.completion_ids)
        if ep.done:
            continue
        if plan.tokenizer is None:  # a text-only (external) answer: recorded as text, no ids
            ep.add_output(plan.agent.name, Sampled(req, (), (), comp.finish_reason, comp.text or "", 0, "text"))
            continue
        ids, lps, finish, text = trim_at_stop(plan, checked_completion(comp, req, vocab_size=vocab_size))
        version = versions.get(plan.agent.policy, default_version)
        if reports_versions and comp.weight_version != version:
            # the engine says other weights produced it (a sync raced the rollout): stale
            stats["stale"] += 1
            version = comp.weight_version
        ep.add_output(plan.agent.name, Sampled(req, ids, lps, finish, text, version))


def _vocab_size(backend: Any) -> int | None:
    """Token ids a backend may return: those its tokenizer can decode (None: unknown)."""
    try:
        return len(backend.tokenizer)
    except TypeError:
        return None


def checked_completion(comp: Completion, req: GenerationRequest, *, vocab_size: int | None = None) -> Completion:
    """What the trace schema needs of a backend's answer (the checks ``Output`` validates).

    Raises:
        BackendError: log-probs that do not pair with the ids, or are not finite log-probabilities;
            token ids that are not integers in ``[0, vocab_size)``; more tokens than
            ``req.max_new_tokens`` (a backend that ignored the limit).

    >>> checked_completion(Completion((5,), (-0.1,), "stop"), GenerationRequest((1,), 1)).completion_ids
    (5,)
    >>> checked_completion(Completion((5, 99), (-0.1, -0.2), "stop"), GenerationRequest((1,), 2), vocab_size=32)
    Traceback (most recent call last):
    ...
    srpo_graph.errors.BackendError: request '': token id 99 at completion position 1 is outside the vocabulary [0, 32)
    """
    ids = comp.completion_ids
    if len(ids) > req.max_new_tokens:
        raise BackendError(f"request {req.request_id!r}: {len(ids)} completion tokens for max_new_tokens "
                           f"{req.max_new_tokens} (the backend ignored the limit)")
    for pos, tok in enumerate(ids):
        if type(tok) is not int or tok < 0 or (vocab_size is not None and tok >= vocab_size):
            why = (f"is a {type(tok).__name__}, not an integer" if type(tok) is not int else
                   f"is outside the vocabulary [0, {vocab_size})" if vocab_size is not None else "is negative")
            raise BackendError(f"request {req.request_id!r}: token id {tok!r} at completion position {pos} {why}")
    lps = comp.logprobs
    if len(lps) != len(comp.completion_ids) or comp.finish_reason not in ("stop", "length", "abort"):
        raise BackendError(f"request {req.request_id!r}: {len(lps)} log-probs for {len(comp.completion_ids)} tokens,"
                           f" finish_reason {comp.finish_reason!r}")
    if lps and not (max(lps) <= LOGPROB_TOL and math.isfinite(sum(lps))):  # sum is NaN/-inf if any is
        raise BackendError(f"request {req.request_id!r}: log-probs {list(lps)[:8]} are not finite log-probabilities")
    if not req.prompt_ids:
        raise BackendError(f"request {req.request_id!r}: empty prompt")
    return comp


def output_seed(episode_seed: int, n: int) -> int:
    """The sampling seed of an episode's ``n``-th output (splitmix64 of the two; 63 bits).

    >>> output_seed(7, 0) != output_seed(7, 1) != output_seed(8, 0)
    True
    >>> 0 <= output_seed(2**63 - 1, 99) < 2**63
    True
    """
    z = (episode_seed + (n + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) >> 1


_M64 = (1 << 64) - 1


class _Progress:
    """A rich progress bar over episodes (only created when asked for)."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
        self._p.start()
        self._task = self._p.add_task("run", total=total)

    def advance(self, n: int) -> None:
        if n:
            self._p.advance(self._task, n)

    def close(self) -> None:
        self._p.stop()


__all__ = ["RunResult", "RunStats", "derive_seed", "output_seed", "run"]
