"""Trainer stage, parallel: torchrun's ranks forked from a process that has imported torch once.

Note [Ranks forked from a preloaded server]: every rank of a ``--nproc N`` job used to be a new
interpreter (``python -u -m srpo_graph.train``) that imported torch, transformers' modeling code and
the trainer before its first step: ~3.5-4 s of CPU a rank, the same work N times, on every node and
for every job -- most of a short job's CPU. torchrun can run the ranks as a function instead, each in
a process forked from multiprocessing's *forkserver*; :func:`prepare` has that server import
:data:`PRELOAD` once (in torchrun's wrapper, ``launch.main``, before the ranks start), so a rank
starts with them imported. A 2-rank, 2-step job on the tiny model (coord_seq, idle 2-core machine,
two runs each, the machine's CPU from ``/proc/stat``): 11.1-12.0 CPU-s as new interpreters, 7.4-7.6
CPU-s forked, in about the same time (6.6-7.2 s: the forkserver's imports are on the job's path once,
where the interpreters imported side by side).

The forkserver imports modules, nothing more: no process group, no tensor and no thread of torch's
or srpo-graph's is made there, whose state a fork would copy without the thread (with
``OMP_NUM_THREADS=1``, which torchrun sets for N ranks, it runs one thread; numpy's OpenBLAS, left
more threads, stops and restarts its idle pool around a fork itself; the check:
tests/train/test_forked_ranks.py). What a rank is stays as it was, and these are the differences,
each handled here:

* **It ends by returning.** torchrun's multiprocessing agent counts a rank done only when its
  function has returned a value, and a rank ends with ``os._exit`` (Note [A process in a group ends
  without finalizing], exiting.py), which would leave the job waiting for ever. A rank is supervised
  (supervisor.py) -- the child trains and ends with ``os._exit``; the parent, the process torchrun
  started, ends with ``sys.exit(status)``, which torchrun reads as returned when the status is 0 and
  as the rank's exit code otherwise. Unsupervised (``SRPO_GRAPH_SUPERVISE=0``) the ranks are
  started as before (:func:`enabled`).
* **Its parent is the forkserver, not torchrun.** The forkserver lives as long as torchrun (it exits
  when torchrun's end closes its pipe), so the rank watches it (Note [Parent death], launch.py);
  multiprocessing's own ``PR_SET_PDEATHSIG`` (SIGINT) is cleared: one watch, one signal.
* **It is in a session of its own** (``os.setsid``), as torchrun's subprocess ranks are: a signal
  to torchrun's process group (a terminal's Ctrl-C) reaches a rank once, passed on by torchrun.
* **Its streams are unbuffered** (``PYTHONUNBUFFERED``, set before the forkserver starts), as
  ``python -u`` made them (and so are those of the processes it starts).
* **torchrun's line for a failed rank** has no traceback: its multiprocessing poll logs the rank's exit
  status as an exception (:func:`prepare` drops the traceback; the rank has said why it stopped).
* **Its name** (``/proc/PID/comm``, what ``top`` shows) is ``srpo-rank<RANK>``: its command line is
  the forkserver's, and its environment of record (``/proc/PID/environ``) has no ``RANK``.

``SRPO_GRAPH_RANK_START=exec`` starts every rank as a new interpreter again (a profiler, a debugger, a
platform without ``fork``).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from srpo_graph import supervisor

START_ENV = "SRPO_GRAPH_RANK_START"  # "exec": each rank a new interpreter; default: forked (this Note)
# what a rank imports before its first step, imported once in the forkserver: torch with the
# distributed package, transformers' modeling code (torch._dynamo, torch.distributed.tensor, sympy),
# and the trainer with its stages
PRELOAD = ("torch", "torch.distributed", "transformers.modeling_utils", "srpo_graph.train.commands",
           "srpo_graph.train.trainer")
__all__ = ["PRELOAD", "START_ENV", "enabled", "prepare", "rank"]


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


def prepare() -> None:
    """In torchrun's process, before it starts the ranks: the forkserver will import :data:`PRELOAD`,
    and its streams (the ranks') are unbuffered; torchrun's line for a failed rank comes without the
    traceback of its own poll (as for a rank started as a new interpreter: the rank has said why)."""
    import logging
    import multiprocessing

    os.environ["PYTHONUNBUFFERED"] = "1"
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_without_traceback)


def _without_traceback(record) -> bool:
    """A logging filter: the record without its exception's traceback (``logger.exception`` in
    torchrun's multiprocessing poll, where a rank's exit status is an exception)."""
    record.exc_info = record.exc_text = None
    return True


def rank(argv: list[str]) -> NoReturn:
    """One rank, as torchrun's forked function: ``python -m srpo_graph.train ARGV``'s work, supervised,
    ending by ``sys.exit`` in the process torchrun started (this Note)."""
    from srpo_graph.train.parallel.launch import PARENT_ENV

    os.setsid()  # a session of its own, as torchrun's subprocess ranks
    _no_death_signal()
    os.environ.pop(PARENT_ENV, None)  # (torchrun's pid: this rank watches its own parent, below)
    number = os.environ.get("RANK", "?")
    _name(f"srpo-rank{number}")
    # the parent returns into torchrun through sys.exit; the child goes on and trains
    supervisor.supervise(f"train (rank {number})", watch_parent=os.getppid(), exit=sys.exit)
    if not supervisor.supervised():  # no fork (out of memory): a rank that cannot end by returning
        print("srpo-graph train: a rank could not start its supervised process (fork failed)", file=sys.stderr)
        os._exit(1)
    os._exit(_run(argv))


def _run(argv: list[str]) -> int:
    """``python -m srpo_graph.train ARGV`` in this process; its exit status, after what an interpreter's
    exit does but finalizing (``atexit``, flushed streams)."""
    import atexit
    import traceback

    from srpo_graph import exiting
    from srpo_graph.train.__main__ import main

    exiting.as_entry_point()
    code = 1
    try:
        main(argv)  # (a rank that joined its process group ends inside: exiting.end)
        code = 0
    except SystemExit as exc:
        code = supervisor.exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, the process's status stands
        if not exiting.in_process_group():  # (main printed it already)
            traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the exit status of record stands
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
    return code


def _no_death_signal() -> None:
    """Clear the ``PR_SET_PDEATHSIG`` torch's multiprocessing wrapper set (SIGINT when the forkserver
    ends): the rank's watch of its parent sends the one signal (Note [Parent death])."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 0)  # PR_SET_PDEATHSIG, none
    except (OSError, AttributeError):
        pass


def _name(name: str) -> None:
    """This process's name (``/proc/PID/comm``, 15 bytes; Linux ``PR_SET_NAME``)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":  # torchrun's ``--run-path`` runs this file in each forked rank
    rank(sys.argv[1:])
