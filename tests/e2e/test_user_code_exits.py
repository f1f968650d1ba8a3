"""User code that ends the process (issue 40, item 3): every way it can -- ``os._exit(0)``,
``os._exit(3)``, SIGKILL and SIGTERM sent to itself, a real segfault -- is observed by the
command's supervising parent and reported, never a silent success (srpo_graph/supervisor.py,
Note [User code that ends the process]): a non-zero exit, one line naming how the process ended
and the user call that was running, and for ``train`` where the run stands and the command that
resumes it. Real faults in real ``srpo-graph`` processes; a tiny model, one or two steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.user_code import make

pytestmark = pytest.mark.proc  # each case is a real `srpo-graph` process that user code ends

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
TRAIN = ["rollout.tasks_per_step=1", "rollout.samples=2", "eval.every=0", "logging.tensorboard=false",
         "logging.plots=false"]
# how each fault ends the process: the words of the parent's line, and the exit status
ENDS = {
    "exit0": ("it exited with status 0 outside srpo-graph's own exit (os._exit or a library's exit)", 8),
    "exit3": ("it exited with status 3 outside srpo-graph's own exit (os._exit or a library's exit)", 8),
    "sigkill": ("it was killed by SIGKILL (signal 9)", 137),
    "sigterm": ("it was killed by SIGTERM (signal 15)", 143),
    "segfault": ("it crashed in native code (SIGSEGV, signal 11)", 139),
}


def _tasks(tmp_path: Path) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t0", "target": 5}\n{"id": "t1", "target": 7}\n', encoding="utf-8")
    return str(path)


def _srpo_graph(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "srpo_graph.cli", *args], cwd=cwd, env={**ENV, **env},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)


def _died(err: str, command: str, how: str, what: str) -> None:
    """Exactly one line says how the process ended and names the user call; no traceback."""
    lines = [line for line in err.splitlines() if "the process ended before the command finished" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0] == f"srpo-graph {command}: the process ended before the command finished: {ENDS[how][0]} " \
                       f"while running {what}", err[-3000:]


@pytest.mark.parametrize("how", list(ENDS))
def test_run_names_the_reward_that_ended_it(tmp_path, how):
    wf, mod, line = make(tmp_path, reward=f"{how}_reward")
    done = _srpo_graph(["run", str(wf), "--tasks", _tasks(tmp_path), "--samples", "1", "--quiet",
                        "--out", str(tmp_path / "out.jsonl")], tmp_path)
    assert done.returncode == ENDS[how][1], done.stderr[-3000:]
    _died(done.stderr, "run", how, f"reward mine.{how}_reward (module {mod}, {wf}:{line}:9)")


@pytest.mark.parametrize("how", list(ENDS))
def test_train_names_the_reward_and_says_how_to_resume(tmp_path, how):
    """The reward spares the first step (it returns 0 until step 1's checkpoint exists), so the
    resume line names that checkpoint."""
    wf, mod, line = make(tmp_path, reward=f"{how}_reward")
    run = tmp_path / "run"
    done = _srpo_graph(["train", str(wf), "--tasks", _tasks(tmp_path), "--steps", "3", "--run-dir", str(run),
                        "checkpoint.every=1", *TRAIN], tmp_path, USER_CODE_END_ONCE=str(run / "checkpoints" / "step_1"))
    err = done.stderr
    assert done.returncode == ENDS[how][1], err[-3000:]
    if how == "sigterm":  # train stops on SIGTERM as when it comes from outside: its own stop, resumable
        assert "srpo-graph train: interrupted after step 1" in err and "ended before" not in err, err[-3000:]
    else:
        _died(err, "train", how, f"reward mine.{how}_reward (module {mod}, {wf}:{line}:9)")
    assert err.rstrip().endswith(f"  newest complete checkpoint: {run / 'checkpoints' / 'step_1'}"
                                 + (" (step 1)" if how == "sigterm" else "")
                                 + f"\n  resume: srpo-graph train {wf} --resume {run}"), err[-3000:]


def test_a_tool_that_ends_run_is_named_with_its_transition(tmp_path):
    wf, mod, line = make(tmp_path, tool="exit0_tool")
    done = _srpo_graph(["run", str(wf), "--tasks", _tasks(tmp_path), "--samples", "1", "--quiet",
                        "--out", str(tmp_path / "out.jsonl")], tmp_path)
    assert done.returncode == 8, done.stderr[-3000:]
    _died(done.stderr, "run", "exit0",
          f"tool 'note' mine.exit0_tool of transition 'hand_off' (module {mod}, {wf}:{line}:15)")


def test_eval_names_the_reward_that_ended_it(tmp_path):
    wf, mod, line = make(tmp_path, reward="sigkill_reward")
    done = _srpo_graph(["eval", str(wf), "base", "--tasks", _tasks(tmp_path), "--samples", "1"], tmp_path)
    assert done.returncode == 137, done.stderr[-3000:]
    _died(done.stderr, "eval", "sigkill", f"reward mine.sigkill_reward (module {mod}, {wf}:{line}:9)")


def test_check_names_the_module_whose_import_ended_it(tmp_path):
    wf, mod, _ = make(tmp_path, reward="exit0_reward")
    done = _srpo_graph(["check", str(wf)], tmp_path, USER_CODE_END_AT_IMPORT="segfault")
    assert done.returncode == 139, done.stderr[-3000:]
    _died(done.stderr, "check", "segfault", f"the import of module {mod!r} (from {tmp_path})")


@pytest.mark.slow
def test_train_nproc_2_names_the_rank_and_says_how_to_resume(tmp_path):
    """A rank's os._exit(0) is a failure torchrun sees (the rank's own parent exits 8): the job stops,
    the rank's line names the reward, the launcher prints where the run stands."""
    wf, mod, line = make(tmp_path, reward="exit0_reward")
    run = tmp_path / "run"
    done = _srpo_graph(["train", str(wf), "--tasks", _tasks(tmp_path), "--steps", "1", "--nproc", "2",
                        "--run-dir", str(run), "rollout.tasks_per_step=2", *TRAIN[1:]], tmp_path)
    err = done.stderr
    assert done.returncode == 8, err[-3000:]
    died = [ln for ln in err.splitlines() if "the process ended before the command finished" in ln]
    assert died and all(ln.startswith("srpo-graph train (rank ") for ln in died), err[-3000:]
    assert died[0].endswith(f"{ENDS['exit0'][0]} while running reward mine.exit0_reward (module {mod}, "
                            f"{wf}:{line}:9)"), err[-3000:]
    assert f"start again: srpo-graph train {wf} --run-dir {run} --overwrite" in err, err[-3000:]
