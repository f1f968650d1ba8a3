"""Trainer stage, parallel: torchrun's ranks forked from a process that has imported torch once.

Note [Ranks forked from a preloaded server]: every rank of a ``--nproc N`` job used to be a new
interpreter (``python -u -m srpo_graph.train``) that imported torch, transformers' modeling code and
the trainer before its first step: ~3.5-4 s of CPU a rank, the same work N times, on every node and
for every job -- most of a short job's CPU. torchrun can run the ranks as a function instead, each in
a process forked from multiprocessing's *forkserver* (``--run-path``: torchrun runs ``train/__main__.py`` there, which
calls :func:`rank`); :func:`prepare` has that server import
:data:`PRELOAD` once (in torchrun's wrapper, ``launch.main``, before the ranks start), so a rank
starts with them imported. A 2-rank, 2-step job on the tiny model (coord_seq, idle 2-core machine,
three runs each, every process of the job counted in a cpuacct cgroup): 11.6-12.1 CPU-s as new
interpreters, 8.8-10.4 CPU-s forked, in about the same time (7.0-8.4 s against 7.4-8.0 s: the
forkserver's imports are on the job's path once, where the interpreters imported side by side). The
forkserver's own imports cost more in a job than alone (4.9-5.4 against 3.8 CPU-s), so the saving is
~2-3 CPU-s a job, not a rank's whole import. The server itself is now forked from the wrapper once the
wrapper has imported PRELOAD, not started as a new interpreter that imports torch a second time
(Note [The forkserver is forked], below).

The forkserver imports modules, nothing more: no process group, no tensor, no CUDA context (an import
that asks whether CUDA is there asks NVML: ``PYTORCH_NVML_BASED_CUDA_CHECK``) and no thread of torch's
or srpo-graph's is made there, whose state a fork would copy without the thread (with
``OMP_NUM_THREADS=1``, which torchrun sets for N ranks, it runs one thread; numpy's OpenBLAS, left
more threads, stops and restarts its idle pool around a fork itself; the check:
tests/train/test_forked_ranks.py). What a rank is stays as it was, and these are the differences,
each handled here:

* **It ends by returning.** torchrun's multiprocessing agent counts a rank done only when its
  function has returned a value, and a rank ends with ``os._exit`` (Note [A process in a group ends
  without finalizing], exiting.py), which would leave the job waiting for ever. A rank is supervised
  (supervisor.py) -- the child trains and ends with ``os._exit``; the parent, the process torchrun
  started, ends with ``sys.exit(status)`` and its signals unblocked, which torchrun reads as returned
  when the status is 0 and as the rank's exit code otherwise. Unsupervised
  (``SRPO_GRAPH_SUPERVISE=0``) the ranks are started as new interpreters (:func:`enabled`).
* **Its parent is the forkserver, not torchrun.** The rank watches torchrun, its grandparent, through
  a pidfd (Note [Parent death], launch.py), and multiprocessing's own ``PR_SET_PDEATHSIG`` (SIGINT)
  is cleared while it works: one watch, one signal. multiprocessing gives every process it forks a
  copy of the forkserver's "alive" pipe, and the server runs until every copy is closed: a rank closes
  its own, so the server ends with torchrun -- and a rank that has returned its value ends with the
  server (``PR_SET_PDEATHSIG`` again), should torchrun be killed before it has read it.
* **The forkserver never receives SIGTERM, SIGHUP or SIGQUIT** (blocked, :func:`prepare`): it is in
  torchrun's process group, and a scheduler's signal to the group would end it, and with it the
  pipes torchrun reads its ranks' exits from (torchrun would take every rank for gone while they still
  stop). The ranks unblock them.
* **It is in a session of its own** (``os.setsid``), as torchrun's subprocess ranks are: a signal
  to torchrun's process group (a terminal's Ctrl-C) reaches a rank once, passed on by torchrun.
* **Its streams are unbuffered** (``PYTHONUNBUFFERED``, set before the forkserver starts), as
  ``python -u`` made them (and so are those of the processes it starts); its standard input is
  ``/dev/null`` (multiprocessing's), so ``breakpoint()`` in a rank needs ``SRPO_GRAPH_RANK_START=exec``.
* **Its default multiprocessing start method** is the platform's again (a forked process inherits
  ``forkserver``), for user code that starts processes.
* **torchrun's line for a failed rank** has no traceback: its multiprocessing poll logs the rank's exit
  status as an exception (:func:`prepare` drops the traceback; the rank has said why it stopped). That
  poll reports the first rank it finds failed, not every one; a rank that stops as a consequence waits
  before it exits (Note [The job fails with its cause], launch.py), so the first is the cause.
* **Its name** (``/proc/PID/comm``, what ``top`` shows) is ``srpo-rank<RANK>``: its command line is
  the forkserver's, and its environment of record (``/proc/PID/environ``) has no ``RANK``.

``SRPO_GRAPH_RANK_START=exec`` starts every rank as a new interpreter again (a profiler, a debugger, a
platform without ``fork``).
"""

from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn

from srpo_graph import supervisor

START_ENV = "SRPO_GRAPH_RANK_START"  # "exec": each rank a new interpreter; default: forked (this Note)
# what a rank imports before its first step, imported once in the forkserver: torch with the
# distributed package, transformers' modeling code (torch._dynamo, torch.distributed.tensor, sympy),
# and the trainer with its stages
PRELOAD = ("torch", "torch.distributed", "transformers.modeling_utils", "srpo_graph.train.commands",
           "srpo_graph.train.trainer")
__all__ = ["PRELOAD", "START_ENV", "enabled", "prepare", "rank"]
_SERVER_BLOCKS = ("SIGTERM", "SIGHUP", "SIGQUIT")  # what the forkserver never receives (prepare)
_SERVER: list[int] = []  # in a rank: the forkserver it was forked from


def enabled() -> bool:
    """Whether torchrun's ranks are forked from a preloaded forkserver (this Note) on this machine.

    >>> os.environ[START_ENV] = "exec"; enabled()
    False
    >>> del os.environ[START_ENV]
    """
    return (
        os.environ.get(START_ENV, "forkserver") != "exec"
        and os.environ.get(supervisor.OFF_ENV) != "0"
        and sys.platform.startswith("linux")
    )


def prepare(nproc: int) -> None:
    """In torchrun's process, before it imports torch or starts a thread: import :data:`PRELOAD` here
    and fork the forkserver from this process (:func:`_fork_server`; Note [The forkserver is forked]),
    with unbuffered streams (the ranks'), the environment torchrun gives ranks (``OMP_NUM_THREADS=1``
    for several, unless set), and SIGTERM, SIGHUP and SIGQUIT blocked (a signal to torchrun's whole
    process group must not end the server whose pipes torchrun reads its ranks' exits from; the mask is
    inherited across the fork, as multiprocessing's resource tracker is started; :func:`rank` unblocks
    them, and one sent to a rank before then is delivered there). torchrun's line for a failed rank
    comes without the traceback of its own poll (as for a rank started as a new interpreter: the rank
    has said why it stopped)."""
    import importlib
    import logging
    import multiprocessing
    import signal
    from multiprocessing import forkserver, resource_tracker

    os.environ["PYTHONUNBUFFERED"] = "1"
    # an import that asks whether CUDA is there must not initialise it in the server: a process forked
    # after that cannot use CUDA ("Cannot re-initialize CUDA in forked subprocess"); torch asks NVML instead
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if nproc > 1:  # (torchrun's own rule, applied later than the server starts; read as torch loads OpenMP)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_without_traceback)
    # (first: its start unblocks SIGINT and SIGTERM rather than restoring the mask)
    resource_tracker.ensure_running()
    forkable = _forkable()
    if forkable:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:  # (as multiprocessing's own server: the rank that needs it says so)
                pass
    else:  # a Python whose forkserver protocol is not 3.10-3.13's: its own server, a new interpreter
        multiprocessing.set_forkserver_preload(list(PRELOAD))
    # (blocked in this thread alone: one sent to torchrun meanwhile waits, or reaches another thread)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, name) for name in _SERVER_BLOCKS])
    try:
        if forkable:
            _fork_server()
        else:
            forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


# Note [The forkserver is forked]
#     multiprocessing starts its forkserver as a new interpreter (``python -c 'from
#     multiprocessing.forkserver import main; main(...)'``), which imported torch, transformers'
#     modeling code and the trainer (:data:`PRELOAD`) while torchrun's wrapper, the process that starts
#     it, had imported torch for torchrun already: torch twice, and an interpreter's start, in every
#     job on every node. So :func:`prepare` imports PRELOAD in the wrapper itself, which needs torch
#     anyway, and forks the server from it, before torchrun runs: one thread then (no store, timer or
#     parent watch yet; the wrapper starts them after), nothing buffered in its streams (flushed before
#     the fork), and the server runs multiprocessing's own loop, ``forkserver.main``, on a listener and
#     "alive" pipe made as ``ForkServer.ensure_running`` makes them, which are then recorded where
#     ``ensure_running`` records its server -- so torchrun's ``ensure_running`` finds it running, and
#     its ranks are forked from it as before. The server's streams are made unbuffered, as the new
#     interpreter's were (``PYTHONUNBUFFERED``), and it ends by ``os._exit``: the wrapper's ``atexit``
#     work is the wrapper's. A 2-rank, 2-step job: benchmarks/bench_forkserver.py (docs/performance.md);
#     see the docs for what it saves. Only where ``forkserver.main`` has the signature of Python
#     3.10-3.13 (3.14 adds an authentication key), and not with ``SRPO_GRAPH_FORKSERVER=exec`` (the
#     benchmark's baseline): elsewhere multiprocessing's own server, a new interpreter.
SERVER_ENV = "SRPO_GRAPH_FORKSERVER"  # "exec": multiprocessing's own forkserver, a new interpreter
_MAIN_PARAMS = ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]


def _forkable() -> bool:
    """Whether this Python's forkserver can be forked here (Note [The forkserver is forked])."""
    import inspect
    from multiprocessing import forkserver

    if os.environ.get(SERVER_ENV) == "exec":
        return False
    server = getattr(forkserver, "_forkserver", None)
    try:
        params = list(inspect.signature(forkserver.main).parameters)
    except (TypeError, ValueError):
        return False
    return (
        hasattr(os, "fork")
        and params == _MAIN_PARAMS
        and all(hasattr(server, a) for a in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"))
        and getattr(server, "_forkserver_pid", 0) is None
    )


def _fork_server() -> None:
    """Fork multiprocessing's forkserver from this process and record it as multiprocessing's own
    (Note [The forkserver is forked])."""
    import socket
    from multiprocessing import connection, forkserver, util

    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # (not in the stubs)
    listener = socket.socket(socket.AF_UNIX)
    alive_r, alive_w = os.pipe()
    try:
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        pid = os.fork()
        if pid == 0:  # the server
            code = 1
            try:
                os.close(alive_w)
                _unbuffered_streams()
                forkserver.main(listener.fileno(), alive_r, [])  # (PRELOAD is imported: nothing more)
            except SystemExit:  # every process it served has ended (its own way out)
                code = 0
            except BaseException:  # noqa: BLE001 - said, then the server's status
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
    except BaseException:
        os.close(alive_w)
        raise
    finally:
        os.close(alive_r)
        listener.close()
    server = forkserver._forkserver
    setattr(server, "_forkserver_address", address)  # (what ensure_running records; not in the type stubs)
    setattr(server, "_forkserver_alive_fd", alive_w)
    setattr(server, "_forkserver_pid", pid)


def _unbuffered_streams() -> None:
    """Standard output and error as ``python -u`` makes them: written through to the file at once."""
    import io

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        if old is None:
            continue
        try:
            fd = old.fileno()
        except (OSError, ValueError, AttributeError):
            continue
        new = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                               write_through=True)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _without_traceback(record) -> bool:
    """A logging filter: the record without its exception's traceback (``logger.exception`` in
    torchrun's multiprocessing poll, where a rank's exit status is an exception)."""
    record.exc_info = record.exc_text = None
    return True


def rank(main: Callable[[list[str]], None], argv: list[str], *, torchrun: int | None) -> NoReturn:
    """One rank, in a process torchrun forked (this Note): ``main(argv)`` (``python -m srpo_graph.train
    ARGV``'s), supervised, ending by ``sys.exit`` in the process torchrun started; the rank stops when
    the process ``torchrun`` is gone (Note [Parent death])."""
    import multiprocessing
    import signal

    _SERVER[:] = [os.getppid()]
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [getattr(signal, name) for name in _SERVER_BLOCKS])  # (prepare)
    os.setsid()  # a session of its own, as torchrun's subprocess ranks
    _no_death_signal()
    _let_the_server_go()
    multiprocessing.set_start_method(None, force=True)  # user code's multiprocessing: the platform's default again
    number = os.environ.get("RANK", "?")
    _name(f"srpo-rank{number}")
    # the parent returns into torchrun through sys.exit; the child goes on and trains
    supervisor.supervise(f"train (rank {number})", watch_parent=torchrun, exit=_return_to_torchrun)
    if not supervisor.supervised():  # no fork (out of memory): a rank that cannot end by returning
        print("srpo-graph train: a rank could not start its supervised process (fork failed)", file=sys.stderr)
        os._exit(1)
    os._exit(_run(main, argv))


def _return_to_torchrun(code: int) -> NoReturn:
    """The supervising parent's end: status 0 returns to torchrun's agent (``SystemExit(0)`` is a
    returned value there), another is the process's exit status (a status that is 0 modulo 256 would
    read as 0 without a returned value, and the job would wait for it: 1 instead). While the agent reads
    the value, the rank ends if the forkserver does (torchrun is gone: :func:`_let_the_server_go`)."""
    if _SERVER:  # SIGTERM (its default action) when the forkserver ends, or at once if it has
        supervisor.die_with_parent(_SERVER[0])
    sys.exit(code if 0 <= code <= 255 else (code & 0xFF) or 1)


def _run(main: Callable[[list[str]], None], argv: list[str]) -> int:
    """``main(argv)`` in this process; its exit status, after what an interpreter's exit does but
    finalizing (``atexit``, flushed streams)."""
    import traceback

    from srpo_graph import exiting

    exiting.as_entry_point()
    code = 1
    try:
        main(argv)  # (a rank that joined its process group ends inside: exiting.end)
        code = 0
    except SystemExit as exc:
        code = supervisor.exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, the process's status stands
        if not exiting.ends_without_finalizing():  # (main printed it already)
            traceback.print_exc()
        code = 1
    exiting.before_os_exit()
    return code


def _no_death_signal() -> None:
    """Clear the ``PR_SET_PDEATHSIG`` torch's multiprocessing wrapper set (SIGINT when the forkserver
    ends): while the rank works, its watch of torchrun sends the one signal (Note [Parent death])."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 0)  # PR_SET_PDEATHSIG, none
    except (OSError, AttributeError):
        pass


def _let_the_server_go() -> None:
    """Close this process's copy of the forkserver's "alive" pipe: multiprocessing hands one to every
    process it forks there, and the server ends only when every copy is closed. With only torchrun's
    left, the forkserver ends with torchrun, and does not outlive it for as long as the ranks run."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # (multiprocessing's own record in a forked process: _serve_one)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        setattr(server, "_forkserver_alive_fd", None)  # (not in the type stubs)


def _name(name: str) -> None:
    """This process's name (``/proc/PID/comm``, 15 bytes; Linux ``PR_SET_NAME``)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass

