"""Signals: SIGTERM stops a run like Ctrl-C, and no signal raises into a command's exit.

While a command works, Ctrl-C and SIGTERM raise ``KeyboardInterrupt`` so that it stops where it
is and says how to continue (``train`` resumes from its last checkpoint). Once the outcome is
decided (the message printed, the exit status chosen), an exception raised by a signal can only
do harm: it lands in whatever runs during the exit (a weakref callback, an ``atexit`` function,
a finalizer), where Python prints it as "Exception ignored in ... Traceback" and the exit status
of record is lost. That happens without anyone pressing a key: when one rank of a ``torchrun`` job
dies, the others fail their next collective, print their stop line, and exit; torchrun sends
SIGTERM to them meanwhile, and the signal finds them inside their exit.

:func:`decided` is called where the outcome is decided (a run that stops: in the trainer's
handlers, before their cleanup; a command: before it prints its last line). In a process that a
command owns (:func:`as_entry_point`: ``srpo-graph``, ``python -m srpo_graph.train``, the torchrun
wrapper) it makes the first SIGINT / SIGTERM a no-op -- the exit, already under way, finishes
with the status chosen -- and a second one ends the process at once (``128 + signal``), so an
exit that hangs still ends on request. Called in-process (a test's ``CliRunner``, a notebook),
it only puts back the SIGTERM handler that was there before :func:`stop_on_sigterm`.

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
from concurrent.futures import Future, wait
from typing import Any

from srpo_graph import supervisor

_STOPS: list[int] = []  # the SIGTERMs stop_on_sigterm's handler received
_BEFORE: list[Any] = []  # the SIGTERM handler stop_on_sigterm replaced
_ENTRY: list[bool] = []  # set by as_entry_point: this process is a command's
_SEEN: list[int] = []  # signals received once the outcome was decided
_GROUPS: list[bool] = []  # set by joined_process_group: this process joined a torch.distributed group
_ENDING: list[bool] = []  # ends_without_finalizing's answer, once given


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a command that has said where it stopped: ``str()`` is its one line, which the CLI
    prints instead of the generic one before exiting 130 (``srpo_graph/cli.py``)."""


def as_entry_point() -> None:
    """This process runs one command and ends with it: :func:`decided` may quiet its signals."""
    _ENTRY[:] = [True]


def _terminated(signum, frame):  # noqa: ARG001 - a signal handler's signature
    _STOPS.append(signum)
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM raises ``KeyboardInterrupt`` from now on, like Ctrl-C, and is recorded."""
    _STOPS.clear()
    if signal.getsignal(signal.SIGTERM) is not _terminated:
        _BEFORE[:] = [signal.getsignal(signal.SIGTERM)]
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


def _during_exit(signum, frame):  # noqa: ARG001 - a signal handler's signature
    if _SEEN:  # asked twice: the exit takes too long; end it now
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
                pass
        supervisor.finished(128 + signum)
        os._exit(128 + signum)
    _SEEN.append(signum)


def asked_to_stop() -> bool:
    """A signal (SIGINT, SIGTERM) arrived after the outcome was decided (:func:`decided`): a wait
    that only delays the exit can end now.

    >>> asked_to_stop()
    False
    """
    return bool(_SEEN)


def decided() -> None:
    """The outcome is decided: from now on no signal raises into what remains (the module docstring).

    Idempotent: a signal received between two calls still counts as the first. From another
    thread than the main one it does nothing (Python sets handlers there only).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if _ENTRY:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not _during_exit:
                signal.signal(sig, _during_exit)
    elif signal.getsignal(signal.SIGTERM) is _terminated:  # in-process: the caller's handler again
        signal.signal(signal.SIGTERM, _BEFORE[0] if _BEFORE else signal.SIG_DFL)


# Note [A signal reaches the main thread's waits]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Python runs signal handlers in the main thread only, and only between bytecodes. The kernel may
# hand a signal sent to the process (a Ctrl-C, a SIGTERM passed on by the supervising parent) to any
# thread that does not block it -- a hanging tool's, an HTTP pool's. The C-level handler then only
# sets a flag: a main thread blocked on a lock (``concurrent.futures.wait``, ``queue.get``,
# ``Condition.wait``) is not woken, and runs the handler when its wait ends -- at a tool's deadline,
# 60 s by default, or never, for a wait without one. (A CI run once saw one SIGINT to `srpo-graph
# train` take effect at a hanging tool's 60 s deadline, which is what this does; ``signal.pthread_kill``
# to a worker thread does it every time: tests/runtime/test_user_code_deadlines.py.) So every wait of
# the rollout's main thread -- the schedulers' (runtime/lockstep.py, runtime/streaming.py), a user
# call's (runtime/usercode.py),
# a backend's on its requests (:func:`result`: backends/sglang.py, backends/openai.py) -- returns to
# Python at least every SIGNAL_SLICE_S and waits again: one Ctrl-C stops a run within that, whichever
# thread took the signal; the waits' own deadlines are unchanged. (The overlapped stage's
# ``_cond.wait(0.5)``, train/rollout/overlapped.py, is the same rule.)
SIGNAL_SLICE_S = 0.5


def sliced(timeout: float | None) -> float:
    """The seconds one wait of the main thread may block: ``timeout`` (None: no deadline), at most
    :data:`SIGNAL_SLICE_S` (Note [A signal reaches the main thread's waits]).

    >>> sliced(None), sliced(60.0), sliced(0.01)
    (0.5, 0.5, 0.01)
    """
    return SIGNAL_SLICE_S if timeout is None else max(0.0, min(timeout, SIGNAL_SLICE_S))


def result(fut: Future) -> Any:
    """``fut.result()``, waited for in slices of :data:`SIGNAL_SLICE_S` (Note [A signal reaches the
    main thread's waits]); the future's own deadline is its work's.

    >>> f = Future(); f.set_result(3); result(f)
    3
    """
    while not wait([fut], timeout=SIGNAL_SLICE_S)[0]:
        pass
    return fut.result()


# Note [A process in a group ends without finalizing]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A process that joined a gloo process group (a torchrun rank, the rollout worker receiving
# weights, a trainer streaming weights to SGLang) can abort after its outcome is decided:
# "terminate called without an active exception", SIGABRT, exit 134 instead of the status chosen.
# Something still holds the group when the interpreter finalizes -- a module default captured at
# import (Note [Group defaults captured at import], train/parallel/collectives.py), or the frames
# of the exception that stopped the run (a full disk inside DCP's save: RunStopped keeps it as its
# __context__, and its frames hold the planner's group and work) -- so destroy_process_group cannot
# free it, and its gloo threads are still joinable when C++ destroys them. Imports before init
# closed the first way (5 of 5 runs); a two-rank FSDP run stopped by a full disk still ended 134
# once in a CI run of two pytest workers. Rather than chase every holder, such a process ends where
# its outcome is decided (:func:`end`): the ``atexit`` functions run (server stops, temporary
# folders, logging), the standard streams are flushed, and ``os._exit`` skips the interpreter's
# finalization, where the abort happens. A process that never joined a group exits as before.


# Note [A daemon thread at finalization]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Python up to 3.13 ends a daemon thread that wants the GIL during finalization with
# pthread_exit, which unwinds its C stack. Where that stack holds a Rust or C++ frame that calls
# back into Python -- pydantic-core running a Python validator, tokenizers, torch importing or
# running an op -- the unwind meets a catch that does not rethrow and glibc aborts the process:
# "FATAL: exception not rethrown", SIGABRT, exit 134 (CPython gh-87135; 3.14 leaves such threads
# hanging instead). Our commands leave daemon threads running on purpose: user code past its
# deadline is abandoned (runtime/usercode.py), and the language server's warm-up threads import
# pydantic models and transformers while an editor may already have said exit. `srpo-graph run`
# with a reward stuck in pydantic-core ended 134 after printing its result; `srpo-graph lsp` did
# so once in a CI run when exit came while its warm-up validated the grammar's models. So a
# command's process with a daemon thread still alive at its end takes the way out of Note [A
# process in a group ends without finalizing] -- after joining its non-daemon threads, as the
# interpreter's exit does first: atexit functions, flushed streams, os._exit with the status
# decided. A thread that is only waiting (a parent watch, a heartbeat) costs nothing
# on that way, and a process with no daemon thread left finalizes as before.


def joined_process_group() -> None:
    """This process joined a torch.distributed group: its command ends through :func:`end`."""
    _GROUPS[:] = [True]


def _daemon_thread_alive() -> bool:
    """Whether a daemon thread other than this one is alive (threads started outside Python that
    called into it count: they are daemons too)."""
    me = threading.current_thread()
    return any(t.daemon and t is not me and t.is_alive() for t in threading.enumerate())


def ends_without_finalizing() -> bool:
    """Whether :func:`end` ends this command's process, decided once (a traceback is printed by the
    caller when it does): it joined a process group (Note [A process in a group ends without
    finalizing]), or a daemon thread is still alive (Note [A daemon thread at finalization]).
    Never in-process (a test, a notebook): the caller's process is not ours to end."""
    if not _ENTRY:
        return False
    if not _ENDING:
        _ENDING.append(bool(_GROUPS) or _daemon_thread_alive())
    return _ENDING[0]


def end(code: int) -> None:
    """End a command's process now with exit status ``code`` when it must not finalize
    (:func:`ends_without_finalizing`); otherwise return, and the caller exits as usual. Call it
    where the outcome is decided, after :func:`supervisor.finished`."""
    if not ends_without_finalizing():
        return
    if not _GROUPS:  # as the interpreter's exit does first: join the other non-daemon threads
        shutdown = getattr(threading, "_shutdown", None)  # (what Py_FinalizeEx calls; in every 3.x)
        if shutdown is not None:
            shutdown()
    before_os_exit()
    os._exit(code)


def before_os_exit() -> None:
    """What the interpreter's exit does before it finalizes, for a process about to ``os._exit``: the
    ``atexit`` functions run (server stops, temporary folders, logging), the standard streams flushed."""
    import atexit

    try:
        atexit._run_exitfuncs()  # (what the interpreter would run first; it prints their errors itself)
    except BaseException:  # noqa: BLE001 - the exit status of record stands
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
