"""torchrun's ranks forked from a preloaded forkserver (Note [Ranks forked from a preloaded server],
srpo_graph/train/parallel/forked.py).

Every ``--nproc`` job of the suite starts its ranks this way (the signal, killed-rank, full-disk and
multi-node tests among them); ``tests/e2e/test_train_cli.py`` runs one job both ways and compares
each with one process. Here: what the forkserver may hold before it forks, and the choice of the way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srpo_graph.train.parallel import forked
from srpo_graph.train.parallel.launch import torchrun_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.proc
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are counted in /proc")
@pytest.mark.parametrize("server", ["fork", "exec"])
def test_the_forkserver_holds_the_preloaded_modules_and_no_thread(tmp_path, server):
    """``forked.prepare()`` in a fresh interpreter (as torchrun's wrapper calls it), then one process
    from its forkserver: the forkserver has imported every module of ``PRELOAD`` and runs one thread
    -- no OpenMP pool, no gloo or store thread, whose state a fork would copy without the thread -- and
    the forked process has the modules without importing them and unbuffered streams, as
    ``python -u`` gave a rank; a SIGTERM, a SIGHUP and a SIGQUIT (to torchrun's process group) leave it
    serving. Both ways of starting the server: forked from the wrapper (the default, Note [The forkserver
    is forked]) and multiprocessing's own, a new interpreter (``SRPO_GRAPH_FORKSERVER=exec``); the
    forked one has the wrapper's command line, and nothing the wrapper had buffered is printed twice."""
    out = tmp_path / "probe.json"
    script = textwrap.dedent(f"""
        import multiprocessing, os, signal, sys, time
        from multiprocessing import forkserver
        from srpo_graph.train.parallel import forked
        from tests.support import forkserver_probe
        print("before the fork", flush=False)  # (buffered: the fork must not print it twice)
        forked.prepare(2)
        assert forkserver._forkserver._forkserver_pid is not None
        pid = forkserver._forkserver._forkserver_pid
        same = open(f"/proc/{{pid}}/cmdline", "rb").read() == open("/proc/self/cmdline", "rb").read()
        print("the server is", "a fork of this process" if same else "another interpreter")
        for path in ({str(out)!r}, {str(out) + ".2"!r}):
            p = multiprocessing.get_context("forkserver").Process(target=forkserver_probe.report, args=(path,))
            p.start()
            p.join(120)
            assert p.exitcode == 0, p.exitcode
            # a SIGTERM, SIGHUP or SIGQUIT to torchrun's whole process group: the server stays, and forks again
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                os.kill(forkserver._forkserver._forkserver_pid, sig)
            time.sleep(0.2)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), forked.SERVER_ENV: server}
    for var in ("PYTHONUNBUFFERED", "OMP_NUM_THREADS"):  # (prepare sets both: OMP_NUM_THREADS=1 for 2 ranks)
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("before the fork") == 1, proc.stdout
    assert ("a fork of this process" in proc.stdout) == (server == "fork"), proc.stdout
    got = json.loads(out.read_text())
    assert got["preloaded"] == {m: True for m in forked.PRELOAD}
    assert got["server_threads"] == 1
    assert got["unbuffered"] == "1" and got["write_through"] is True and got["omp"] == "1"
    again = json.loads((tmp_path / "probe.json.2").read_text())  # the same server, after the signals
    assert again["server"] == got["server"] and again["server_threads"] == 1


def test_forked_ranks_are_the_default_and_exec_the_way_back(monkeypatch):
    """The torchrun command line runs ``srpo_graph/train/__main__.py`` as each rank's function under the
    forkserver by default; ``SRPO_GRAPH_RANK_START=exec`` or an unsupervised command (``SRPO_GRAPH_SUPERVISE=0``,
    whose rank would end with ``os._exit`` and never return to torchrun) starts each rank as
    ``python -u -m srpo_graph.train``."""
    monkeypatch.delenv(forked.START_ENV, raising=False)
    monkeypatch.delenv("SRPO_GRAPH_SUPERVISE", raising=False)
    cmd = torchrun_command(2, ["x.wf", "--steps", "1"])
    entry = str(Path(forked.__file__).parents[1] / "__main__.py")  # python -m srpo_graph.train's file
    assert cmd[-6:] == ["--run-path", "--start-method=forkserver", entry, "x.wf", "--steps", "1"]
    for var, value in ((forked.START_ENV, "exec"), ("SRPO_GRAPH_SUPERVISE", "0")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            assert torchrun_command(2, ["x.wf"])[-3:] == ["-m", "srpo_graph.train", "x.wf"]
