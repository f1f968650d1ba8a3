"""The streaming scheduler: each episode advances as soon as its own outputs return (runtime stage).

The lockstep scheduler (``lockstep.py``, ``executor.run``'s choice for in-process backends)
makes every live episode's pending agents one batch and waits for the slowest answer before any
episode moves on: right for one forward per batch, wrong for a server that batches continuously
(SGLang), where an episode whose answer came back could already send its next turn. Here every
request is sent as soon as its episode wants it: an episode's requests to one backend are one
``backend.generate`` call (``generate_together`` where the backend has it: SGLang then sends the
wave as one HTTP call, Note [A wave in one call]) on a thread pool per backend object, with up to the backend's
``concurrency`` calls in flight (1 when it has none; a server client sends a call's requests
concurrently). The main thread alone touches episodes, so an episode's state is never shared
between threads.

Everything else is the lockstep scheduler's, through the same helpers (``requests.py``:
``batch_requests``, ``sample_batch``, ``hand_back``): request seeds and ids, ``prompt_text`` and
text-only outputs of external policies, failure kinds (``prompt``, ``backend``, ``tool``,
``timeout``, ...), and the user-code deadlines: a firing's tools run in a daemon thread each
(``usercode.start``), and a tool past ``deadlines.tool`` fails its episode naming the tool's
``.wf`` line while the other episodes go on (the thread is abandoned, as under lockstep).

Note [Waves]
    An episode's pending agents at one moment are one *wave*: their requests are sent at once
    and their outputs are handed back together, in request order, when the last of them
    returns; then the episode advances. Handing each output back as it arrives would let a
    transition fire on part of a wave, and the next requests' output indices (hence seeds and
    ids) would then depend on which answer came first. With waves an episode's trace depends
    only on its own seed and answers, so a deterministic backend gives the same traces under
    both schedulers (tested with the transformers backend driven through this path).
    Episodes never wait for each other: the wave is per episode.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from srpo_graph.backends.base import Backend, Completion
from srpo_graph.exiting import sliced
from srpo_graph.runtime.episode import EpisodeRun, ToolJob
from srpo_graph.runtime.prompts import AgentPlan
from srpo_graph.runtime.requests import Item, batch_requests, hand_back, sample_batch, vocab_size_of
from srpo_graph.runtime.trace import Episode, WorkflowRef
from srpo_graph.runtime.usercode import start

MAX_THREADS = 256  # threads per backend object, whatever its concurrency says


def backend_concurrency(backend: Any) -> int:
    """Requests a backend takes in flight at once: its ``concurrency`` attribute, else 1."""
    try:
        return max(1, min(int(getattr(backend, "concurrency", 1)), MAX_THREADS))
    except (TypeError, ValueError):
        return 1


def prefers_streaming(backends: Mapping[str, Backend]) -> bool:
    """The ``auto`` choice: streaming when every backend is a server (``scheduler = "streaming"``
    on its class: SGLang, an external endpoint); lockstep as soon as one is in-process (its
    batched forward)."""
    return bool(backends) and all(getattr(b, "scheduler", "lockstep") == "streaming" for b in backends.values())


@dataclass
class _Wave:
    index: int  # the episode's position in the run
    ep: EpisodeRun
    batches: dict[int, list[Item]]
    order: list[tuple[int, int]]
    answers: dict[int, tuple[list[Completion | None], list[str | None]]] = field(default_factory=dict)


@dataclass
class _Tool:
    index: int
    ep: EpisodeRun
    job: ToolJob


def stream(runs: Sequence[EpisodeRun], *, limit: int, plans: Mapping[str, AgentPlan], backends: Mapping[str, Backend],
           versions: Mapping[str, int], stats: dict, ref: WorkflowRef, finished: list[Episode | None],
           on_episode: Callable[[Episode], None] | None, bar: Any, tool_seconds: float) -> None:
    """Run ``runs`` (at most ``limit`` alive) to the end, filling ``finished`` by index.

    Same contract as the lockstep loop, :func:`~srpo_graph.runtime.lockstep.run_lockstep`: ``stats``
    counts tokens, generate calls (one per episode wave and backend here), backend failures and
    stale outputs; a tool past ``tool_seconds`` fails its episode (kind ``timeout``); a
    BackendError with ``on_backend_error == "raise"`` propagates (requests still in flight are
    not waited for beyond their own deadlines).
    """
    by_key = {id(b): b for b in backends.values()}
    vocab = {k: vocab_size_of(b) for k, b in by_key.items()}  # once per run, not per answer
    pools = {k: ThreadPoolExecutor(max_workers=backend_concurrency(b), thread_name_prefix="srpo-stream")
             for k, b in by_key.items()}
    # finished jobs arrive on one queue (a done-callback each): O(1) per answer, whatever is in flight
    answered: queue.SimpleQueue[tuple[Future, tuple[_Wave, int] | None]] = queue.SimpleQueue()
    tools: dict[Future, _Tool] = {}  # tool jobs running (daemon threads, never joined)
    on_error = stats["on_backend_error"]
    live = calls = 0  # episodes alive, generate calls in flight

    def post(fut: Future, tag: tuple[_Wave, int] | None) -> None:
        """When ``fut`` is done, put it on ``answered`` with its tag (a wave and backend; None: a tool)."""
        fut.add_done_callback(lambda f: answered.put((f, tag)))

    def finish(i: int, ep: EpisodeRun) -> None:
        nonlocal live
        finished[i] = episode = ep.to_episode(ref)
        live -= 1
        if on_episode is not None:
            on_episode(episode)
        if bar is not None:
            bar.advance(1)

    def step(i: int, ep: EpisodeRun) -> None:
        """Advance until the episode waits on a tool or on a wave, or is over."""
        nonlocal calls
        job = ep.advance()
        if job is not None:
            fut = start(job, name="srpo-tool")
            tools[fut] = _Tool(i, ep, job)
            post(fut, None)
            return
        work = [(ep, a) for a in ep.wants_generation()]
        if work:
            batches, order = batch_requests(work, plans, backends)
            if order:
                wave = _Wave(i, ep, batches, order)
                for key, items in batches.items():  # one call per backend: the wave is handed back whole anyway
                    calls += 1
                    post(pools[key].submit(sample_batch, by_key[key], items, on_error, True), (wave, key))
                return
        if not ep.done:  # nothing to wait for (advance fails a stalled episode; this is a guard)
            ep.fail("episode stalled: nothing pending and no tool running (streaming scheduler)", "workflow")
        finish(i, ep)

    def overdue_tools() -> float | None:
        """Fail the episodes whose tool is past its deadline; the seconds until the next one is."""
        now = time.monotonic()
        for fut in [f for f, t in tools.items() if not f.done() and t.job.overdue.late(tool_seconds, now)]:
            t = tools.pop(fut)  # the thread is abandoned; its late answer is ignored below
            t.ep.tool_done(None, t.job.timeout(tool_seconds))
            step(t.index, t.ep)
        if not tools:
            return None
        return min(t.job.overdue.remaining(tool_seconds, now) for t in tools.values()) + 0.001

    admitted = 0
    try:
        while admitted < len(runs) or calls or tools:
            while admitted < len(runs) and live < limit:
                live += 1
                step(admitted, runs[admitted])
                admitted += 1
            timeout = overdue_tools()
            if not (calls or tools):
                continue
            try:
                # interruptible, in slices: one Ctrl-C stops the run, whichever thread the kernel handed
                # it to (exiting.py, Note [A signal reaches the main thread's waits])
                fut, tag = answered.get(timeout=sliced(timeout))
            except queue.Empty:
                continue  # a slice, or a tool's deadline: failed at the top of the loop
            if tag is None:  # a tool job (or the late answer of one already failed at its deadline)
                t = tools.pop(fut, None)
                if t is not None:
                    t.ep.tool_done(fut.result() if fut.exception() is None else None, fut.exception())
                    step(t.index, t.ep)
                continue
            calls -= 1
            wave, key = tag
            wave.answers[key] = fut.result()  # raises the BackendError of on_backend_error="raise"
            stats["calls"] += 1
            if len(wave.answers) < len(wave.batches):
                continue
            if len(wave.batches) == 1:
                completions, errors = wave.answers[key]
                hand_back(wave.batches[key], completions, errors, by_key[key], versions, stats, vocab[key])
            else:  # Note [Waves]: the whole wave, in request order
                for k, j in wave.order:
                    (completions, errors), items = wave.answers[k], wave.batches[k]
                    hand_back(items[j:j + 1], completions[j:j + 1], errors[j:j + 1], by_key[k], versions, stats,
                              vocab[k])
            step(wave.index, wave.ep)
    finally:
        for pool in pools.values():
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["MAX_THREADS", "backend_concurrency", "prefers_streaming", "stream"]
