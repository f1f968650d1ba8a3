"""User code with a deadline, off the main thread: tools, rewards and extractors of a workflow's
own modules, and how a failed episode is classified.

Runtime stage. Consumes a Python callable from a workflow's module (``Callables.get``) and its
arguments; produces its value, or an exception that fails the episode (never the run):

* every call runs in a fresh **daemon** thread while the caller waits on it with a deadline
  (:class:`Deadlines`, per kind: ``rollout.deadlines.tool`` / ``.reward`` / ``.extractor`` in
  training, the same defaults in ``run``). A call past its deadline raises :class:`UserTimeout`;
  its thread is abandoned (Python cannot stop a thread), and being a daemon it never holds up the
  process's exit. The caller's wait is interruptible, so one Ctrl-C / SIGTERM stops ``run`` and
  ``train`` at once even while a tool hangs (before: the thread pool was joined on exit, and
  three signals were needed) -- in slices, whichever thread the kernel hands the signal to (Note
  [A signal reaches the main thread's waits], exiting.py);
* whatever the user code raises -- any ``BaseException``, ``SystemExit(0)`` and a
  ``KeyboardInterrupt`` *raised by the code* included -- comes back as an ``Exception``
  (:class:`UserExit` for the non-``Exception`` ones), so the episode fails with the ``.wf``
  location of the call instead of the process exiting (the checker treats ``SystemExit`` at
  import the same way);
* functions of ``srpo_graph.std`` (the project's own, fast and pure) are called inline: no thread
  per output for the standard extractors.

:data:`FAILURE_KINDS` names the classes of a failed episode; every class counts toward one
failure budget in training (``rollout.max_failed_fraction``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, wait
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from srpo_graph.exiting import sliced
from srpo_graph.supervisor import running

STD_MODULE = "srpo_graph.std"

# why an episode failed: the backend's request, a tool, an extractor, a reward (raised, returned
# a non-number or out of range), rendering a prompt, user code past its deadline, or the workflow
# itself (a route on an unknown value, a stall)
FAILURE_KINDS = ("backend", "tool", "extractor", "reward", "prompt", "timeout", "workflow")


class Deadlines(BaseModel):
    """Seconds a user-code call may take before its episode fails (kind ``timeout``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: float = Field(60.0, gt=0, le=86_400, description="Seconds one tool call may take (each tool of a firing "
                        "has its own). Past it the episode fails with the tool's `.wf` line; the run goes on.")
    reward: float = Field(10.0, gt=0, le=86_400, description="Seconds one reward call (a transition's or the "
                          "terminal one) may take. Past it the episode fails with the reward's `.wf` line.")
    extractor: float = Field(10.0, gt=0, le=86_400, description="Seconds one extractor call of a user module may "
                             "take (`std` extractors run inline). Past it the episode fails with its `.wf` line.")


class UserTimeout(Exception):
    """A user call ran past its deadline (its thread is abandoned)."""

    def __init__(self, what: str, kind: str, seconds: float):
        super().__init__(f"{what} did not return within {seconds:g} s (rollout.deadlines.{kind})")
        self.kind, self.seconds = kind, seconds


class UserExit(Exception):
    """User code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``): the episode fails; the process goes on.
    ``repr()`` is the original's, e.g. ``SystemExit(0)``."""

    def __init__(self, original: BaseException):
        super().__init__(repr(original))
        self.original = original

    def __repr__(self) -> str:
        return repr(self.original)


def start(fn: Callable[..., Any], *args: Any, name: str = "srpo-user", **kwargs: Any) -> Future:
    """Run ``fn(*args, **kwargs)`` in a new daemon thread; its outcome (any ``BaseException``
    included) lands in the returned future."""
    fut: Future = Future()

    def body() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - user code: whatever it raises is its outcome
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    threading.Thread(target=body, name=name, daemon=True).start()
    return fut


def _named(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """``fn``, recorded as running while it runs: if it ends the process, the command's supervising
    parent names it (srpo_graph/supervisor.py, Note [User code that ends the process])."""

    def named(*args: Any, **kwargs: Any) -> Any:
        with running(what):
            return fn(*args, **kwargs)

    return named


def outcome(fut: Future) -> Any:
    """The value of a finished future, or its exception as an ``Exception`` (see :class:`UserExit`)."""
    exc = fut.exception()
    if exc is None:
        return fut.result()
    if isinstance(exc, Exception):
        raise exc
    raise UserExit(exc) from exc


def described(what: str, module: str, span: Any = None) -> str:
    """How the supervising parent names a user call that ended the process: what it is, its Python
    module and its ``.wf`` position.

    >>> described("reward mine.f", "my_rewards")
    'reward mine.f (module my_rewards)'
    """
    where = span.where() if span is not None else None
    return f"{what} (module {module}{f', {where}' if where else ''})"


def call(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], *, module: str, what: str, kind: str,
         deadlines: Deadlines, span: Any = None) -> Any:
    """``fn(*args, **kwargs)`` under the deadline of ``kind`` (``tool``, ``reward``, ``extractor``);
    ``span``: the call's ``.wf`` position, for the supervising parent's line if the call ends the
    process (:func:`described`).

    Raises:
        UserTimeout: past the deadline.
        UserExit: the code raised ``SystemExit`` / ``KeyboardInterrupt`` / another non-``Exception``.
        Exception: whatever ``Exception`` the code raised, as it is.
        KeyboardInterrupt: a real Ctrl-C / SIGTERM while waiting (the run stops; the thread is left).
    """
    if module == STD_MODULE:
        return fn(*args, **kwargs)
    seconds = float(getattr(deadlines, kind))
    fut = start(_named(fn, described(what, module, span)), *args, name=f"srpo-{kind}", **kwargs)
    deadline = time.monotonic() + seconds
    # interruptible, in slices: a signal's KeyboardInterrupt goes through (exiting.py, Note [A signal reaches the
    # main thread's waits])
    while not wait([fut], timeout=sliced(deadline - time.monotonic()))[0]:
        if time.monotonic() >= deadline:
            raise UserTimeout(what, kind, seconds)
    return outcome(fut)


class Overdue:
    """Deadline bookkeeping of a job that runs several user calls in turn (a firing's tools):
    the job calls :meth:`begin` before each; :meth:`late` says which call is past its deadline."""

    def __init__(self) -> None:
        self.current: Any = None
        self.since = time.monotonic()

    def begin(self, what: Any) -> None:
        self.current, self.since = what, time.monotonic()

    def late(self, seconds: float, now: float | None = None) -> bool:
        return self.current is not None and (now if now is not None else time.monotonic()) - self.since > seconds

    def remaining(self, seconds: float, now: float | None = None) -> float:
        return max(0.0, seconds - ((now if now is not None else time.monotonic()) - self.since))


__all__ = ["Deadlines", "FAILURE_KINDS", "Overdue", "UserExit", "UserTimeout", "call", "described", "outcome",
           "start"]
