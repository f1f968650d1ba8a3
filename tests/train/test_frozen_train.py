"""Frozen policies in training (issue 28), on CPU with the real tiny model.

A trained agent beside a frozen one in the same active set: only the trained policy's weights
and optimizer state change; the frozen policy is sampled (its outputs are in the traces at version
0) but has no optimizer, no weights in checkpoints (a pointer in the loop state), no sync; a run
resumes exactly; a changed frozen pointer or a workflow with nothing to train is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from srpo_graph.errors import ConfigError
from srpo_graph.models import resolve_model
from srpo_graph.train.config.loading import validate
from srpo_graph.train.policies import frozen as frozen_mod
from srpo_graph.train.trainer import train

WF = """workflow fz
import std
task {{ target: int }}
policy trained = "tiny"
policy judge = "tiny"{frozen}
agent a {{ policy: trained prompt: "<a>{{task.target}}" sample {{ max_tokens: 1, allow: ["1", "2", "3", "4", "5"] }}
  output: int via std.digit }}
agent b {{ policy: judge prompt: "<b>{{task.target}}" sample {{ max_tokens: 1, allow: ["1", "2", "3", "4", "5"] }}
  output: int via std.digit }}
transition joint {{ consume: a, b activate: end }}
start: a, b
reward: std.digits_sum_to(task.target, a, b)
"""
ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, frozen: str = " frozen", name: str = "fz.wf") -> Path:
    wf = tmp_path / name
    wf.write_text(WF.format(frozen=frozen))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "target": i % 3 + 5}) + "\n" for i in range(8)))
    return wf


def _config(tmp_path: Path, run: str, **over):
    data = {"run_dir": str(tmp_path / run), "steps": 2, "seed": 3,
            "rollout": {"tasks_per_step": 2, "samples": 8, "tasks": str(tmp_path / "tasks.jsonl")},
            "optim": {"lr": 5e-3}, "checkpoint": {"every": 1, "keep_last": 3}, "eval": {"every": 0},
            "logging": {"tensorboard": False, "plots": False, "progress": False}}
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    return validate(data)


def test_only_the_trainable_policy_updates(tmp_path, monkeypatch):
    wf = _write(tmp_path)
    built: dict = {}
    real = frozen_mod.load_frozen

    def spy(*args, **kw):  # the real loader; the test keeps what it loaded, to look at its weights after
        local, external = real(*args, **kw)
        built.update({p.name: p for p in local})
        return local, external

    monkeypatch.setattr(frozen_mod, "load_frozen", spy)
    summary = train(wf, _config(tmp_path, "run"))
    assert summary.steps == 2
    initial = load_file(str(Path(resolve_model("tiny")) / "model.safetensors"))
    # the frozen policy: sampled from a model whose weights never moved and never had a gradient
    judge_model = built["judge"].model
    assert all(not p.requires_grad and p.grad is None for p in judge_model.parameters())
    assert all(torch.equal(v, initial[k]) for k, v in judge_model.state_dict().items() if k in initial)
    step2 = tmp_path / "run" / "checkpoints" / "step_2"
    # the trained policy: its saved weights moved; it alone has optimizer state
    saved = load_file(str(next((step2 / "policies" / "trained").glob("*.safetensors"))))
    assert any(not torch.equal(v, initial[k]) for k, v in saved.items() if k in initial)
    assert sorted(p.name for p in (step2 / "policies").iterdir()) == ["trained"]
    assert sorted(p.stem for p in (step2 / "optim").glob("*.safetensors")) == ["trained"]
    state = json.loads((step2 / "state.json").read_text())
    assert state["extra"]["frozen"] == {"judge": '"tiny" frozen'}  # a pointer, not weights
    # the judge was sampled (recorded, version 0), but is not part of the batch's policies
    eps = [json.loads(line) for line in (tmp_path / "run" / "traces" / "step_1.jsonl").read_text().splitlines()]
    judge_out = [o for e in eps for o in e["outputs"] if o["policy"] == "judge"]
    assert judge_out and all(o["policy_version"] == 0 for o in judge_out)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["compile/frozen_members"] == r["events"] > 0 for r in rows)  # every joint set kept its judge


def test_resume_and_refusals(tmp_path):
    wf = _write(tmp_path)
    train(wf, _config(tmp_path, "part", debug={"stop_after_step": 1}))
    resumed = train(wf, _config(tmp_path, "part"), resume=True)
    assert resumed.steps == 2 and resumed.steps_this_run == 1
    # the frozen policy now points elsewhere: the run would resume against another model
    moved = tmp_path / "moved"
    moved.mkdir()
    wf_moved = _write(moved, name="fz.wf")
    wf_moved.write_text(wf_moved.read_text().replace('policy judge = "tiny" frozen', 'policy judge = "tiny2" frozen'))
    with pytest.raises(ConfigError, match="frozen policy 'judge'"):
        train(wf_moved, _config(tmp_path, "part"), resume=True)


def test_nothing_to_train_is_refused(tmp_path):
    wf = _write(tmp_path)
    wf.write_text(wf.read_text().replace('policy trained = "tiny"', 'policy trained = "tiny" frozen'))
    with pytest.raises(ConfigError, match="nothing to train") as e:
        train(wf, _config(tmp_path, "none"))
    assert str(wf) in str(e.value)
