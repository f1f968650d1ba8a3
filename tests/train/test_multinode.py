"""Two "nodes" of one process each on this machine (torchrun's static rendezvous over localhost,
gloo): the job equals one process, only node 0 writes the run folder, and ``--resume`` works on
a node that cannot read it.

The nodes run in two different working directories with a relative ``--run-dir``, so node 1
really has no run folder (as on a cluster without a shared file system): what it needs of it --
the checkpoint it resumes from -- must come over the process group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from srpo_graph.backends.ports import claim_ports
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WF = str(ROOT / "workflows" / "coord_mixed.wf")
SMALL = ["rollout.tasks_per_step=4", "rollout.samples=4", "eval.every=2", "logging.tensorboard=false",
         "logging.plots=false", "checkpoint.every=1", "dist_timeout=120"]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "SRPO_GRAPH_HOME": str(home),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _nodes(tmp_path: Path, *args: str) -> list[subprocess.CompletedProcess]:
    """Run ``srpo-graph train WF ARGS`` as node 0 and node 1 (each in its own folder), together."""
    return _launch_nodes(tmp_path, [("node0", list(args)), ("node1", list(args))])


def _launch_nodes(tmp_path: Path, nodes: list[tuple[str, list[str]]]) -> list[subprocess.CompletedProcess]:
    """Node K runs in ``tmp_path/<name>`` with its own args; outputs go to files (a full pipe
    would block a node, and its peer with it)."""
    endpoint = f"127.0.0.1:{claim_ports(1)[0]}"  # torchrun binds it seconds later
    procs = []
    for rank, (name, args) in enumerate(nodes):
        cwd = tmp_path / name
        cwd.mkdir(exist_ok=True)
        out, err = open(cwd / "stdout.txt", "w"), open(cwd / "stderr.txt", "w")
        procs.append((cwd, subprocess.Popen(
            ["srpo-graph", "train", WF, "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint, *args],
            cwd=cwd, env=_env(tmp_path / "home"), stdout=out, stderr=err)))
    done = []
    for cwd, p in procs:
        p.wait(timeout=600)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, (cwd / "stdout.txt").read_text(),
                                                (cwd / "stderr.txt").read_text()))
    return done  # node 0, node 1


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_nodes_equal_one_process_and_resume_without_a_shared_run_folder(tmp_path, one_process):
    """Against the session's single-process run of the same arguments (tests/support/reference_runs.py),
    resumed here (a copy) to step 3."""
    from tests.support.reference_runs import COORD_MIXED

    home = tmp_path / "home"
    (home).mkdir()
    os.symlink(Path.home() / ".cache" / "srpo-graph" / "tiny", home / "tiny")  # the built model, not the run
    one = one_process.copy(tmp_path / "one", COORD_MIXED)
    args = [*COORD_MIXED[1:], "dist_timeout=120"]  # WF is COORD_MIXED[0]

    n0, n1 = _nodes(tmp_path, "--run-dir", "runs/job", *args)
    assert n0.returncode == 0 and n1.returncode == 0, (n0.stderr[-2000:], n1.stderr[-2000:])
    run = tmp_path / "node0" / "runs" / "job"
    assert not (tmp_path / "node1" / "runs").exists()  # only node 0 writes the run folder
    a, b = _rows(one), _rows(run)
    assert [r["step"] for r in b] == [1, 2]
    for x, y in zip(a, b):
        assert x["reward"] == y["reward"] and x["events"] == y["events"]
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6)
        assert x["grad_norm/tiny"] == pytest.approx(y["grad_norm/tiny"], rel=1e-5)

    # resume to step 3: node 1 has no run folder, receives the checkpoint over the group
    proc = subprocess.run(["srpo-graph", "train", WF, "--resume", str(one), "--steps", "3"],
                          cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n0, n1 = _nodes(tmp_path, "--resume", "runs/job", "--steps", "3")
    assert n0.returncode == 0 and n1.returncode == 0, (n0.stderr[-2000:], n1.stderr[-2000:])
    assert "cannot read" in n1.stderr and "receiving it into" in n1.stderr
    assert not (tmp_path / "node1" / "runs").exists()
    a, b = _rows(one), _rows(run)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert a[2]["reward"] == b[2]["reward"] and a[2]["loss"] == pytest.approx(b[2]["loss"], abs=1e-6)
    shutil.rmtree(home / "received", ignore_errors=True)


@pytest.mark.proc
def test_nodes_that_disagree_stop_together_naming_the_ranks(tmp_path):
    """Node 1 resolved another learning rate: both nodes stop at once with an error naming rank 1."""
    (tmp_path / "home").mkdir()
    os.symlink(Path.home() / ".cache" / "srpo-graph" / "tiny", tmp_path / "home" / "tiny")
    common = ["--steps", "1", "--run-dir", "runs/job", "dist_timeout=60"]
    for p in _launch_nodes(tmp_path, [("d0", common), ("d1", [*common, "optim.lr=0.5"])]):
        assert p.returncode != 0 and "disagree with rank 0" in p.stderr and "ranks [1]" in p.stderr, p.stderr[-2000:]


def test_torchrun_command_lines():
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.parallel.launch import torchrun_command

    cmd = torchrun_command(4, ["x.wf"], nnodes=3, node_rank=2, endpoint="node0:29400")
    assert "--nnodes=3" in cmd and "--node_rank=2" in cmd and "--master_addr=node0" in cmd
    assert "--master_port=29400" in cmd and "--nproc_per_node=4" in cmd and "--standalone" not in cmd
    with pytest.raises(ConfigError, match="HOST:PORT"):
        torchrun_command(1, ["x.wf"], nnodes=2, endpoint="node0")
    with pytest.raises(ConfigError, match="node-rank"):
        torchrun_command(1, ["x.wf"], nnodes=2, node_rank=2, endpoint="h:1")


def _pid_of_rank(rank: int, marker: str) -> int | None:
    """The PID of the torchrun worker of ``rank`` whose environment holds ``marker``: a rank started as
    a new interpreter has ``RANK`` in the environment it started with; a forked one (Note [Ranks
    forked from a preloaded server], train/parallel/forked.py) names itself ``srpo-rank<RANK>``."""
    for proc in sorted(Path("/proc").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if (f"RANK={rank}".encode() in env or comm == f"srpo-rank{rank}") and any(marker.encode() in e for e in env):
            return int(proc.name)
    return None


def _two_ranks_past_step_2(tmp_path: Path, steps: int, err, *, new_session: bool = False, wf: str = WF,
                           logged: int = 2) -> tuple[subprocess.Popen, Path, dict[str, str]]:
    """Start `srpo-graph train WF --nproc 2` (stderr to ``err``; each rank's environment marked with
    ``tmp_path``, see :func:`_pid_of_rank`) and return once ``logged`` steps are: (process, run, env)."""
    (tmp_path / "home").mkdir()
    os.symlink(Path.home() / ".cache" / "srpo-graph" / "tiny", tmp_path / "home" / "tiny")
    run = tmp_path / "run"
    env = {**_env(tmp_path / "home"), "SRPO_TEST_MARKER": str(tmp_path)}
    p = subprocess.Popen(["srpo-graph", "train", wf, "--nproc", "2", "--steps", str(steps), "--run-dir", str(run),
                          *SMALL], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
                         start_new_session=new_session)
    # `logged` whole lines in metrics.jsonl (a line still being written is not read as a damaged one),
    # however slow the start on a loaded machine: the wait fails only when the launcher exits or
    # neither the run folder nor the log moves for STALL_S
    metrics, log = run / "metrics.jsonl", tmp_path / "err.txt"
    wait_for(lambda: metrics.exists() and metrics.read_bytes().count(b"\n") >= logged, proc=p,
             progress=lambda: (sorted(map(str, run.rglob("*"))) if run.exists() else [], _size(metrics), _size(log)),
             what=f"{logged} steps in {metrics} (launcher log: {log})")
    return p, run, env


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.slow
def test_a_rank_killed_during_training_ends_the_job_with_a_resume_line(tmp_path):
    """SIGKILL rank 1 of a 2-process job after step 2: the job ends (no hang), the error names the
    rank and says how to continue; the resume line works."""
    import signal

    with open(tmp_path / "err.txt", "w") as err:
        p, run, env = _two_ranks_past_step_2(tmp_path, 8, err)
        pid = _pid_of_rank(1, str(tmp_path))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        code = p.wait(timeout=300)  # ends: the survivors' collectives fail, torchrun stops them
    text = (tmp_path / "err.txt").read_text()
    assert code != 0 and "rank 1" in text and "killed by signal 9" in text, text[-3000:]
    assert f"--resume {run}" in text and "Traceback" not in text, text[-3000:]
    done = len(_rows(run))
    assert 2 <= done < 8
    proc = subprocess.run(["srpo-graph", "train", WF, "--resume", str(run)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r["step"] for r in _rows(run)] == list(range(1, 9))


@pytest.mark.slow
@pytest.mark.parametrize("sig, group", [("SIGTERM", False), ("SIGINT", False), ("SIGINT", True), ("SIGTERM", True)],
                         ids=["sigterm", "sigint", "ctrl-c", "sigterm-to-the-group"])
def test_a_signal_to_the_launcher_stops_every_rank_like_one_process(tmp_path, sig, group):
    """SIGTERM (a scheduler, `kill`) or SIGINT to the `srpo-graph train --nproc 2` process alone, not its
    ranks: it is passed on through torchrun, every rank stops as one process does (rank 0 says where
    the run stands and how to resume), no rank is left running, no traceback, and the exit status is
    the signal's. (The launcher used to SIGKILL torchrun, and the ranks died without a word.) Ctrl-C
    in a terminal is SIGINT to the whole process group at once: the same outcome."""
    import signal

    with open(tmp_path / "err.txt", "w") as err:
        p, run, _ = _two_ranks_past_step_2(tmp_path, 40, err, new_session=group)
        ranks = [_pid_of_rank(r, str(tmp_path)) for r in (0, 1)]
        assert None not in ranks
        if group:
            os.killpg(p.pid, getattr(signal, sig))
        else:
            p.send_signal(getattr(signal, sig))
        code = p.wait(timeout=300)
    text = (tmp_path / "err.txt").read_text()
    assert code == 128 + getattr(signal, sig), text[-3000:]
    assert "newest complete checkpoint" in text and text.count(f"--resume {run}") == 2, text[-3000:]  # rank 0, launcher
    assert "Traceback" not in text, text[-3000:]
    assert all(_pid_of_rank(r, str(tmp_path)) is None for r in (0, 1))
    assert len(_rows(run)) < 40


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _ancestors(pid: int, top: int) -> list[int]:
    """The processes between ``pid`` and its ancestor ``top`` (neither included)."""
    out = []
    while True:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        if pid in (top, 0, 1):
            return out
        out.append(pid)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has exited: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_launcher_killed_by_sigkill_stops_torchrun_and_every_rank(tmp_path):
    """kill -9 of `srpo-graph train --nproc 2` -- a signal nothing can pass on -- once the first step is
    logged: torchrun notices its parent is gone and stops the ranks as if the launcher had passed a
    SIGTERM on (Note [Parent death], train/parallel/launch.py); every rank and torchrun are gone within
    a deadline, rank 0 said how to resume, no traceback, and the run lock is free for the resume.
    (They used to train on to step 40 holding the lock.)"""
    import signal

    with open(tmp_path / "err.txt", "w") as err:
        p, run, _ = _two_ranks_past_step_2(tmp_path, 40, err, wf=str(ROOT / "workflows" / "coord_par2.wf"), logged=1)
        ranks = [_pid_of_rank(r, str(tmp_path)) for r in (0, 1)]
        assert None not in ranks
        between = _ancestors(ranks[0], p.pid)  # torchrun (and the forkserver a forked rank came from)
        assert between, ranks
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        _all_end([*ranks, *between])
    _stopped_with_the_resume_line(tmp_path, run)


@pytest.mark.slow
def test_torchrun_killed_by_sigkill_stops_every_rank(tmp_path):
    """kill -9 of torchrun itself (an out-of-memory kill, a crash) once the first step is logged: each
    rank watches torchrun (Note [Parent death]) -- its parent when it is a new interpreter, its
    grandparent when it was forked from the preloaded forkserver (Note [Ranks forked from a preloaded
    server]), which must not keep the ranks' parent alive either -- and stops as if torchrun had
    passed a SIGTERM on: every rank and the forkserver are gone within a deadline, rank 0 said how to
    resume, and the run lock is free."""
    import signal

    with open(tmp_path / "err.txt", "w") as err:
        p, run, _ = _two_ranks_past_step_2(tmp_path, 40, err, wf=str(ROOT / "workflows" / "coord_par2.wf"), logged=1)
        ranks = [_pid_of_rank(r, str(tmp_path)) for r in (0, 1)]
        assert None not in ranks
        between = _ancestors(ranks[0], p.pid)  # [forkserver, torchrun] or [torchrun]
        torchrun, rest = between[-1], between[:-1]
        os.kill(torchrun, signal.SIGKILL)
        _all_end([*ranks, *rest])
        p.wait(timeout=60)
    _stopped_with_the_resume_line(tmp_path, run)


def _all_end(pids: list[int]) -> None:
    """Wait until none of ``pids`` runs, within a correctness bound: the job ends, it does not train on."""
    import time

    deadline = time.monotonic() + 180
    while any(_running(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if _running(pid)]
        time.sleep(0.2)


def _stopped_with_the_resume_line(tmp_path: Path, run: Path) -> None:
    """The job of 40 steps stopped early, rank 0 said how to resume, no traceback, the run lock free."""
    import fcntl

    text = (tmp_path / "err.txt").read_text()
    # (killed after the first logged step: the first checkpoint may not be written yet)
    assert ("newest complete checkpoint" in text or "no checkpoint yet" in text), text[-3000:]
    assert f"--resume {run}" in text and "Traceback" not in text, text[-3000:]
    assert len(_rows(run)) < 40
    with open(run / ".lock", "a+") as lock:  # the run lock was released with its holder
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.proc
def test_a_process_stops_once_when_its_parent_dies(tmp_path):
    """The watch itself (stop_with_parent), on real processes: a parent started a child that watches
    it, then is SIGKILLed; the child receives exactly one SIGTERM (a second would cut its stop short)
    and the variable naming the parent is not passed on to the child's own children."""
    import signal
    import sys
    import time

    child_code = (
        "import os, signal, sys, time\n"
        "from srpo_graph.train.parallel.launch import PARENT_ENV, stop_with_parent\n"
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: got.append(1))\n"
        "assert stop_with_parent(interval=0.05) is not None and PARENT_ENV not in os.environ\n"
        "open(sys.argv[1] + '.ready', 'w').close()\n"
        "end = time.monotonic() + 60\n"
        "while not got and time.monotonic() < end: time.sleep(0.05)\n"
        "time.sleep(1.0)  # a second SIGTERM would land here\n"
        "open(sys.argv[1] + '.tmp', 'w').write(str(len(got)))\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    )
    out = tmp_path / "sigterms.txt"
    parent_code = (
        "import os, subprocess, sys, time\n"
        "from srpo_graph.train.parallel.launch import PARENT_ENV\n"
        f"subprocess.Popen([sys.executable, '-c', {child_code!r}, {str(out)!r}],"
        " env={**os.environ, PARENT_ENV: str(os.getpid())})\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=_env(tmp_path))
    deadline = time.monotonic() + 60
    while not Path(str(out) + ".ready").exists():
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    while not out.exists():
        assert time.monotonic() < deadline + 60
        time.sleep(0.05)
    assert out.read_text() == "1"


@pytest.mark.proc
def test_the_launcher_kills_the_ranks_it_gives_up_on_with_torchrun():
    """When the ranks do not stop within the grace period (or the user asks twice), the launcher kills
    torchrun and every process under it: torchrun starts each rank in a session of its own, so
    killing torchrun alone would leave them running. Real processes: a child in its own session."""
    import signal

    from srpo_graph.train.parallel.launch import _descendants, _kill_tree

    parent = subprocess.Popen(["bash", "-c", "setsid sleep 300 & sleep 300 & wait"])
    # both sleeps started: each has exec'd (its /proc comm says so), so neither is a fork of bash
    # that would still become one (the kernel reports the state; no wall-clock window)
    wait_for(lambda: len(below := _descendants(parent.pid)) == 2 and all(_comm(p) == "sleep" for p in below),
             proc=parent, progress=lambda: sorted(_descendants(parent.pid)), what="the two sleeps")
    below = _descendants(parent.pid)
    _kill_tree(parent)
    # a SIGKILLed process is gone once it has exited: no /proc entry, or a zombie waiting for init;
    # on a loaded machine that takes as long as the scheduler takes, so wait for it, not 0.2 s
    wait_for(lambda: not [pid for pid in below if _running(pid)], progress=lambda: [_running(p) for p in below],
             stall=120, what=f"the end of {below}")
    assert parent.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_fsdp_checkpoints_on_two_nodes_without_a_shared_run_folder(tmp_path):
    """strategy=fsdp over two "nodes" (separate folders, a relative run folder): each rank writes
    its own DCP shards on its own disk, rank 0 receives node 1's over the group, so node 0's
    checkpoint is whole (it verifies: every shard the metadata names, checksummed) and node 1
    keeps nothing; ``--resume`` then ships it to node 1 and the job goes on."""
    from srpo_graph.train.checkpoint import verify_checkpoint
    from srpo_graph.train.checkpoint.sharded import dcp_path

    (tmp_path / "home").mkdir()
    os.symlink(Path.home() / ".cache" / "srpo-graph" / "tiny", tmp_path / "home" / "tiny")
    args = ["rollout.tasks_per_step=2", "rollout.samples=4", "eval.every=0", "logging.tensorboard=false",
            "logging.plots=false", "checkpoint.every=1", "dist_timeout=120", "strategy=fsdp"]
    n0, n1 = _nodes(tmp_path, "--steps", "1", "--run-dir", "runs/job", *args)
    assert n0.returncode == 0 and n1.returncode == 0, (n0.stderr[-2000:], n1.stderr[-2000:])
    ck = tmp_path / "node0" / "runs" / "job" / "checkpoints" / "step_1"
    assert verify_checkpoint(ck) is None
    assert {p.name for p in dcp_path(ck, "tiny").iterdir()} >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    assert not [p for p in (tmp_path / "node1").rglob("*.distcp")]  # node 1's copies removed
    n0, n1 = _nodes(tmp_path, "--resume", "runs/job", "--steps", "2")
    assert n0.returncode == 0 and n1.returncode == 0, (n0.stderr[-2000:], n1.stderr[-2000:])
    assert "receiving it into" in n1.stderr
    assert [r["step"] for r in _rows(tmp_path / "node0" / "runs" / "job")] == [1, 2]
    shutil.rmtree(tmp_path / "home" / "received", ignore_errors=True)
