"""Every stop of a training run prints its resume line, also before the first checkpoint (issue 40
item 8; Note [Every stop prints its resume line], ``train/stops.py``).

The rule over the stops that are cheap to provoke for real in step 1 (a real ``srpo-graph train``,
no checkpoint yet): the rollout worker missing its start deadline (before: exit 3, a bare
BackendError, no resume line), the worker stalled past its deadline (SIGSTOP) or killed (SIGKILL)
by the reward it runs, the failure budget, Ctrl-C. Each exits with its code, no traceback, says
"no checkpoint yet" and ends in the command that continues the run; that command works.
Disk-full stops (set-up included) are ``test_disk_full.py``'s.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph.errors import BackendError, ConfigError
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.stops import RunStopped, stopped_at_start
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
SMALL = ["rollout.tasks_per_step=1", "rollout.samples=2", "eval.every=0", "logging.tensorboard=false",
         "logging.plots=false", "logging.progress=false", "logging.traces_every=0", "checkpoint.every=1"]

# the reward does what SRPO_TEST_FAULT says (in the rollout worker's process when there is one)
MODULE = '''
import os, signal, time

def reward(target: int, a: int, b: int) -> float:
    fault = os.environ.get("SRPO_TEST_FAULT", "")
    if fault:
        open(os.environ["SRPO_TEST_MARK"], "w").close()  # the test waits for this before signalling
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "stall":
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault == "raise":
        raise ValueError("reward broke")
    if fault == "hang":
        time.sleep(3600)
    return float((a + b) % 10 == target)
'''

WORKER = ["rollout.worker=true"]
# fault: (SRPO_TEST_FAULT, overrides, exit code, what the message says)
FAULTS = {
    "worker-deadline-at-start": ("", [*WORKER, "rollout.worker_timeout=0.5"], 1, "did not start within 0.5s"),
    "worker-stalled-in-step-1": ("stall", [*WORKER, "rollout.worker_timeout=20"], 1,
                                 "did not answer within the deadline"),
    "worker-killed-in-step-1": ("kill", WORKER, 1, "exited with code -9"),
    "failure-budget-in-step-1": ("raise", [], 1, "rollout stopped: 2 of 2 episodes failed"),
    "ctrl-c-in-step-1": ("hang", [], 130, "interrupted after step 0"),
}


def _workflow(tmp_path: Path) -> Path:
    (tmp_path / "faulty.py").write_text(MODULE)
    text = (ROOT / "workflows" / "coord_par2.wf").read_text()
    text = text.replace("import std\n", "import std\nimport faulty\n")
    lines = [ln if not ln.startswith("reward:") else "reward: faulty.reward(task.target, a, b)"
             for ln in text.splitlines()]
    path = tmp_path / "faulty.wf"
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(tmp_path: Path, fault: str, *args: str) -> subprocess.Popen:
    env = {**ENV, "SRPO_TEST_FAULT": fault, "SRPO_TEST_MARK": str(tmp_path / "reached")}
    return subprocess.Popen([sys.executable, "-m", "srpo_graph.cli", "train", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.proc
@pytest.mark.parametrize("name", [
    "worker-deadline-at-start",
    pytest.param("worker-stalled-in-step-1", marks=pytest.mark.slow),  # waits out a 20 s deadline
    pytest.param("worker-killed-in-step-1", marks=pytest.mark.slow),  # and the resume that trains step 1
    "failure-budget-in-step-1",
    "ctrl-c-in-step-1",
])
def test_a_stop_before_the_first_checkpoint_prints_the_resume_line(tmp_path, name):
    fault, overrides, code, says = FAULTS[name]
    wf, run = _workflow(tmp_path), tmp_path / "run"
    proc = _train(tmp_path, fault, str(wf), "--steps", "1", "--run-dir", str(run),
                  "--tasks", str(ROOT / "workflows" / "tasks" / "coord.jsonl"), *SMALL, *overrides)
    if fault == "hang":  # the reward runs (step 1): one Ctrl-C
        wait_for((tmp_path / "reached").exists, proc=proc, what="the reward to start")
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code and "Traceback" not in err, err[-3000:]
    assert says in err and "no checkpoint yet" in err, err[-3000:]
    assert err.rstrip().splitlines()[-1].endswith(f"resume: srpo-graph train {wf} --resume {run}"), err[-3000:]
    if name == "worker-killed-in-step-1":  # the printed command works: it starts again at step 0 and trains
        proc = _train(tmp_path, "", str(wf), "--resume", str(run))
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1]


def test_set_up_stops_are_run_stops_and_the_rest_is_left_alone(tmp_path):
    """What set-up raised: a backend (the worker) or a full disk is a stop with the resume line once
    config.toml exists; a refused configuration or a bug re-raises as it is; Ctrl-C is the command's."""
    (tmp_path / "config.toml").write_text("")
    stop = stopped_at_start(BackendError("the rollout worker (pid 1) did not start"), tmp_path, None)
    assert isinstance(stop, RunStopped) and stop.steps_done == 0
    assert stop.advice("a.wf").splitlines()[1:] == [
        "  no checkpoint yet (resuming starts again from step 0 with the run's configuration)",
        f"  check the server named above (is it running and reachable?), then resume: srpo-graph train a.wf "
        f"--resume {tmp_path}"]
    ck = tmp_path / "checkpoints" / "step_4"
    full = stopped_at_start(OSError(errno.ENOSPC, "full"), tmp_path, ck)
    assert full is not None and full.steps_done == 4
    assert stopped_at_start(ConfigError("bad"), tmp_path, None) is None
    assert stopped_at_start(ValueError("a bug"), tmp_path, None) is None
    assert stopped_at_start(KeyboardInterrupt(), tmp_path, None) is None
