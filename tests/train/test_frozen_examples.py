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


def test_selfplay_against_a_later_checkpoint(tmp_path):
    """The self-play opponent pointed at a saved policy of an earlier run (its checkpoint folder is
    a model folder): it trains, and the opponent's outputs come from those frozen weights."""
    first = tmp_path / "first"
    base = [sys.executable, "-m", "srpo_graph.cli", "train", "--steps", "2", "rollout.tasks_per_step=2",
            "rollout.samples=2", "logging.plots=false", "logging.tensorboard=false", "eval.every=0"]
    src = ROOT / "workflows" / "selfplay_frozen.wf"
    res = subprocess.run(base[:4] + [str(src)] + base[4:] + ["--run-dir", str(first)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    saved = first / "checkpoints" / "step_2" / "policies" / "me"
    wf = tmp_path / "selfplay_frozen.wf"
    wf.write_text(src.read_text().replace('policy past = "tiny" frozen', f'policy past = "{saved}" frozen'))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "selfplay.jsonl").write_text((ROOT / "workflows" / "tasks" / "selfplay.jsonl").read_text())
    res = subprocess.run(base[:4] + [str(wf)] + base[4:] + ["--run-dir", str(tmp_path / "second")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    import json

    state = json.loads((tmp_path / "second" / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["extra"]["frozen"] == {"past": f'"{saved}" frozen'}
