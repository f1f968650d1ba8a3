"""Trainer stage: the gate between weight syncs and requests in flight (overlapped rollouts).

With rollouts overlapping the update (``overlapped.py``) a producer thread sends requests while
the main thread syncs new weights. A sync must not race a request:

* :class:`WeightGate` is a readers-writer lock with writer preference and deadlines: every
  ``generate`` call holds it *shared* while its requests are in flight; a sync takes it
  *exclusively* -- it waits for the calls in flight to return, and no new call starts while it
  waits or runs (a server that streams requests continuously would otherwise never be idle for
  the sync's cache flush). Every wait has a deadline (a :class:`BackendError` past it, never a hang).
* :class:`GatedBackend` wraps a backend with a gate: ``generate`` shared, ``sync_weights``
  exclusive, everything else forwarded. An output's weight version is the version when its
  request was sent (read under the shared gate, so no sync changes it while the call is in
  flight). A backend that reports versions itself (SGLang: the server's ``meta_info``) keeps its
  report; any other gets the version read under the gate stamped on each completion. So an
  episode in flight across a sync finishes with outputs of two versions, each recorded per output.

Partial rollouts (``partial=True``, a backend with ``pause_generation`` / ``continue_generation``:
SGLang): a sync does not wait for the requests in flight; it pauses the server (its running
requests retracted to the queue), loads the weights, and resumes them on the new ones. A member's
tokens may then come from two versions; the behaviour log-probs of record are still the
sampler's, token by token, and the version of record is the oldest (the server's spans), so the
staleness bound still holds. See docs/training.md (Overlapped rollouts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Iterator, Sequence

from srpo_graph.backends.base import Completion, GenerationRequest
from srpo_graph.errors import BackendError


class GateClosed(BackendError):
    """The rollout stage was closed: no new request starts."""


class WeightGate:
    """A readers-writer lock (writer preference, deadlines) between requests and weight syncs.

    >>> g = WeightGate()
    >>> with g.shared():
    ...     g.readers
    1
    >>> with g.exclusive():
    ...     g.writing
    True
    """

    def __init__(self, deadline: float = 900.0) -> None:
        self.deadline = deadline
        self._cond = threading.Condition()
        self.readers = 0  # generate calls in flight
        self.writing = False  # a sync holds the gate
        self._writers_waiting = 0
        self.closed = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Held by a generate call while its requests are in flight. Waits while a sync is pending
        or running (up to ``deadline``).

        Raises:
            GateClosed: the gate was closed (the rollout stage stopped).
            BackendError: a sync held the gate past the deadline.
        """
        end = time.monotonic() + self.deadline
        with self._cond:
            while not self.closed and (self.writing or self._writers_waiting):
                left = end - time.monotonic()
                if left <= 0:
                    raise BackendError(f"a request waited {self.deadline:.0f} s for a weight sync to finish")
                self._cond.wait(left)
            if self.closed:
                raise GateClosed("the rollout stage was closed; no new request is sent")
            self.readers += 1
        try:
            yield
        finally:
            with self._cond:
                self.readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held by a weight sync: waits for the calls in flight to return (up to ``deadline``);
        new calls wait until it is released.

        Raises:
            BackendError: requests stayed in flight past the deadline (the sync is not done).
        """
        end = time.monotonic() + self.deadline
        with self._cond:
            self._writers_waiting += 1
            try:
                while self.readers or self.writing:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise BackendError(f"a weight sync waited {self.deadline:.0f} s for {self.readers} "
                                           "generate call(s) in flight")
                    self._cond.wait(left)
            finally:
                self._writers_waiting -= 1
            self.writing = True
        try:
            yield
        finally:
            with self._cond:
                self.writing = False
                self._cond.notify_all()

    def close(self) -> None:
        """No new call starts (each raises :class:`GateClosed`); calls in flight finish."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class GatedBackend:
    """``inner`` behind a :class:`WeightGate`: ``generate`` shared, ``sync_weights`` exclusive; every
    other attribute (``tokenizer``, ``concurrency``, ``scheduler``, ``close``...) is ``inner``'s."""

    reports_weight_versions = True  # every completion carries the version it was sampled at

    def __init__(self, inner: Any, gate: WeightGate, *, partial: bool = False) -> None:
        self.inner = inner
        self.gate = gate
        self.partial = partial and hasattr(inner, "pause_generation")
        self._inner_reports = bool(getattr(inner, "reports_weight_versions", False))

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        return getattr(self.inner, name)

    @property
    def weight_version(self) -> int:
        return int(getattr(self.inner, "weight_version", 0))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self.gate.shared():
            version = self.weight_version  # the version when the requests are sent (no sync until they return)
            out = self.inner.generate(requests)
        if self._inner_reports:
            return list(out)
        return [dataclasses.replace(c, weight_version=version) if isinstance(c, Completion) else c for c in out]

    def sync_weights(self, model: Any, version: int) -> None:
        if self.partial:  # requests in flight are paused and resumed on the new weights, not waited for
            self.inner.pause_generation()
            try:
                self.inner.sync_weights(model, version)
            finally:
                self.inner.continue_generation()
            return
        with self.gate.exclusive():
            self.inner.sync_weights(model, version)


__all__ = ["GateClosed", "GatedBackend", "WeightGate"]
