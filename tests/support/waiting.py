"""Waiting on real processes without a wall-clock bet.

A test that sleeps a fixed time, or polls under one deadline for the whole start-up, measures the
machine: on a loaded 2-core machine a torch import alone can take a minute. :func:`wait_for`
instead polls a state the program reports (a file appearing, a metrics row, a line) and fails
only when the process has died, or when nothing has moved for ``stall`` seconds; every change of
``progress()`` restarts that clock. So the deadline bounds a hang, not a slow machine.

Both callables read a program's files while it writes them: a checkpoint's ``.tmp-`` folder can be
renamed between a listing and a read of it, a file replaced between ``exists()`` and ``stat()``.
An ``OSError`` from either therefore never fails a wait: from ``done()`` it means "not yet", from
``progress()`` it means the files moved, which is progress (a CI run failed on exactly that).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable

_MOVED = object()  # progress() met a file that vanished or changed under it

STALL_S = 600.0  # no sign of progress for this long: the program hangs (a slow machine still moves)


def wait_for(
    done: Callable[[], bool],
    *,
    proc: subprocess.Popen | None = None,
    progress: Callable[[], Any] = lambda: None,
    stall: float = STALL_S,
    what: str = "the state",
    interval: float = 0.02,
) -> None:
    """Poll until ``done()``; fail when ``proc`` exits first or ``progress()`` stops changing.

    Args:
        done: the state waited for.
        proc: the process expected to reach it; its exit first fails the wait, with its output.
        progress: any value that changes while the program moves on (rows written, files made);
            each change restarts the ``stall`` clock.
        stall: seconds without a change of ``progress()`` (or of ``done()``) that count as a hang.
        what: the state's name, for the failure message.
    Raises:
        AssertionError: ``proc`` exited, or ``stall`` seconds passed with no progress.

    >>> ticks = iter(range(5))
    >>> wait_for(lambda: next(ticks) == 3, what="the third tick", interval=0)
    """
    last, since = _probe(progress, _MOVED), time.monotonic()
    while not _probe(done, False):
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}:\n{(out or '')[-2000:]}"
                                 f"\n{(err or '')[-3000:]}")
        now, seen = time.monotonic(), _probe(progress, _MOVED)
        if seen is _MOVED or seen != last:
            last, since = seen, now
        elif now - since > stall:
            raise AssertionError(f"no progress towards {what} for {stall:.0f} s (last: {last!r})")
        time.sleep(interval)


def _probe(read: Callable[[], Any], moved: Any) -> Any:
    """``read()``, or ``moved`` when a file it reads vanished or changed type under it."""
    try:
        return read()
    except OSError:
        return moved
