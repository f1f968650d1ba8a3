"""A frozen policy on REAL SGLang servers that `train` launches (issue 28): the trained policy and
the frozen one each get a server (distinct ports, one `for_training` call); the trained one is
synced every step, the frozen one never (its outputs stay at version 0), and only the trained
policy is checkpointed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.sglang_servers import _free_port, require_sglang

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_selfplay_with_a_frozen_opponent_trains_on_sglang(tmp_path):
    import torch

    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.trainer import train

    require_sglang()
    torch.set_num_threads(1)
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            "steps=2",
            f"run_dir={json.dumps(str(run))}",
            "rollout.backend=sglang",
            "rollout.sglang.launch=cpu",
            f"rollout.sglang.port={_free_port(30040, 30090)}",
            "rollout.tasks_per_step=2",
            "rollout.samples=4",
            "eval.every=0",
            "logging.tensorboard=false",
            "logging.progress=false",
            "logging.plots=false",
            "logging.traces_every=1",
        ],
    )
    summary = train(ROOT / "workflows" / "selfplay_frozen.wf", cfg)
    assert summary.steps == 2
    assert (run / "sglang" / "me.log").is_file() and (run / "sglang" / "past.log").is_file()  # a server each
    eps = [json.loads(line) for line in (run / "traces" / "step_2.jsonl").read_text().splitlines()]
    versions = {(o["policy"], o["policy_version"]) for e in eps for o in e["outputs"]}
    assert versions == {("me", 1), ("past", 0)}  # the trained server was synced after step 1, the frozen never
    assert sorted(p.name for p in (run / "checkpoints" / "step_2" / "policies").iterdir()) == ["me"]
