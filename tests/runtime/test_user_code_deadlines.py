"""User code with deadlines, off the main thread, and every failure counted (issue 23 items 3 and 6,
issue 24 item 1): the attacks that found them, on the real tiny model.

* a reward that sleeps 60 s: its episodes fail at the reward deadline, naming the reward's line;
* a tool that hangs: its episode fails at the tool deadline, the other episodes finish;
* ``SystemExit(0)`` / ``KeyboardInterrupt`` raised by a reward or a tool: the episode fails with its
  ``.wf`` location, the process goes on;
* a reward returning ``"1.0"`` or ``True``: an error naming the reward, never 1.0;
* one SIGINT / SIGTERM to a real ``srpo-graph run`` whose tool hangs: the process ends at once;
* a signal that the kernel hands to another thread than the main one (a tool's, a reward's) stops the
  run at once too, under either scheduler (usercode.py, Note [A signal reaches the main thread's waits]).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.usercode import Deadlines
from tests.support.signals import signal_to_a_worker_thread
from tests.support.user_code import make
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TASKS = [Task(id="t0", fields={"target": 4}), Task(id="t1", fields={"target": 7})]


def _run(path: Path, tiny_backend, **kw):
    return run(load_workflow(path), TASKS, {"tiny": tiny_backend}, samples=2, seed=0, **kw)


def test_a_sleeping_reward_fails_its_episodes_at_the_deadline(tmp_path, tiny_backend):
    path, _, line = make(tmp_path, reward="sleepy_reward")
    t0 = time.monotonic()
    res = _run(path, tiny_backend, deadlines=Deadlines(reward=0.3))
    took = time.monotonic() - t0
    assert took < 15, took  # 4 episodes x 0.3 s, not 4 x 60 s
    for ep in res.episodes:
        assert ep.status == "failed"
        assert ep.error.startswith(f"{path}:{line}:9: error: terminal reward mine.sleepy_reward did not return "
                                   f"within 0.3 s (rollout.deadlines.reward)"), ep.error
    assert res.stats.failed_by_kind == {"timeout": 4} and res.stats.failures == 4
    assert res.stats.first_failure["timeout"] == res.episodes[0].error


def test_a_hanging_tool_fails_its_episode_at_the_deadline_and_names_the_tool(tmp_path, tiny_backend):
    path, _, line = make(tmp_path, tool="hang")
    t0 = time.monotonic()
    res = _run(path, tiny_backend, deadlines=Deadlines(tool=0.3))
    assert time.monotonic() - t0 < 15
    for ep in res.episodes:
        assert ep.status == "failed"
        assert ep.error.startswith(f"{path}:{line}:3: error: tool 'note' (mine.hang) did not return within 0.3 s "
                                   "(rollout.deadlines.tool) (transition 'hand_off')"), ep.error
    assert res.stats.failed_by_kind == {"timeout": 4}


def test_an_extractor_past_its_deadline_fails_the_episode(tmp_path, tiny_backend):
    path, _, line = make(tmp_path, extractor="sleepy_digit")
    res = _run(path, tiny_backend, deadlines=Deadlines(extractor=0.2))
    assert all(ep.status == "failed" and ep.error.startswith(f"{path}:{line}:19: error: extractor mine.sleepy_digit "
                                                              "of agent 'a' did not return within 0.2 s")
               for ep in res.episodes), [ep.error for ep in res.episodes]


@pytest.mark.parametrize(
    "reward, shown",
    [
        ("exit_reward", "SystemExit(0)"),
        ("interrupt_reward", "KeyboardInterrupt()"),
        ("raising_reward", "ValueError('reward broke')"),
    ],
)
def test_any_base_exception_from_a_reward_fails_the_episode_with_its_location(tmp_path, tiny_backend, reward, shown):
    path, _, line = make(tmp_path, reward=reward)
    res = _run(path, tiny_backend)  # SystemExit / KeyboardInterrupt must not leave the run
    assert len(res.episodes) == 4
    for ep in res.episodes:
        assert ep.status == "failed"
        assert ep.error == f"{path}:{line}:9: error: terminal reward mine.{reward}: {shown}", ep.error
    assert res.stats.failed_by_kind == {"reward": 4}


def test_system_exit_from_a_tool_fails_the_episode_naming_the_tool(tmp_path, tiny_backend):
    path, _, line = make(tmp_path, tool="exit_tool")
    res = _run(path, tiny_backend)
    assert all(ep.error.startswith(f"{path}:{line}:3: error: tool 'note' raised SystemExit(3)") for ep in res.episodes)
    assert res.stats.failed_by_kind == {"tool": 4}


@pytest.mark.parametrize("reward, shown", [("str_reward", "'1.0' (a str)"), ("bool_reward", "True (a bool)")])
def test_a_reward_must_return_a_real_number(tmp_path, tiny_backend, reward, shown):
    path, _, line = make(tmp_path, reward=reward)
    res = _run(path, tiny_backend)
    for ep in res.episodes:
        assert ep.status == "failed" and ep.reward == 0.0
        assert ep.error == (
            f"{path}:{line}:9: error: terminal reward mine.{reward}: returned {shown}; a reward "
            "returns a real number (int or float), not a bool or str"
        ), ep.error


def test_failures_of_every_kind_are_counted_with_the_first_of_each(tmp_path, tiny_backend):
    path, _, line = make(tmp_path, reward="half_reward")  # odd targets raise: t1's 2 episodes
    res = _run(path, tiny_backend)
    assert res.stats.failures == 2 and res.stats.failed_by_kind == {"reward": 2}
    assert res.stats.first_failure["reward"].startswith(f"{path}:{line}:9: error: terminal reward mine.half_reward")


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}



@pytest.mark.parametrize(
    "user_code, thread, scheduler",
    [({"tool": "hang"}, "srpo-tool", "lockstep"), ({"tool": "hang"}, "srpo-tool", "streaming"),
     ({"reward": "sleepy_reward"}, "srpo-reward", "lockstep")],
    ids=["tool-lockstep", "tool-streaming", "reward-call"],
)
def test_a_signal_the_kernel_hands_to_a_user_codes_thread_stops_the_run_at_once(tmp_path, tiny_backend, user_code,
                                                                                 thread, scheduler):
    """The handler runs in the main thread, which waits on the user code's thread: a tool's (the
    schedulers' waits: runtime/lockstep.py, runtime/streaming.py) or a reward's (``usercode.call``).
    Before their waits were sliced, the main thread slept on until the deadline (20 s here: a tool
    that hangs for an hour, a reward that sleeps 60 s) and only then raised -- once seen in CI as a
    Ctrl-C to `srpo-graph train` that took a minute (the default 60 s). Now: within a slice (0.5 s)."""
    path, _, _ = make(tmp_path, **user_code)
    with signal_to_a_worker_thread(thread) as sent:
        with pytest.raises(KeyboardInterrupt):
            _run(path, tiny_backend, deadlines=Deadlines(tool=20, reward=20), scheduler=scheduler)
        stopped = time.monotonic()
    assert sent, f"no thread {thread!r} ran"
    assert stopped - sent[0] < 10, stopped - sent[0]  # a slice, not the 20 s deadline


@pytest.mark.proc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_stops_run_while_a_tool_hangs(tmp_path, sig):
    """A real ``srpo-graph run`` process; the tool sleeps an hour (deadline 60 s): one signal ends it."""
    path, mod, _ = make(tmp_path, tool="hang")
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "target": 3}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "srpo_graph.cli",
            "run",
            str(path),
            "--tasks",
            str(tasks),
            "--samples",
            "2",
            "--out",
            str(out),
            "--quiet",
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for((tmp_path / f"{mod}.py.started").exists, proc=proc, what="the tool running")
    proc.send_signal(sig)
    try:  # the tool sleeps an hour (its deadline 60 s): a stop within this bound is the signal's doing
        _, err = proc.communicate(timeout=50)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("one signal did not stop `srpo-graph run` while a tool hung")
    assert proc.returncode != 0
    assert "Traceback" not in err, err[-2000:]


@pytest.mark.proc
def test_run_ends_with_its_status_while_a_reward_past_its_deadline_is_inside_an_extension(tmp_path):
    """A reward abandoned at its deadline while pydantic-core (Rust) runs its Python validator: the
    real ``srpo-graph run`` prints its result and exits 5 (every episode failed). Before, the
    interpreter's finalization unwound that thread through the Rust frames and glibc aborted the
    process after the result: "FATAL: exception not rethrown", exit 134 (exiting.py, Note [A daemon
    thread at finalization])."""
    path, _, line = make(tmp_path, reward="stuck_in_a_library_reward")
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "target": 3}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "run", str(path), "--tasks", str(tasks),
                           "--samples", "1", "--out", str(out), "--quiet", "--deadline", "reward=1"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "exception not rethrown" not in proc.stderr
    assert f"{path}:{line}:9: error: terminal reward mine.stuck_in_a_library_reward did not return within 1 s" \
        in proc.stderr.replace("\n", " ")
    assert "every one of the 1 episodes failed" in proc.stderr
    assert len(out.read_text().splitlines()) == 1  # flushed before the process ended


def test_run_command_reports_each_kind_once_and_fails_when_every_episode_failed(tmp_path):
    from click.testing import CliRunner

    from srpo_graph.cli import app

    path, _, line = make(tmp_path, reward="exit_reward")
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "target": 3}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(path),
            "--tasks",
            str(tasks),
            "--samples",
            "2",
            "--out",
            str(out),
            "--quiet",
            "--deadline",
            "reward=5",
        ],
    )
    assert res.exit_code == 5, res.output
    assert (
        f"2 failed (reward), first: {path}:{line}:9: error: terminal reward mine.exit_reward: SystemExit(0)"
        in res.output.replace("\n", " ")
    )
    assert "every one of the 2 episodes failed" in res.output
    assert len(out.read_text().splitlines()) == 2  # the failed episodes are written, with their errors
    bad = CliRunner().invoke(app, ["run", str(path), "--tasks", str(tasks), "--out", str(out), "--deadline", "rewad=5"])
    assert bad.exit_code == 7 and "--deadline rewad=5: error: expected KIND=SECONDS" in bad.output
