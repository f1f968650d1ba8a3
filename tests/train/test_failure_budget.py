"""Every failure class counts toward one budget; every stop says how to continue (issue 24 item 1,
issue 23 items 3 and 4), on real runs of the tiny model:

* a reward that raises on every episode: ``train`` stops (exit 1) with the first reward failure
  and its ``.wf`` line, the real ``.wf`` path and run folder in the resume command (before: exit 0,
  ``reward 0.000``, nothing updated, no word);
* a reward raising on half the episodes (within the budget): the first failure is printed once,
  the progress line shows ``failed``, metrics count ``rollout/failed/reward``;
* ``SystemExit(0)`` in a reward under ``train``: the same stop, not a silent exit 0;
* one SIGINT to a real ``srpo-graph train`` whose tool hangs: exit 130 at once with the resume line;
* ``--resume`` of a run stopped before its first checkpoint starts it again (the advice works).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph.train.config.loading import validate
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.parallel.launch import _descendants
from srpo_graph.train.stops import RunStopped
from srpo_graph.train.trainer import train
from tests.support.user_code import make
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
SMALL = ["rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0", "logging.tensorboard=false",
         "logging.plots=false", "logging.traces_every=0", "checkpoint.every=1"]


def _tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(f'{{"id": "t{i}", "target": {i}}}\n' for i in range(6)), encoding="utf-8")
    return path


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "srpo_graph.cli", "train", *args], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("reward", ["raising_reward", "exit_reward"])
def test_a_reward_failing_on_every_episode_stops_the_run_with_the_real_command(tmp_path, reward):
    path, _, line = make(tmp_path, reward=reward)
    run = tmp_path / "run"
    proc = _cli(str(path), "--steps", "3", "--run-dir", str(run), "--tasks", str(_tasks(tmp_path)), *SMALL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (out, err[-3000:])
    assert "Traceback" not in err
    assert "stopped after step 0: rollout stopped: 4 of 4 episodes failed (reward 4; 100% > " \
           "rollout.max_failed_fraction=0.5)" in err, err
    assert f"first reward failure: {path}:{line}:9: error: terminal reward mine.{reward}" in err
    assert f"srpo-graph train {path} --resume {run}" in err and "FILE.wf" not in err and "RUN_DIR" not in err
    if reward != "raising_reward":
        return  # the resume below does not depend on how the reward failed: checked once, not per kind
    # the advice works: with no checkpoint yet, --resume starts the run again (and stops the same way)
    proc = _cli(str(path), "--resume", str(run))
    out, err2 = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "has no checkpoint yet; starting the run again from step 0" in err2, err2[-3000:]


def test_failures_within_the_budget_are_reported_once_and_counted(tmp_path, capsys):
    path, _, line = make(tmp_path, reward="half_reward")  # odd targets raise
    cfg = validate({"steps": 2, "seed": 0, "run_dir": str(tmp_path / "run"),
                    "rollout": {"tasks": str(_tasks(tmp_path)), "tasks_per_step": 2, "samples": 2,
                                "max_failed_fraction": 1.0},
                    "eval": {"every": 0}, "checkpoint": {"every": 1},
                    "logging": {"tensorboard": False, "plots": False, "progress": False, "traces_every": 0}})
    train(path, cfg)
    err = capsys.readouterr().err
    assert err.count("episodes failed (reward); first: ") == 1, err
    assert f"{path}:{line}:9: error: terminal reward mine.half_reward: ValueError('odd target')" in err
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sum(r.get("rollout/failed/reward", 0) for r in rows) == sum(r["episodes_failed"] for r in rows) > 0


def test_a_step_with_nothing_to_update_says_so(tmp_path, capsys):
    path, _, _ = make(tmp_path, reward="raising_reward")
    cfg = validate({"steps": 1, "seed": 0, "run_dir": str(tmp_path / "run"),
                    "rollout": {"tasks": str(_tasks(tmp_path)), "tasks_per_step": 2, "samples": 2,
                                "max_failed_fraction": 1.0},
                    "eval": {"every": 0}, "logging": {"tensorboard": False, "plots": False, "progress": False}})
    train(path, cfg)
    err = capsys.readouterr().err
    assert "step 1: nothing to update: every one of the 4 episodes failed" in err
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row["updates"] == 0 and row["warning"].startswith("nothing to update")


def test_the_budget_stop_is_a_run_stopped_in_process(tmp_path):
    path, _, _ = make(tmp_path, reward="str_reward")
    cfg = validate({"steps": 1, "run_dir": str(tmp_path / "run"),
                    "rollout": {"tasks": str(_tasks(tmp_path)), "tasks_per_step": 2, "samples": 2},
                    "eval": {"every": 0}, "logging": {"tensorboard": False, "plots": False, "progress": False}})
    with pytest.raises(RunStopped) as info:
        train(path, cfg)
    assert "returned '1.0' (a str)" in info.value.advice(path)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_stops_train_while_a_tool_hangs(tmp_path, sig):
    path, mod, _ = make(tmp_path, tool="hang")
    run = tmp_path / "run"
    proc = _cli(str(path), "--steps", "3", "--run-dir", str(run), "--tasks", str(_tasks(tmp_path)), *SMALL)
    # the tool has started (it says so in a file), however long the start-up takes here
    started = tmp_path / f"{mod}.py.started"
    wait_for(started.exists, proc=proc, progress=lambda: sorted(map(str, run.rglob("*"))) if run.exists() else [],
             what=f"{started}")
    proc.send_signal(sig)
    try:  # the tool hangs for ever: a stop within this generous bound is the one signal's doing
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("one signal did not stop `srpo-graph train` while a tool hung")
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err
    assert f"resume: srpo-graph train {path} --resume {run}" in err, err


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # gone
        return ""


# The moments of the start-up, each named by a state the program (or the kernel, for the process's
# memory map) reports, not by a number of seconds: on a loaded 2-core machine 3 s is still Python's
# start-up, on an idle one it is the middle of training. (A signal sent at once lands before Python
# installs its own handler: the process dies of SIGINT without a word, which is the OS's to report.)
START_STATES = {  # (pid: the command's; its child does the work: srpo_graph/supervisor.py)
    "importing-torch": lambda pid, run: any("libtorch" in _maps(p) for p in (pid, *_descendants(pid))),
    "run-folder-claimed": lambda pid, run: (run / ".lock").exists(),  # the config is read
    "trainer-started": lambda pid, run: (run / "metrics.jsonl").exists(),  # the model is loaded
}


@pytest.mark.proc
@pytest.mark.parametrize("state", list(START_STATES))
def test_ctrl_c_in_the_first_seconds_prints_one_line_and_no_traceback(tmp_path, state):
    """A real SIGINT to the ``srpo-graph`` console script while it imports, reads the config or
    loads the model. (A signal before the interpreter reaches the project's code -- Python's own
    start-up, ``site`` -- is Python's to report; such a draw is skipped, not counted.)"""
    import shutil

    cmd = [shutil.which("srpo-graph") or "srpo-graph"] if shutil.which("srpo-graph") else \
        [sys.executable, "-m", "srpo_graph.cli"]
    run = tmp_path / "run"
    proc = subprocess.Popen([*cmd, "train", "workflows/coord_seq.wf", "--run-dir", str(run),
                             "--steps", "2", *SMALL], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    reached = START_STATES[state]
    wait_for(lambda: reached(proc.pid, run) or proc.poll() is not None, what=state, interval=0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if "init_import_site" in err:
        pytest.skip("the signal arrived during Python's own start-up")
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal")
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Aborted" not in err, err[-2000:]
    assert len(err.strip().splitlines()) <= 3, err
    assert "interrupted" in err


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone
        return b""


@pytest.mark.proc
def test_ctrl_c_to_the_group_while_torchruns_wrapper_imports_prints_no_traceback(tmp_path):
    """A terminal's Ctrl-C -- SIGINT to the whole foreground process group -- while an ``--nproc 2``
    job's torchrun wrapper imports torch, transformers' modeling code and the trainer (before it forks
    the ranks' forkserver: Note [The forkserver is forked], train/parallel/forked.py): exit 130, no
    traceback from any process, the launcher's few lines; nothing of the job is left running. (The
    wrapper's imports now take the seconds the forkserver's took: this is the window that grew.)"""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "srpo_graph.cli", "train", "workflows/coord_seq.wf", "--nproc",
                             "2", "--run-dir", str(run), "--steps", "2", *SMALL], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def wrapper_importing() -> bool:
        wrappers = [p for p in _descendants(proc.pid) if b"srpo_graph.train.parallel.launch" in _cmdline(p)]
        return any("libtorch" in _maps(p) for p in wrappers)

    wait_for(lambda: wrapper_importing() or proc.poll() is not None, what="torchrun's wrapper to import torch",
             interval=0.005)
    job = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal")
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert len(err.strip().splitlines()) <= 3 and "interrupted" in err, err
    wait_for(lambda: not any(_cmdline(p) for p in job), what="the job's processes to end")
