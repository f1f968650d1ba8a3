"""Ctrl-C (a real SIGINT to a real `srpo-graph train` process) mid-run, then --resume.

The interrupted process must exit 130 without a traceback, name its newest complete checkpoint
and print the command that resumes; the resumed run redoes the steps after that checkpoint
exactly as the interrupted process had run them (same seeds, CPU) and finishes the run.
"""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from srpo_graph.errors import ConfigError
from srpo_graph.train import checkpoint as ck
from srpo_graph.train.config.loading import load_toml, validate
from srpo_graph.train.observe.metrics import deterministic_fields, read_metrics
from srpo_graph.train.trainer import train
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
WF = "workflows/coord_par3.wf"


def _rows(run: Path) -> list[dict]:
    return [deterministic_fields(r) for r in read_metrics(run / "metrics.jsonl")]


def _steps_logged(run: Path) -> int:
    """Complete lines in metrics.jsonl (one per step; the file is written line by line)."""
    path = run / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _progress(run: Path) -> tuple:
    """What the run has written so far: files made in its folder and the metrics file's size."""
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*")) if run.exists() else []
    metrics = run / "metrics.jsonl"
    return tuple(files), metrics.stat().st_size if metrics.exists() else 0


@pytest.mark.slow
def test_sigint_leaves_a_resumable_run_and_says_how(tmp_path):
    run = tmp_path / "run"
    args = ["srpo-graph", "train", WF, "--steps", "8", "--run-dir", str(run), "rollout.tasks_per_step=2",
            "rollout.samples=4", "checkpoint.every=2", "eval.every=0", "logging.tensorboard=false",
            "logging.plots=false"]
    proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # three steps logged, however long the start-up takes on a loaded machine (the wait fails only
    # when the process dies or nothing moves for STALL_S); rows are counted by whole lines, so a
    # line the trainer is still writing is not read as a damaged one
    wait_for(lambda: _steps_logged(run) >= 3, proc=proc, progress=lambda: _progress(run),
             what="three steps in metrics.jsonl")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Aborted" not in err
    done = _rows(run)
    newest = ck.latest_checkpoint(run)
    assert newest is not None and 2 <= int(newest.name.split("_")[1]) <= len(done) < 8
    assert f"newest complete checkpoint: {newest}" in err and f"--resume {run}" in err

    # the wrong workflow is refused (it would load the checkpoint's same-named policy silently)
    with pytest.raises(ConfigError, match="trained workflow 'coord_par3'"):
        train(ROOT / "workflows" / "coord_par2.wf", validate(load_toml(run / "config.toml")), resume=True)

    # what `--resume RUN_DIR` does (tests/e2e/test_train_cli.py runs it as a command), in-process, with
    # the command's one thread (OMP_NUM_THREADS=1 above): a float sum split over two threads rounds
    # differently in its last bits, and the redone steps are compared bit for bit
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = train(ROOT / WF, validate(load_toml(run / "config.toml")), resume=True)
    finally:
        torch.set_num_threads(threads)
    assert summary.steps_this_run == 8 - int(newest.name.split("_")[1])
    resumed = _rows(run)
    assert [r["step"] for r in resumed] == list(range(1, 9))
    assert resumed[: len(done)] == done  # the redone steps equal what the interrupted run did
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
