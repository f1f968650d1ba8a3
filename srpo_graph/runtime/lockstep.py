"""The lockstep scheduler: one batch of every live episode's pending agents per round (runtime stage).

The in-process default (``executor.run``'s ``"auto"`` choice when a backend is in-process, e.g.
transformers): a batched forward costs about the same for one row or many, so every live
episode's pending agents become one batch per backend object each round, and the round waits
for the whole batch. Consumes the episodes of a run (:class:`~srpo_graph.runtime.episode.EpisodeRun`),
the agents' sampling plans and one backend per policy; fills the run's finished
:class:`~srpo_graph.runtime.trace.Episode` slots and its statistics. The loop, one round at a time:

1. every live episode fires what is ready (``EpisodeRun.advance``); a firing with tools is
   started in a daemon thread (``usercode.start``) and that episode waits, the others go on;
2. the pending agents of **all** episodes become one batch of requests per backend (policies
   sharing a backend object share the batch), rendered and tokenized once, sampled in one call
   (:func:`generate_round`, through ``requests.py``'s helpers, as the streaming scheduler);
3. outputs go back to their episodes; finished tool jobs are applied; when nothing can be
   generated the loop waits for the first tool to finish.

It knows nothing about how the run was chosen or set up (``executor.py``), nor about servers.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Callable, Mapping, Sequence

from srpo_graph.backends.base import Backend
from srpo_graph.exiting import sliced
from srpo_graph.runtime.episode import EpisodeRun, ToolJob
from srpo_graph.runtime.prompts import AgentPlan
from srpo_graph.runtime.requests import batch_requests, hand_back, sample_batch, vocab_size_of
from srpo_graph.runtime.trace import Episode, WorkflowRef
from srpo_graph.runtime.usercode import start


def run_lockstep(runs: Sequence[EpisodeRun], *, limit: int, plans: Mapping[str, AgentPlan],
                 backends: Mapping[str, Backend], versions: Mapping[str, int], stats: dict, ref: WorkflowRef,
                 finished: list[Episode | None], on_episode: Callable[[Episode], None] | None, bar: Any,
                 tool_seconds: float) -> None:
    """Run ``runs`` (at most ``limit`` alive) to the end, filling ``finished`` by index.

    Same contract as :func:`~srpo_graph.runtime.streaming.stream`: ``stats`` counts tokens,
    generate calls (one per round and backend here), backend failures and stale outputs; a tool
    past ``tool_seconds`` fails its episode (kind ``timeout``); a BackendError with
    ``on_backend_error == "raise"`` propagates.
    """
    # tool jobs run in daemon threads (usercode.start): never joined, so a hanging tool fails its
    # episode at its deadline, and one Ctrl-C / SIGTERM stops the run at once (the waits below
    # are interruptible); a ThreadPoolExecutor would join it on the way out
    futures: dict[Future, tuple[EpisodeRun, ToolJob]] = {}

    def step(ep: EpisodeRun) -> None:
        job = ep.advance()
        if job is not None:
            futures[start(job, name="srpo-tool")] = (ep, job)

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
            generate_round(work, plans, backends, versions, stats)
            for ep in {id(ep): ep for ep, _ in work}.values():
                step(ep)
        elif futures:
            now = time.monotonic()
            soonest = min(job.overdue.remaining(tool_seconds, now) for _, job in futures.values())
            # in slices: a signal handed to another thread is still handled (exiting.py, Note [A signal
            # reaches the main thread's waits]); the loop fails what is overdue and waits again
            wait(list(futures), timeout=sliced(soonest + 0.001), return_when=FIRST_COMPLETED)
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


def generate_round(work: list[tuple[EpisodeRun, str]], plans: Mapping[str, AgentPlan],
                    backends: Mapping[str, Backend], versions: Mapping[str, int], stats: dict) -> None:
    """Render, tokenize and sample every pending agent of every episode; hand outputs back.

    The per-output work is kept small: prompts are tokenized in one call per agent (and each
    distinct text once), completions decoded through a cache, one record built per output.
    """
    batches, order = batch_requests(work, plans, backends)
    answers = []
    for items in batches.values():
        backend = backends[items[0][1].agent.policy]
        completions, errors = sample_batch(backend, items, stats["on_backend_error"])
        stats["calls"] += 1
        answers.append((items, completions, errors, backend, vocab_size_of(backend)))  # vocab once per batch
    if len(answers) == 1:
        hand_back(*answers[0][:4], versions, stats, answers[0][4])
        return
    at = {key: i for i, key in enumerate(batches)}  # several backends: hand back in request order
    for key, j in order:
        items, completions, errors, backend, vocab = answers[at[key]]
        hand_back(items[j:j + 1], completions[j:j + 1], errors[j:j + 1], backend, versions, stats, vocab)


__all__ = ["generate_round", "run_lockstep"]
