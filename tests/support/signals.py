"""A signal that the kernel hands to another thread than the main one, on demand (srpo_graph/exiting.py,
Note [A signal reaches the main thread's waits]).

A signal sent to a process goes to whichever of its threads the kernel picks; Python runs the handler
in the main thread, once that thread is back in Python. What the kernel does now and then,
``signal.pthread_kill`` does every time: SIGUSR1 to one chosen thread, whose handler (installed here
for the test, in the main thread) raises ``KeyboardInterrupt`` as Python's SIGINT handler does.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator


def _interrupt(signum, frame):  # noqa: ARG001 - a signal handler's signature
    raise KeyboardInterrupt  # what Python's SIGINT handler does


@contextlib.contextmanager
def signal_to_a_worker_thread(name: str) -> Iterator[list[float]]:
    """While the block runs: once a new thread whose name starts with ``name`` runs (not one an earlier
    test left behind), and a second later (the main thread has reached its wait on it by then), SIGUSR1
    goes to that thread alone. Yields a list that gets the ``time.monotonic()`` of the send."""
    assert threading.current_thread() is threading.main_thread()  # where Python runs signal handlers
    old = set(threading.enumerate())  # the threads themselves: a new thread may reuse a dead one's ident
    sent: list[float] = []

    def body() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            target = next((t for t in threading.enumerate()
                           if t.name.startswith(name) and t.is_alive() and t not in old), None)
            if target is not None and target.ident is not None:
                time.sleep(1.0)  # the work hangs: meanwhile the main thread reaches its wait on it
                sent.append(time.monotonic())
                signal.pthread_kill(target.ident, signal.SIGUSR1)
                return
            time.sleep(0.01)

    before = signal.signal(signal.SIGUSR1, _interrupt)
    helper = threading.Thread(target=body, name="test-signaller", daemon=True)
    helper.start()
    try:
        yield sent
    finally:
        helper.join(timeout=5)
        signal.signal(signal.SIGUSR1, before)
