"""Signals: SIGTERM stops a run like Ctrl-C, and no signal raises into a command's exit.

While a command works, Ctrl-C and SIGTERM raise ``KeyboardInterrupt`` so that it stops where it
is and says how to continue (``train`` resumes from its last checkpoint). Once the outcome is
decided (the message printed, the exit status chosen), an exception raised by a signal can only
do harm: it lands in whatever runs during the exit (a weakref callback, an ``atexit`` function,
a finalizer), where Python prints it as "Exception ignored in ... Traceback" and the exit status
of record is lost. That happens without anyone pressing a key: when one rank of a ``torchrun`` job
dies, the others fail their next collective, print their stop line, and exit; torchrun sends
SIGTERM to them meanwhile, and the signal finds them inside their exit.

:func:`quiet_signals_for_exit` makes the first such signal a no-op (the exit, already under way,
finishes with the status chosen); a second one ends the process at once (``128 + signal``), so
an exit that hangs still ends on request.

:func:`stop_on_sigterm` is ``train``'s SIGTERM handler: it raises ``KeyboardInterrupt`` like
Ctrl-C and records the signal. A signal that lands in a finalizer has its exception swallowed by
Python (printed, not raised); the record keeps that stop from being lost: the training loop calls
:func:`raise_if_stopped` at each step.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Sequence

_STOPS: list[int] = []  # the SIGTERMs stop_on_sigterm's handler received


def _terminated(signum, frame):  # noqa: ARG001 - a signal handler's signature
    _STOPS.append(signum)
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM raises ``KeyboardInterrupt`` from now on, like Ctrl-C, and is recorded."""
    _STOPS.clear()
    signal.signal(signal.SIGTERM, _terminated)


def stopped_by() -> int | None:
    """The signal that stop_on_sigterm's handler received (SIGTERM), or None (none, or Ctrl-C)."""
    return _STOPS[0] if _STOPS else None


def raise_if_stopped() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGTERM arrived and its exception was swallowed (a finalizer).

    >>> raise_if_stopped()  # nothing received
    """
    if _STOPS and signal.getsignal(signal.SIGTERM) is _terminated:
        raise KeyboardInterrupt


def owns_sigterm() -> bool:
    """Whether SIGTERM is stop_on_sigterm's (the command that installed it decides the process's exit)."""
    return signal.getsignal(signal.SIGTERM) is _terminated


def quiet_signals_for_exit(signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """From now on, the first of ``signals`` is ignored and a second ends the process at once.

    Call it where the process's outcome is decided and only its exit remains. It changes the
    process's handlers, so call it only where the command owns the process (the entry points);
    from another thread than the main one it does nothing (Python sets handlers there only).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    seen: list[int] = []

    def _during_exit(signum, frame):  # noqa: ARG001 - a signal handler's signature
        if seen:  # asked twice: the exit takes too long; end it now
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
                    pass
            os._exit(128 + signum)
        seen.append(signum)

    for sig in signals:
        signal.signal(sig, _during_exit)
