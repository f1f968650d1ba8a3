"""Training does what it is for: on coord_par2 (2 parallel agents, chance reward 0.1) the train
reward rises well above chance within 30 steps of 16 tasks x 8 samples (seed 0, CPU).

Real rollouts, compile, SRPO updates; nothing mocked. The thresholds sit far from both ends:
with this seed the first 5 steps average 0.13 and the last 5 average 0.64 (docs/results.md has curves over 2 seeds),
and a
run that does not learn stays near 0.1. It guards the whole loop (sampling, traces, compile,
loss, optimizer, weight sync), which unit tests of each stage cannot.
"""

from pathlib import Path

import pytest

from srpo_graph.train.config.loading import validate
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_reward_rises_well_above_chance(tmp_path):
    cfg = validate(
        {
            "steps": 30,
            "seed": 0,
            "run_dir": str(tmp_path / "learn"),
            "rollout": {"tasks_per_step": 16, "samples": 8},
            "eval": {"every": 0},
            "checkpoint": {"every": 0},
            "logging": {"progress": False, "tensorboard": False, "plots": False, "traces_every": 0},
        }
    )
    summary = train(ROOT / "workflows" / "coord_par2.wf", cfg)
    rewards = [r["reward"] for r in read_metrics(Path(summary.run_dir) / "metrics.jsonl")]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= 0.3 and last >= first + 0.15, [round(r, 3) for r in rewards]
