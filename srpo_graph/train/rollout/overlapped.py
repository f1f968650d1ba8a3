"""Trainer stage, overlapped rollouts with bounded staleness (``rollout.max_staleness = k``).

Same interface as the synchronous stage (``lockstep.Rollouts``): the loop calls ``get(step)``,
then ``weights_updated(version)`` after each update's sync, and ``close()``; the cursor is
``state_dict()`` / ``load_state_dict()``.
Here a dispatcher thread starts sampling the batches of the next steps while the main thread
updates; each batch runs on its own thread (``lockstep.rollout``: the streaming scheduler on
servers), and batches are handed to the loop in step order.

Note [The staleness bound]
    The batch of step ``s`` is consumed by update ``s``, which starts from the weights of version
    ``s - 1``; an output sampled at version ``v`` has staleness ``(s - 1) - v``. The dispatcher
    starts batch ``s`` only once the current version (``weights_updated``) is ``>= s - 1 - k``,
    and versions only grow, so every output of batch ``s`` has staleness ``<= k``; and none is
    newer than ``s - 1`` because the sync to version ``s`` comes after update ``s``, which waits for
    the whole batch. At most ``k + 1`` batches are sampled or waiting at once. ``k = 0`` is the
    synchronous loop exactly (batch ``s`` starts after the sync of ``s - 1``, with the same tasks
    and seed; tested). Per output, the version of record is the one its request was sent at
    (``gate.py``: a sync waits for the requests in flight, new ones wait for the sync).

Note [Determinism]
    Batch ``s``'s tasks and seed depend on ``s`` alone (the cursor at the first ``get`` plus the
    steps since, the seed ``runtime.seeds.rollout_seed(config.seed, s)``), as in ``Rollouts.get``;
    ``get`` leaves the cursor where the synchronous stage would. What differs from the synchronous loop
    (k >= 1) is only which weights sampled each output, recorded per output.

Note [Checkpoints and resume]
    A checkpoint stores the loop's state after update ``s`` (cursor, versions); the batches already
    sampled or in flight for later steps are not saved. A run that stops drops them (counted:
    ``async/ahead`` in each step's metrics, and a line on stderr when the stage closes), and
    ``--resume`` samples them again from their steps' tasks and seeds, now with the checkpoint's
    weights (so their outputs are less stale than the dropped ones would have been).

Note [In-process backends: the rollout worker]
    The transformers backend samples from the model being updated, so ``check_async``
    (``train/config/refusals.py``) refuses it for k >= 1 unless ``rollout.worker`` is on: then the
    rollout worker process (``train/rollout/worker/client.py``, its own copy of each policy) samples
    each batch (``rollout`` finds it through the slots' ``WorkerPolicy`` backends) and the learning
    step's sync pushes the weights to it. The worker serves one request at a time, so a push waits for
    the batch in flight and weights change between batches, never inside one; each output records the
    version the worker held when it sampled it. No gate is needed, and the bound and the step order
    above do not change. ``sampler`` and ``on_weights`` remain hooks for other samplers (tests use
    them).

Failures of a batch (the failure budget, a server that died) are raised by ``get`` for that step
in the main thread, as the same exceptions the synchronous stage raises; nothing is dispatched
after one. ``close()`` stops dispatching, closes the gates (no new request) and joins the threads
up to a deadline (abandoning them after it: they are daemon threads; their requests end at their
own deadlines).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from srpo_graph.runtime.seeds import rollout_seed
from srpo_graph.train.config.refusals import check_async
from srpo_graph.train.config.schema import TrainConfig
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.rollout.gate import GatedBackend, WeightGate
from srpo_graph.train.rollout.lockstep import Rollouts, StepRollout, rollout
from srpo_graph.train.rollout.tasks import task_indices
from srpo_graph.train.rollout.worker.client import close_worker, worker_of


def make_rollouts(wf, train_tasks: list, slots: list, config: TrainConfig, dist: DistInfo,
                  frozen: dict[str, Any] | None = None):
    """The rollout stage ``config`` asks for: synchronous (``max_staleness = 0``) or overlapped."""
    check_async(config, dist)
    if config.rollout.max_staleness == 0:
        return Rollouts(wf, train_tasks, slots, config, dist, frozen)
    return AsyncRollouts(wf, train_tasks, slots, config, dist, frozen)


class AsyncRollouts:
    """Overlapped rollouts: batches of later steps sampled while the loop updates, each output at most
    ``config.rollout.max_staleness`` versions older than the weights its update starts from (Note
    [The staleness bound]). The slots' backends are wrapped in gates (``gate.py``) until
    :meth:`close`."""

    def __init__(self, wf, train_tasks: list, slots: list, config: TrainConfig, dist: DistInfo,
                 frozen: dict[str, Any] | None = None, *, close_seconds: float = 10.0,
                 gate_seconds: float = 900.0, sampler: Callable[[list, int], tuple[list, Any]] | None = None,
                 on_weights: Callable[[int], None] | None = None) -> None:
        self.wf, self.train_tasks, self.slots, self.config, self.dist = wf, train_tasks, slots, config, dist
        self.k = config.rollout.max_staleness
        self.close_seconds = close_seconds
        # None: lockstep.rollout through the gated backends (Note [In-process backends: the rollout worker])
        self.sampler = sampler
        self.on_weights = on_weights  # e.g. lambda v: worker.push_weights(slots, v), before batches of v may start
        gates: dict[int, WeightGate] = {}

        def gated(backend: Any) -> GatedBackend:
            gate = gates.setdefault(id(backend), WeightGate(gate_seconds))  # one gate per backend object
            return GatedBackend(backend, gate, partial=config.rollout.partial_rollouts)

        self._gates = gates
        self._original = [(s, s.backend) for s in slots]
        if worker_of(slots) is None:
            for s in slots:
                if s.backend is not None:
                    s.backend = gated(s.backend)
            self.frozen = {name: gated(b) for name, b in (frozen or {}).items()}
        else:  # a rollout worker serves one request at a time: a push waits for the batch in flight,
            self.frozen = dict(frozen or {})  # and each output records the version the worker held (its gate)
        self._cond = threading.Condition()
        self._version = min((s.version for s in slots), default=0)
        self._results: dict[int, StepRollout | BaseException] = {}
        self._running: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._dispatcher: threading.Thread | None = None
        self._stop = self._failed = False
        self.cursor = 0
        self._first = self._cursor0 = 0
        self._expect: int | None = None
        self._t0 = time.perf_counter()
        self.dropped: list[int] = []  # steps sampled (or in flight) ahead and dropped at close

    # -- the loop's side -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps of the stage: its cursor (batches sampled ahead are not kept,
        Note [Checkpoints and resume])."""
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (before the first :meth:`get`)."""
        if self._dispatcher is not None:
            raise RuntimeError("the overlapped rollout stage's cursor is set before its first batch")
        self.cursor = int(state["cursor"])

    def get(self, step: int) -> StepRollout:
        """Step ``step``'s episodes (waiting for them if needed); the cursor as the synchronous stage
        leaves it. Raises whatever sampling that batch raised."""
        if self._dispatcher is None:
            self._first, self._cursor0, self._expect = step, self.cursor, step
            self._dispatcher = threading.Thread(target=self._dispatch, name="srpo-rollout-dispatch", daemon=True)
            self._dispatcher.start()
        if step != self._expect:
            raise RuntimeError(f"the overlapped rollout stage hands batches out in order: expected step "
                               f"{self._expect}, asked for {step}")
        t0 = time.perf_counter()
        with self._cond:
            while step not in self._results:
                if not self._dispatcher.is_alive() and step not in self._running and not self._stop:
                    raise RuntimeError(f"the rollout dispatcher stopped before step {step}'s batch")
                self._cond.wait(0.5)  # a timeout so that Ctrl-C reaches the main thread
            res = self._results.pop(step)
            ahead = len(self._running) + len(self._results)
        self._expect = step + 1
        self.cursor = self._cursor0 + (step - self._first) + 1
        if isinstance(res, BaseException):
            raise res
        res.metrics.update({"time/rollout_wait": time.perf_counter() - t0, "async/ahead": ahead,
                            "time/clock": time.perf_counter() - self._t0})
        return res

    def weights_updated(self, version: int) -> None:
        """Every policy's weights now have ``version``: batches up to ``version + 1 + k`` may start
        (after ``on_weights(version)``, if given: a rollout worker gets the weights first)."""
        if self.on_weights is not None:
            self.on_weights(int(version))
        with self._cond:
            self._version = max(self._version, int(version))
            self._cond.notify_all()

    def close(self) -> None:
        """Stop dispatching, let no new request start, join the threads (``close_seconds`` in all),
        put the slots' own backends back, close the rollout worker (if any), and count the batches
        sampled ahead that are dropped."""
        with self._cond:
            self._stop = True
            self.dropped = sorted({*self._running, *self._results})
            self._cond.notify_all()
        for gate in self._gates.values():
            gate.close()
        end = time.monotonic() + self.close_seconds
        for t in [self._dispatcher, *self._threads]:
            if t is not None:
                t.join(max(0.0, end - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        for s, backend in self._original:
            s.backend = backend
        close_worker(self.slots)  # the rollout worker, if any, as the synchronous stage closes it
        if self.dropped:
            print(f"srpo-graph train: {len(self.dropped)} batch(es) sampled ahead dropped (steps "
                  f"{self.dropped[0]}..{self.dropped[-1]}); --resume samples them again from their steps' seeds",
                  file=sys.stderr)
        if alive:
            print(f"srpo-graph train: {len(alive)} rollout thread(s) still waiting on requests after "
                  f"{self.close_seconds:.0f} s were abandoned", file=sys.stderr)

    # -- the producer's side ---------------------------------------------------------------------

    def _dispatch(self) -> None:
        s = self._first
        while s <= self.config.steps:
            with self._cond:
                while not (self._stop or self._failed) and self._version < s - 1 - self.k:
                    self._cond.wait()
                if self._stop or self._failed:
                    return
                self._running.add(s)
                version = self._version
            t = threading.Thread(target=self._sample, args=(s, version), name=f"srpo-rollout-{s}", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()
            s += 1

    def _sample(self, step: int, version: int) -> None:
        r = self.config.rollout
        t0 = time.perf_counter()
        res: StepRollout | BaseException
        try:
            idx = task_indices(len(self.train_tasks), self._cursor0 + (step - self._first), r.tasks_per_step,
                               self.config.seed)
            tasks, seed = [self.train_tasks[i] for i in idx], rollout_seed(self.config.seed, step)
            if self.sampler is not None:
                episodes, stats = self.sampler(tasks, seed)
            else:
                episodes, stats = rollout(self.wf, tasks, self.slots, self.config, seed, self.dist, r.samples,
                                          frozen=self.frozen)
            res = StepRollout(episodes, stats, time.perf_counter() - t0, metrics={"async/started_at_version": version})
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by get(step)
            res = exc
        with self._cond:
            self._results[step] = res
            self._running.discard(step)
            self._failed = self._failed or isinstance(res, BaseException)
            self._cond.notify_all()


__all__ = ["AsyncRollouts", "make_rollouts"]
