"""The supervising parent itself (srpo_graph/supervisor.py, Note [User code that ends the process]),
on small real processes that import nothing else: what it reports, which status it exits with, and
that the signals sent to it reach the child once. The commands are tested in
tests/e2e/test_user_code_exits.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srpo_graph.supervisor import USER_EXIT
from tests.support.waiting import wait_for

pytestmark = pytest.mark.proc  # a parent and its child, both real (each case well under a second)

ROOT = Path(__file__).resolve().parents[1]
HEAD = "import os, signal, sys, time\nfrom srpo_graph import supervisor\nsupervisor.supervise('demo')\n"


def _start(body: str, tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HEAD + body, str(tmp_path)], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _ran(body: str, tmp_path: Path) -> tuple[int, str]:
    proc = _start(body, tmp_path)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_an_exit_outside_the_normal_path_is_named_and_never_0(tmp_path):
    code, err = _ran("with supervisor.running('reward m.f (module m, a.wf:3:9)'):\n    os._exit(0)\n", tmp_path)
    assert code == USER_EXIT and err == (
        "srpo-graph demo: the process ended before the command finished: it exited with status 0 outside "
        "srpo-graph's own exit (os._exit or a library's exit) while running reward m.f (module m, a.wf:3:9)\n")


def test_the_newest_of_several_running_calls_is_named_and_the_others_counted(tmp_path):
    body = ("a = supervisor.running('tool a'); a.__enter__()\nb = supervisor.running('tool b'); b.__enter__()\n"
            "c = supervisor.running('tool c'); c.__enter__(); c.__exit__()\nsupervisor.note_stop('  resume: x')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    code, err = _ran(body, tmp_path)
    assert code == 137 and err == ("srpo-graph demo: the process ended before the command finished: it was killed "
                                   "by SIGKILL (signal 9) while running tool b (and 1 other user call)\n  resume: x\n")


def test_a_finished_child_s_status_stands_whatever_ends_it_after(tmp_path):
    code, err = _ran("supervisor.finished(5)\nos._exit(0)\n", tmp_path)  # e.g. a user thread at exit
    assert (code, err) == (5, "")
    code, err = _ran("supervisor.finished(0)\nsys.exit(0)\n", tmp_path)
    assert (code, err) == (0, "")


def test_sigterm_to_the_parent_ends_the_child_and_the_parent_as_before(tmp_path):
    """No line: the signal came from outside; the parent dies of it, as the lone process did."""
    proc = _start("open(sys.argv[1] + '/ready', 'w').close()\ntime.sleep(60)\n", tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), proc=proc, what="the child's start")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (-signal.SIGTERM, "")


def test_sigint_to_the_parent_reaches_the_child_once(tmp_path):
    body = ("got = []\nsignal.signal(signal.SIGINT, lambda *a: got.append(1))\n"
            "open(sys.argv[1] + '/ready', 'w').close()\nend = time.monotonic() + 30\n"
            "while not got and time.monotonic() < end: time.sleep(0.01)\ntime.sleep(0.5)\n"
            "open(sys.argv[1] + '/count', 'w').write(str(len(got)))\nsupervisor.finished(130)\nsys.exit(130)\n")
    proc = _start(body, tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), proc=proc, what="the child's start")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err, (tmp_path / "count").read_text()) == (130, "", "1")


def test_a_killed_parent_takes_the_child_with_it(tmp_path):
    body = ("signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[1] + '/stopped', 'w').close(), os._exit(0)))\n"
            "open(sys.argv[1] + '/ready', 'w').close()\ntime.sleep(60)\n")
    proc = _start(body, tmp_path)
    wait_for(lambda: (tmp_path / "ready").exists(), proc=proc, what="the child's start")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while not (tmp_path / "stopped").exists():  # the child got SIGTERM (PR_SET_PDEATHSIG)
        assert time.monotonic() < deadline
        time.sleep(0.02)
