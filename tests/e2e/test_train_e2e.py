"""End to end on CPU with the real tiny model: train, resume exactly, survive a NaN update.

Every run here is real: the workflow is parsed and checked, episodes are sampled by the tiny
model through the transformers backend, compiled, and the model is updated with the SRPO loss.
Sizes are small (4 tasks x 4 samples per step) so each run takes seconds.
"""

import json
import math
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from srpo_graph.models.tiny import ensure_tiny_model
from srpo_graph.train import checkpoint as ck
from srpo_graph.train.config.loading import load_toml, validate
from srpo_graph.train.observe.metrics import deterministic_fields, read_metrics
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]


def _tasks(tmp_path: Path) -> Path:
    rng = random.Random(0)
    p = tmp_path / "coord.jsonl"
    p.write_text("".join(json.dumps({"id": f"t{i}", "target": rng.randrange(10)}) + "\n" for i in range(24)))
    return p


def _config(tmp_path, run, **extra):
    data = {"steps": 3, "seed": 1, "run_dir": str(tmp_path / run),
            "rollout": {"tasks": str(_tasks(tmp_path)), "tasks_per_step": 4, "samples": 4},
            "eval": {"every": 2, "num_tasks": 4}, "checkpoint": {"every": 2, "keep_last": 2},
            "logging": {"plots_every": 2, "traces_every": 2, "progress": False},
            "compile": {"micro_batch_tokens": 64}}
    for key, value in extra.items():
        section, _, name = key.partition("__")
        if name:
            data.setdefault(section, {})[name] = value
        else:
            data[section] = value
    return validate(data)


def _weights(ckpt_dir: Path, policy: str = "tiny") -> dict[str, torch.Tensor]:
    return load_file(ck.policy_path(ckpt_dir, policy) / "model.safetensors")


@pytest.mark.slow
def test_training_a_coordination_workflow_updates_and_writes_the_run_folder(tmp_path):
    cfg = _config(tmp_path, "run")
    summary = train(ROOT / "workflows" / "coord_mixed.wf", cfg)  # sets of size 2 then 1
    run = Path(summary.run_dir)
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0.0 <= r["reward"] <= 1.0 and r["updates"] == 2 and r["events"] > 0
        assert math.isfinite(r["loss"]) and r["grad_norm/tiny"] > 0
        assert r["mismatch/max_abs"] < 1e-4  # transformers backend: trainer == sampler log-probs
        assert "loss/clip_upper/k2" in r and "loss/clip_upper/k1" in r
        assert {"time/rollout", "time/compile", "time/update", "time/sync"} <= r.keys()
    assert "eval/reward" in rows[1] and "eval/reward" in rows[2]
    assert validate(load_toml(run / "config.toml")).rollout.tasks == cfg.rollout.tasks
    assert {p.name for p in (run / "plots").glob("*.png")} >= {"reward.png", "clip.png", "grad_norm.png"}
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "traces" / "step_1.jsonl").is_file() and (run / "traces" / "step_2.jsonl").is_file()
    assert [s for s, _ in ck.checkpoint_dirs(run)] == [2, 3]
    base = load_file(ensure_tiny_model() / "model.safetensors")
    final = _weights(run / "checkpoints" / "step_3")
    assert max((final[k] - base[k]).abs().max().item() for k in base) > 1e-4  # parameters changed
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


@pytest.mark.slow
def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    wf = ROOT / "workflows" / "coord_par2.wf"
    straight = train(wf, _config(tmp_path, "straight", steps=4))
    # "killed" after step 3: the step-3 metrics line exists but the newest checkpoint is step 2
    _ = train(wf, _config(tmp_path, "resumed", steps=4, debug__stop_after_step=3))
    assert [s for s, _ in ck.checkpoint_dirs(tmp_path / "resumed")] == [2]
    resumed = train(wf, _config(tmp_path, "resumed", steps=4), resume=True)
    a = [deterministic_fields(r) for r in read_metrics(Path(straight.run_dir) / "metrics.jsonl")]
    b = [deterministic_fields(r) for r in read_metrics(Path(resumed.run_dir) / "metrics.jsonl")]
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b
    wa, wb = _weights(tmp_path / "straight/checkpoints/step_4"), _weights(tmp_path / "resumed/checkpoints/step_4")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert straight.eval_rewards == resumed.eval_rewards


@pytest.mark.slow
def test_a_non_finite_update_is_skipped_and_recorded(tmp_path):
    cfg = _config(tmp_path, "nan", steps=2, debug__nonfinite_at_steps=[2], checkpoint__every=1)
    summary = train(ROOT / "workflows" / "coord_seq.wf", cfg)
    rows = read_metrics(Path(summary.run_dir) / "metrics.jsonl")
    assert rows[0]["skipped_updates"] == 0 and rows[1]["skipped_updates"] == 1
    assert rows[1]["updates"] == 1 and "non-finite" in rows[1]["warning"]
    assert summary.skipped_updates == 1
    final = ck.latest_checkpoint(summary.run_dir)
    assert final.name == "step_2"
    assert all(torch.isfinite(t).all() for t in _weights(final).values())
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ck.policy_path(final, "tiny"))
    opt = torch.optim.AdamW(model.parameters())
    assert ck.load_checkpoint(final, optimizers={"tiny": opt}, schedulers={}, restore_rng=False).step == 2


@pytest.mark.slow
def test_role_specialized_policies_each_get_their_update_and_kl(tmp_path):
    """Two policies in one active set (a: p1, b: p2): both models move; KL to a reference each."""
    src = (ROOT / "workflows" / "coord_par2.wf").read_text()
    assert 'policy tiny = "tiny"' in src and src.count("policy: tiny") == 2
    src = src.replace('policy tiny = "tiny"', 'policy p1 = "tiny"\npolicy p2 = "tiny"')
    src = src.replace("policy: tiny", "policy: p1", 1).replace("policy: tiny", "policy: p2", 1)
    wf = tmp_path / "coord_roles.wf"
    wf.write_text(src)
    cfg = _config(tmp_path, "roles", steps=2, loss={"kl_coef": 0.04})
    summary = train(wf, cfg)
    rows = read_metrics(Path(summary.run_dir) / "metrics.jsonl")
    for r in rows:
        assert r["grad_norm/p1"] > 0 and r["grad_norm/p2"] > 0
        assert r["loss/ref_kl"] >= 0 and "loss/clip_upper/k2" in r
    base = load_file(ensure_tiny_model() / "model.safetensors")
    last = Path(summary.run_dir) / "checkpoints" / "step_2"
    w1, w2 = _weights(last, "p1"), _weights(last, "p2")
    for w in (w1, w2):
        assert max((w[k] - base[k]).abs().max().item() for k in base) > 1e-4
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)  # separate models, separate updates
