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
def test_the_forkserver_holds_the_preloaded_modules_and_no_thread(tmp_path):
    """``forked.prepare()`` in a fresh interpreter (as torchrun's wrapper calls it), then one process
    from its forkserver: the forkserver has imported every module of ``PRELOAD`` and runs one thread
    -- no OpenMP pool, no gloo or store thread, whose state a fork would copy without the thread -- and
    the forked process has the modules without importing them and unbuffered streams, as
    ``python -u`` gave a rank."""
    out = tmp_path / "probe.json"
    script = textwrap.dedent(f"""
        import multiprocessing, sys
        from srpo_graph.train.parallel import forked
        from tests.support import forkserver_probe
        forked.prepare()
        p = multiprocessing.get_context("forkserver").Process(target=forkserver_probe.report, args=({str(out)!r},))
        p.start()
        p.join(120)
        sys.exit(p.exitcode)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # (what torchrun sets for N ranks)
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["preloaded"] == {m: True for m in forked.PRELOAD}
    assert got["server_threads"] == 1
    assert got["unbuffered"] == "1" and got["write_through"] is True


def test_forked_ranks_are_the_default_and_exec_the_way_back(monkeypatch):
    """The torchrun command line runs ``forked.py`` as each rank's function under the forkserver by
    default; ``SRPO_GRAPH_RANK_START=exec`` or an unsupervised command (``SRPO_GRAPH_SUPERVISE=0``,
    whose rank would end with ``os._exit`` and never return to torchrun) starts each rank as
    ``python -u -m srpo_graph.train``."""
    monkeypatch.delenv(forked.START_ENV, raising=False)
    monkeypatch.delenv("SRPO_GRAPH_SUPERVISE", raising=False)
    cmd = torchrun_command(2, ["x.wf", "--steps", "1"])
    assert cmd[-6:] == ["--run-path", "--start-method=forkserver", forked.__file__, "x.wf", "--steps", "1"]
    for var, value in ((forked.START_ENV, "exec"), ("SRPO_GRAPH_SUPERVISE", "0")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            assert torchrun_command(2, ["x.wf"])[-3:] == ["-m", "srpo_graph.train", "x.wf"]
