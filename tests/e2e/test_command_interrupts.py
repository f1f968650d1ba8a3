"""Ctrl-C (a real SIGINT) in the middle of a command's work: exit 130 and one line, as ``train``
does (issue 40.8; ``cli.py``) -- never click's "Aborted!" with exit 1, never a traceback.

The commands that work long enough to be interrupted: ``run`` (after its first episode is written:
the line says how many are in the trace file, which stays valid) and ``eval`` (during its rollouts).
``train``'s own messages are tested in test_train_interrupt.py; ``lsp`` is a server its editor
stops (pygls ends it quietly on Ctrl-C, exit 0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srpo_graph.runtime.trace import read_traces

pytestmark = pytest.mark.proc  # real SIGINTs to real `run` / `eval` processes

ROOT = Path(__file__).resolve().parents[2]
WF = str(ROOT / "workflows" / "coord_seq.wf")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _many_tasks(path: Path) -> str:
    path.write_text("".join(json.dumps({"id": f"t{i}", "target": i % 10 + 4}) + "\n" for i in range(3000)))
    return str(path)


def _interrupt(args: list[str], cwd: Path, ready) -> tuple[int, str]:
    """Start ``srpo-graph ARGS``, SIGINT it once ``ready()``; (exit status, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "srpo_graph.cli", *args], cwd=cwd, env=ENV,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _one_line(err: str) -> str:
    assert "Traceback" not in err and "Aborted" not in err, err[-2000:]
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert len(said) == 1, err[-2000:]
    return said[0]


def test_ctrl_c_in_run_is_one_line_and_130_with_the_trace_file_valid(tmp_path):
    out = tmp_path / "traces.jsonl"
    args = ["run", WF, "--tasks", _many_tasks(tmp_path / "tasks.jsonl"), "--samples", "4", "--out", str(out),
            "--quiet", "--max-concurrent", "1"]
    code, err = _interrupt(args, tmp_path, lambda: out.exists() and out.stat().st_size > 0)
    assert code == 130, err[-2000:]
    line = _one_line(err)
    written = len(read_traces(out))  # valid JSONL: every finished episode, whole
    assert line == f"srpo-graph run: interrupted; the {written} episodes finished before are in {out} (valid JSONL)"


def test_ctrl_c_in_eval_is_one_line_and_130(tmp_path):
    """The generic line (cli.py) for a command with nothing of its own to say."""
    args = ["eval", WF, "base", "--tasks", _many_tasks(tmp_path / "tasks.jsonl"), "--samples", "8"]
    started = time.monotonic()  # sampling thousands of episodes: interrupted once its rollouts run
    code, err = _interrupt(args, tmp_path, lambda: time.monotonic() - started > 8)
    assert code == 130, err[-2000:]
    assert _one_line(err) == "srpo-graph eval: interrupted", err[-2000:]
