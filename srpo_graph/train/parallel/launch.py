"""Trainer stage, parallel: starting a job under torchrun, and the wrapper torchrun runs as.

Consumes the number of processes per node, the node's place in a multi-node job and the
``srpo-graph train`` arguments; produces torchrun's command line (:func:`torchrun_command`), runs
it (:func:`launch`: a signal to the launcher is passed on, the ranks stop like one process, a
second signal or a rank that does not stop in time is killed with its whole process tree), and is
the module torchrun itself runs through (:func:`main`, ``python -m
srpo_graph.train.parallel.launch``): a failed rank's own exit code, no torchrun traceback.

Note [Parent death]: a signal to the launcher is passed on, but ``kill -9`` cannot be: torchrun and
the ranks once trained on without it, holding the run lock (issue 40). So each process of the job
watches the parent that started it (:func:`stop_with_parent`): torchrun watches the launcher, each
rank watches torchrun (the launcher and torchrun name themselves in :data:`PARENT_ENV`; a rank forked
from the preloaded forkserver watches its grandparent: Note [Ranks forked from a preloaded server],
forked.py). When the
parent is gone, the process sends itself SIGTERM -- once: a second would cut short the stop it
starts -- and stops as if the launcher had passed one on: torchrun stops the ranks, a rank stops
with the resume line. A thread polling the parent's pid, not ``PR_SET_PDEATHSIG``: the latter fires
when the *thread* that started the child ends, and torchrun's agent is not ours to audit.

Note [The job fails with its cause]: when one rank fails, the others stop too -- their next
collective finds the peer gone ("another rank of the job stopped answering", exit 1) -- and torchrun
reports the failure with the smallest timestamp, in whole seconds (a rank that wrote no error file
gets the time torchrun saw it), ties going to the one it recorded first (in one poll, the lowest
rank). So a rank 1 ended by user code (exit 8) and rank 0 stopping because of it, in the same
second, made the job exit 1, not 8 (a CI run); and a rank 0 seen a poll before its cause was seen
made it so too. A rank whose stop is a consequence says so (:func:`stopped_after_another_rank`): it
writes the error file torchrun gives each rank (``TORCHELASTIC_ERROR_FILE``) with a mark, and it
waits a moment before it exits, long enough for torchrun to see the cause first (torchrun then ends
it, as it ends every survivor). The launcher takes the first failure that is not a consequence
(:func:`cause_of`); only when every failed rank is one (the cause is on another node) is the job's
status a consequence's.

It knows nothing about workflows, configs or models.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

from srpo_graph import exiting
from srpo_graph.errors import ConfigError
from srpo_graph.train.parallel import forked as forked_ranks


def torchrun_command(nproc: int, argv: Sequence[str], *, nnodes: int = 1, node_rank: int = 0,
                     endpoint: str | None = None, timeout: float = 600.0, forked: bool | None = None) -> list[str]:
    """The torchrun command line of one node: ``--standalone`` on one node; several nodes meet at
    ``endpoint`` (``HOST:PORT`` of node 0, static rendezvous: node K's ranks are K*nproc..), each
    waiting at most ``timeout`` seconds for the others (a node that never comes ends the job).

    torchrun runs through :func:`main` below, which exits with the failed rank's own exit code
    and without torchrun's traceback (the rank has printed its error already). Its ranks are forked
    from a forkserver that has imported torch and the trainer once (``forked``, default
    :func:`forked.enabled`: Note [Ranks forked from a preloaded server]), or else each is
    ``python -u -m srpo_graph.train``.

    >>> torchrun_command(2, ["a.wf"], forked=False)[-5:]
    ['--standalone', '--nproc_per_node=2', '-m', 'srpo_graph.train', 'a.wf']
    >>> torchrun_command(2, ["a.wf"], forked=True)[-5:-2]
    ['--nproc_per_node=2', '--run-path', '--start-method=forkserver']
    >>> torchrun_command(1, ["a.wf"], nnodes=2, node_rank=1, endpoint="10.0.0.1:29500", forked=False)[-9:-4]
    ['--nnodes=2', '--node_rank=1', '--master_addr=10.0.0.1', '--master_port=29500', '--rdzv_conf=timeout=600']
    """
    cmd = [sys.executable, "-m", "srpo_graph.train.parallel.launch"]
    if nnodes <= 1:
        cmd += ["--standalone"]
    else:
        if not endpoint or ":" not in endpoint:
            raise ConfigError(
                f"--rdzv-endpoint: {endpoint!r} is not HOST:PORT (node 0's address and a free port); "
                f"every one of the {nnodes} nodes passes the same value"
            )
        if not 0 <= node_rank < nnodes:
            raise ConfigError(f"--node-rank: {node_rank} is not in 0..{nnodes - 1}")
        host, port = endpoint.rsplit(":", 1)
        cmd += [
            f"--nnodes={nnodes}",
            f"--node_rank={node_rank}",
            f"--master_addr={host}",
            f"--master_port={port}",
            f"--rdzv_conf=timeout={int(timeout)}",
        ]
    if forked is None:
        forked = forked_ranks.enabled()
    if forked:  # torchrun runs ``python -m srpo_graph.train``'s file as each rank's function (forked.py)
        entry = os.path.join(os.path.dirname(os.path.dirname(__file__)), "__main__.py")
        return cmd + [f"--nproc_per_node={nproc}", "--run-path", "--start-method=forkserver", entry, *argv]
    return cmd + [f"--nproc_per_node={nproc}", "-m", "srpo_graph.train", *argv]


# Seconds the ranks get to stop on their own after the launcher is interrupted (they stop at once, like
# one process: the step in flight is dropped, the last checkpoint stays): then they are killed.
STOP_GRACE_S = 60.0


def launch(
    nproc: int,
    argv: Sequence[str],
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    endpoint: str | None = None,
    timeout: float = 600.0,
    grace: float = STOP_GRACE_S,
) -> int:
    """Run ``python -m srpo_graph.train ARGV`` under torchrun with ``nproc`` processes on this
    node (of ``nnodes``, meeting at ``endpoint``: :func:`multinode.torchrun_command`).

    Ctrl-C or SIGTERM here (``KeyboardInterrupt``) is passed on: torchrun gets SIGTERM and sends it to
    the ranks, which stop as one process does (rank 0 prints where the run stands and the command
    that resumes it); after ``grace`` seconds, or a second interrupt, torchrun is killed. Then the
    ``KeyboardInterrupt`` is raised again. (``subprocess.call`` would SIGKILL torchrun at once, and
    the ranks would die without a word.)

    Returns:
        torchrun's exit code.
    """
    proc = subprocess.Popen(
        torchrun_command(nproc, argv, nnodes=nnodes, node_rank=node_rank, endpoint=endpoint, timeout=timeout),
        env={**os.environ, PARENT_ENV: str(os.getpid())},  # torchrun stops when this process is gone
    )
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):  # asked twice, or the ranks did not stop
            _kill_tree(proc)
        raise


PARENT_ENV = "SRPO_GRAPH_PARENT_PID"  # the pid of the process that started this one (Note [Parent death])
PARENT_POLL_S = 0.5  # seconds between two looks at the parent


def stop_with_parent(interval: float = PARENT_POLL_S, parent: str | None = None) -> int | None:
    """SIGTERM this process once when the parent named in :data:`PARENT_ENV` (or ``parent``, its value
    taken from there already) is gone (Note [Parent death]); the variable is removed, so this process's
    own children do not watch its parent. Nothing without the variable (not started by the launcher,
    or by torchrun under it).

    Returns:
        the pid watched, or None.
    """
    try:
        watched = int(os.environ.pop(PARENT_ENV, "") if parent is None else parent)
    except ValueError:
        return None

    def watch() -> None:
        while os.getppid() == watched:  # once the parent dies, the process has a new one (init, a subreaper)
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="srpo-graph-parent-watch", daemon=True).start()
    return watched


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``; elsewhere none): torchrun starts each rank in a
    session of its own, so killing torchrun alone would leave them running."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])  # the command may hold spaces and ')'
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process below it, the ranks first. ``proc`` is stopped (SIGSTOP)
    before anything below it is killed, so it cannot see them die and act on it -- a torchrun
    reporting its ranks' deaths, a shell whose ``wait`` returns and which exits 0 (a CI run) --
    before its own SIGKILL lands."""
    try:
        os.kill(proc.pid, signal.SIGSTOP)
    except OSError:  # already gone
        pass
    for pid in reversed(_descendants(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # already gone
            pass
    proc.kill()
    proc.wait()


ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # the per-rank error file torchrun reads when the rank fails
CONSEQUENCE_MARK = "srpo_graph_consequence"  # the error file's key: this rank stopped because another did
CONSEQUENCE_WAIT_S = 5.0  # how long such a rank waits before it exits, for torchrun to see the cause first


def stopped_after_another_rank(message: str, *, wait: float = CONSEQUENCE_WAIT_S) -> None:
    """This rank stops because another rank of the job stopped answering (Note [The job fails with
    its cause]): mark its failure as a consequence, then give torchrun ``wait`` seconds to see the
    cause -- less when torchrun, having seen it, stops this rank (SIGTERM). A no-op outside torchrun.
    Call it once the outcome is decided (``exiting.decided``: that SIGTERM then raises nothing)."""
    import json

    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    record = {"message": message[:2000], "timestamp": int(time.time()), CONSEQUENCE_MARK: True}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
    except OSError:  # (a full disk): torchrun's own record stands; only the choice of cause is lost
        return
    end = time.monotonic() + wait
    while time.monotonic() < end and not exiting.asked_to_stop():
        time.sleep(0.05)


def cause_of(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure that is the job's cause among torchrun's ``{rank: ProcessFailure}`` (Note [The job
    fails with its cause]): the earliest failure of its own -- neither a rank marked as stopping
    because of another (:func:`stopped_after_another_rank`) nor one stopped by SIGTERM or SIGINT
    (what torchrun does to the survivors once it has seen a failure; they are recorded after the
    failures it saw) -- else the earliest of all. Ties (torchrun's timestamps are whole seconds) go to
    the order torchrun recorded them in, which is the order it saw them.

    >>> from types import SimpleNamespace as F
    >>> def f(code, marked=False):
    ...     return F(exitcode=code, timestamp=5, error_file_data={CONSEQUENCE_MARK: True} if marked else {})
    >>> cause_of({0: f(1, marked=True), 1: f(8)})[0]  # the consequence was recorded first
    1
    >>> cause_of({1: f(8), 0: f(143)})[0], cause_of({0: f(1, marked=True), 1: f(143)})[0]
    (1, 0)
    """
    stopped = {-int(signal.SIGTERM), -int(signal.SIGINT), 128 + int(signal.SIGTERM), 128 + int(signal.SIGINT)}

    def key(item: tuple[int, tuple[int, Any]]) -> tuple[bool, int, int]:
        order, (_, failure) = item
        data = getattr(failure, "error_file_data", None)
        marked = isinstance(data, dict) and bool(data.get(CONSEQUENCE_MARK))
        return marked or int(failure.exitcode) in stopped, int(failure.timestamp), order

    _, (rank, failure) = min(enumerate(failures.items()), key=key)
    return rank, failure


def _forked_ranks(argv: Sequence[str]) -> int:
    """How many ranks torchrun forks from the preloaded forkserver (Note [Ranks forked from a preloaded
    server]) by the command line :func:`torchrun_command` wrote (``--run-path``, ``--start-method=
    forkserver``, ``--nproc_per_node=N``; 1 where N is not a number), read before torch is imported;
    0 where its ranks are not forked, or the options are written another way (``main`` then reads
    them with torchrun's parser).

    >>> _forked_ranks(torchrun_command(2, ["a.wf"], forked=True)[3:])
    2
    >>> _forked_ranks(torchrun_command(2, ["a.wf"], forked=False)[3:])
    0
    """
    options = list(argv)
    for i, arg in enumerate(options):  # torchrun's own options end where the script's path begins
        if not arg.startswith("-"):
            options = options[:i]
            break
    if "--run-path" not in options or "--start-method=forkserver" not in options:
        return 0
    nproc = [a.split("=", 1)[1] for a in options if a.startswith("--nproc_per_node=")]
    return int(nproc[-1]) if nproc and nproc[-1].isdigit() else 1


def main(argv: Sequence[str]) -> int:
    """torchrun with ``argv``; a failed rank's exit code, without torchrun's own traceback."""
    launcher = os.environ.pop(PARENT_ENV, "")  # watched below: its death stops torchrun, which stops the ranks
    os.environ[PARENT_ENV] = str(os.getpid())  # each rank stops when torchrun is gone (the forkserver's too)
    nproc = _forked_ranks(argv)
    if nproc:  # first, in one thread and before torch: Note [The forkserver is forked] (forked.py)
        forked_ranks.prepare(nproc)

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(list(argv))
    if not nproc and args.run_path and args.start_method == "forkserver":  # (options written another way)
        forked_ranks.prepare(int(args.nproc_per_node) if str(args.nproc_per_node).isdigit() else 1)
    stop_with_parent(parent=launcher)  # (after the fork: the server runs no thread)
    try:
        run(args)
    # SIGTERM / Ctrl-C: torchrun has passed it to the ranks, which said where the run stands
    except SignalException as exc:
        exiting.decided()  # torchrun's handler raises SignalException: not into the exit (exiting.py)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        exiting.decided()
        rank, failure = cause_of(exc.failures)  # not torchrun's get_first_failure (Note [The job fails with its cause])
        code = int(failure.exitcode)
        if code < 0:  # killed by a signal: say which rank, the ranks that saw it have said the rest
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else "?"
            print(
                f"srpo-graph train: rank {rank} (pid {failure.pid}) was killed by signal {-code} ({name})",
                file=sys.stderr,
            )
            return 128 - code
        return code or 1
    exiting.decided()
    return 0


if __name__ == "__main__":
    exiting.as_entry_point()
    sys.exit(main(sys.argv[1:]))
