"""The frozen-policy examples (issue 28) train with one command: a few steps each on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("wf,extra", [
    ("selfplay_frozen.wf", []),
    # the recipe model takes minutes to build: the same workflow on the tiny model
    ("tinymath_frozen_verifier.wf", ['rollout.models={"*"="tiny"}']),
])
def test_example_trains(tmp_path, wf, extra):
    cmd = [sys.executable, "-m", "srpo_graph.cli", "train", str(ROOT / "workflows" / wf), "--steps", "2",
           "--run-dir", str(tmp_path / "run"), "rollout.tasks_per_step=2", "rollout.samples=2",
           "logging.plots=false", "logging.tensorboard=false", "eval.every=0", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()
    assert not (tmp_path / "run" / "checkpoints" / "step_2" / "policies" / "past").exists()
