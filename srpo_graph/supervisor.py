"""A thin supervising parent for the commands that run user code, and the record it reads.

Note [User code that ends the process]: a workflow's Python (rewards, tools, extractors, the
modules a ``.wf`` imports) runs in the command's own process, and what it raises is bounded
(``runtime/usercode.py``: ``SystemExit`` fails the episode). What it does *not* raise is not:
``os._exit(0)``, ``os.kill(os.getpid(), SIGKILL)``, a segfault in a C extension end the process
where no ``except`` runs, and ``run`` / ``train`` used to exit 0 with nothing said. So user code
runs where its death is observed and reported -- a child process, as the rollout worker
(``train/rollout/worker``: its trainer names the worker's exit code) and the language server's
imports (``lsp/imports.py``) already do -- and the command's own process is that child:

* :func:`supervise` forks at the very start of the commands that run user code (``cli.SUPERVISED``:
  ``run``, ``train``, ``eval``; ``check``, ``viz``, ``show`` import a ``.wf``'s modules) and of each
  ``torchrun`` rank (``train/__main__.py``), before click, pydantic and torch are imported: one
  ``fork()`` of a small process (a few ms) per command, nothing per user call. The
  child does the work; the parent waits and passes on the signals sent to it (SIGINT, SIGTERM,
  SIGHUP), except one the terminal sent to the whole process group, which the child, in that
  group, got as well: Ctrl-C, Ctrl-Z and a debugger in user code work as before. Out of a
  terminal's foreground (no terminal, a background job, a torchrun rank, which torchrun stops with
  ``killpg``) the child is put in a process group of its own, so that a signal to the command's
  group reaches it once, passed on. (In the foreground, a signal a *process* sends to the whole
  group, ``kill -- -PGID``, reaches the child twice.) The child gets SIGTERM if the parent dies
  (``PR_SET_PDEATHSIG``).
* the parent and child share one page (an anonymous shared ``mmap``, no file, no syscall per
  write): the child writes there the user calls running now (:class:`running`, around every user
  call: ``usercode.call``, a firing's tools, a module's import), what ``train`` would say to
  resume (:func:`note_stop`), and, as its last act on the normal path, its exit status
  (:func:`finished`: ``cli.main``, and every ``os._exit`` of srpo-graph's own).
* a child that ends without :func:`finished` died outside srpo-graph's control: the parent prints
  one line -- how it ended (an exit status, or a signal: SIGSEGV and its kin as a crash in native
  code) and the user call that was running -- then ``train``'s resume lines, and exits
  :data:`USER_EXIT` (an exit status) or ``128 + N`` (signal N). A finished child's status is the
  parent's, so every exit of record (130 on Ctrl-C, an error class's code) is unchanged; a child
  killed by the very signal sent to the command (SIGTERM to ``run``) ends the parent the same way.

Why not only the user calls in a persistent child: each call would cross a process boundary with
its arguments and the episode's state (pickled; a user function may keep module state between
calls), a round trip per call on top of today's thread start (~0.2 ms), and ``check``'s imports
would still run here. The fork costs once per command -- measured on the shared 2-core machine:
+2 ms at the start (the fork, the shared page, prctl) and +8 ms at the end (the parent waking to
exit) under a load of ~3, +7 / +30 ms under ~17; ``srpo-graph run`` on coord_seq, 5 interleaved
pairs: 8.99 s supervised, 9.02 s not (medians) -- and :class:`running` ~15 us per user call.

In-process callers (a test's ``CliRunner``, a notebook) are not supervised: :func:`running` and
:func:`finished` do nothing there. ``SRPO_GRAPH_SUPERVISE=0`` turns the fork off (a profiler, a
debugger attached to the command's pid); platforms without ``sigwaitinfo`` (macOS) run unsupervised.
"""

from __future__ import annotations

import itertools
import mmap
import os
import signal
import sys
import threading
from typing import Any, Callable

OFF_ENV = "SRPO_GRAPH_SUPERVISE"  # "0": commands run in one process, unsupervised
USER_EXIT = 8  # the exit status of a command whose process exited outside srpo-graph (errors.EXIT_CODES)
_NATIVE_CRASHES = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}
_SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel sent (the terminal's Ctrl-C to its foreground group)
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# the shared page: [0] b"F" once finished, [1:5] its exit status; then two length-prefixed texts
_SIZE, _RUNNING_AT, _RUNNING_LEN, _STOP_AT = 4096, 64, 960, 1024
_STOP_LEN = _SIZE - _STOP_AT

_RECORD: list[Any] = []  # the shared page, in a supervised child only
_LOCK = threading.Lock()
_NOW: dict[int, str] = {}  # the user calls running now, oldest first
_KEYS = itertools.count()


# ----------------------------------------------------------------------------- the child's side


def _write(at: int, size: int, text: str) -> None:
    data = text.encode("utf-8", "replace")[: size - 4]
    page = _RECORD[0]
    page[at + 4 : at + 4 + len(data)] = data  # the text before its length: a torn write reads short
    page[at : at + 4] = len(data).to_bytes(4, "little")


def _read(page: Any, at: int, size: int) -> str:
    n = min(int.from_bytes(page[at : at + 4], "little"), size - 4)
    return page[at + 4 : at + 4 + n].decode("utf-8", "replace")


class running:
    """``with running("reward m.f (a.wf:3:9)"):`` around a user call: the parent names it if the
    process dies during the call (Note [User code that ends the process]). A no-op unsupervised.

    >>> with running("tool 't' m.f"):
    ...     pass
    """

    __slots__ = ("what", "key")

    def __init__(self, what: str):
        self.what, self.key = what, -1

    def __enter__(self) -> "running":
        if _RECORD:
            with _LOCK:
                self.key = next(_KEYS)
                _NOW[self.key] = self.what
                _write_running()
        return self

    def __exit__(self, *exc: object) -> None:
        if _RECORD and self.key >= 0:
            with _LOCK:
                _NOW.pop(self.key, None)
                _write_running()


def _write_running() -> None:
    newest = next(reversed(_NOW.values()), "")
    _write(_RUNNING_AT, _RUNNING_LEN, f"{len(_NOW)}\n{newest}" if _NOW else "")


def note_stop(text: str) -> None:
    """What the parent prints after its one line if the process dies (``train``: where the run
    stands and the command that resumes it); replaces the earlier note. A no-op unsupervised."""
    if _RECORD:
        with _LOCK:
            _write(_STOP_AT, _STOP_LEN, text)


def finished(code: int) -> None:
    """The command ends on its normal path with exit status ``code`` (a no-op unsupervised)."""
    if _RECORD:
        page = _RECORD[0]
        page[1:5] = int(code).to_bytes(4, "little", signed=True)
        page[0:1] = b"F"


def exit_status(code: object) -> int:
    """The exit status Python gives ``SystemExit(code)``.

    >>> exit_status(None), exit_status(3), exit_status("bad")
    (0, 3, 1)
    """
    return 0 if code is None else code if isinstance(code, int) else 1


# ----------------------------------------------------------------------------- the parent's side


def how_it_ended(status: int) -> tuple[str, int]:
    """The words for a child's wait ``status`` that did not finish, and the parent's exit code.

    >>> how_it_ended(0)
    ("it exited with status 0 outside srpo-graph's own exit (os._exit or a library's exit)", 8)
    >>> how_it_ended(signal.SIGSEGV)[0]
    'it crashed in native code (SIGSEGV, signal 11)'
    >>> how_it_ended(signal.SIGKILL)
    ('it was killed by SIGKILL (signal 9)', 137)
    """
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"it exited with status {code} outside srpo-graph's own exit (os._exit or a library's exit)", USER_EXIT
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "an unknown signal"
    if name in _NATIVE_CRASHES:
        return f"it crashed in native code ({name}, signal {-code})", 128 - code
    return f"it was killed by {name} (signal {-code})", 128 - code


def report(command: str, status: int, page: Any) -> tuple[str, int]:
    """The parent's message about a child that ended with wait ``status`` without finishing, and the
    exit code; reads the user call that was running and the stop note from ``page``."""
    how, code = how_it_ended(status)
    count, _, newest = _read(page, _RUNNING_AT, _RUNNING_LEN).partition("\n")
    if newest:
        others = int(count) - 1 if count.isdigit() else 0
        more = f" (and {others} other user call{'s' * (others > 1)})" if others > 0 else ""
        during = f"while running {newest}{more}"
    else:
        during = "while no user code was running"
    line = f"srpo-graph {command}: the process ended before the command finished: {how} {during}"
    stop = _read(page, _STOP_AT, _STOP_LEN)
    return line + (f"\n{stop}" if stop else ""), code


def supervise(command: str, *, watch_parent: int | None = None, exit: Callable[[int], Any] = os._exit) -> None:
    """Fork: the child returns from this call and runs the command; the parent waits for it, passes
    signals on, reports a death outside the normal path, and exits with the command's status --
    it never returns (Note [User code that ends the process]).

    Args:
        command: the subcommand's name, for the parent's line (``srpo-graph train: ...``).
        watch_parent: a pid whose end the parent passes on to the child as SIGTERM: a rank's
            torchrun (train/parallel/launch.py, Note [Parent death]) -- the parent of a rank started
            as a new interpreter, the grandparent of a forked one (Note [Ranks forked from a
            preloaded server], train/parallel/forked.py).
        exit: how the parent ends with the status: ``os._exit`` (nothing of the parent's needs a
            shutdown), or a function that returns into torchrun's agent (a forked rank); that one is
            called with the parent's signals unblocked again.
    """
    if os.environ.get(OFF_ENV) == "0" or not hasattr(signal, "sigwaitinfo") or not hasattr(os, "fork"):
        return
    page = mmap.mmap(-1, _SIZE)  # anonymous and shared: the child's writes are the parent's to read
    waited = {*_FORWARDED, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, waited)  # nothing is lost between fork and wait
    own_group, parent = not _in_the_foreground(), os.getpid()
    try:
        pid = os.fork()
    except OSError:  # no fork: run unsupervised
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return
    if pid == 0:
        if own_group:
            os.setpgid(0, 0)
        _RECORD[:] = [page]
        die_with_parent(parent)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return
    if own_group:
        try:  # (set on both sides: whichever runs first)
            os.setpgid(pid, pid)
        except OSError:
            pass
    code = _wait(command, pid, page, own_group, watch_parent)
    try:
        sys.stderr.flush()
    finally:  # nothing of the parent's needs a shutdown: the command's status at once
        if exit is not os._exit:  # (back into a caller that must still be stoppable by a signal)
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        exit(code)
    raise AssertionError("unreachable: the supervising parent ended above")


def supervised() -> bool:
    """Whether this process is a supervised child (:func:`supervise` forked it)."""
    return bool(_RECORD)


def _wait(command: str, pid: int, page: Any, own_group: bool, watch_parent: int | None) -> int:
    waited = {*_FORWARDED, signal.SIGCHLD}
    received: set[int] = set()  # the signals sent to the command from outside (passed on, or the terminal's)
    watched = False  # the parent's end was passed on as SIGTERM
    ended = _ended(watch_parent) if watch_parent else None
    while True:
        info = signal.sigtimedwait(waited, 0.5) if ended else signal.sigwaitinfo(waited)
        if info is None:  # (watching a parent) a look at it every half second
            if ended is not None and not received and ended():
                received.add(signal.SIGTERM)
                watched = True
                _send(pid, signal.SIGTERM)
            continue
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                break
            continue
        if watched and info.si_signo == signal.SIGTERM:  # the stop the watch passed on already: once
            watched = False
            continue
        received.add(info.si_signo)
        if own_group or info.si_code != _SI_KERNEL:  # the terminal's own reached the child already
            _send(pid, info.si_signo)
    code = os.waitstatus_to_exitcode(status)
    if page[0:1] == b"F":  # finished on the normal path: its status (a later os._exit(0) cannot make it 0)
        said = int.from_bytes(page[1:5], "little", signed=True)
        return said if code == 0 else code if code > 0 else 128 - code
    if code < 0 and -code in received:  # ended by the signal sent to the command: end as it would have alone
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
        return 128 - code  # (a signal whose default is not to end the process)
    message, code = report(command, status, page)
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except OSError:
        pass
    return code


def _ended(pid: int) -> Callable[[], bool]:
    """A look at whether process ``pid`` has ended: this process's parent has once this process has
    another (init, a subreaper); any other process, once its pidfd reads ready (Linux 5.3+; elsewhere
    once ``kill(pid, 0)`` finds no process)."""
    if pid == os.getppid():
        return lambda: os.getppid() != pid
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # ended already
        return lambda: True
    except (AttributeError, OSError):
        return lambda: not _exists(pid)
    import select

    poller = select.poll()  # (readable once the process has ended; poll: any descriptor number)
    poller.register(fd, select.POLLIN)
    return lambda: bool(poller.poll(0))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def _in_the_foreground() -> bool:
    """This process is in its terminal's foreground process group: the terminal's Ctrl-C and Ctrl-Z
    reach the whole group (not so in the background, without a terminal, or in a session of its
    own -- a torchrun rank, which torchrun signals with ``killpg``)."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:  # not a terminal, or not this session's
            continue
    return False


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone already
        pass


def die_with_parent(parent: int) -> None:
    """This process gets SIGTERM when its parent ``parent`` dies, at once if it has (Linux; elsewhere
    nothing): a killed parent must not leave a command running unseen (``train`` stops with its resume
    line). Also a forked rank that has returned its value to torchrun (train/parallel/forked.py)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["OFF_ENV", "USER_EXIT", "die_with_parent", "finished", "note_stop", "running", "supervise", "supervised"]
