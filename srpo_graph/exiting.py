"""Signals after a command's outcome is decided.

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
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Sequence


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
