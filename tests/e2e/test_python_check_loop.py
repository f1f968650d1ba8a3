"""A loop stopped by a Python check, run and trained end to end with the real tiny model.

``judge`` calls ``checks.verdict(a, task.target) -> Literal["stop", "again"]`` as a tool and
routes on its result: ``again`` sends the task back to ``a`` (at most 3 rounds), ``stop`` ends
the episode. Every firing in the traces must have routed as the Python check says, and a check
returning a label outside its ``Literal`` fails the episode naming the tool and its line.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.train.config.loading import validate
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.trainer import train

CHECKS = '''from typing import Literal


def verdict(guess: int | None, target: int) -> Literal["stop", "again"]:
    return "stop" if guess == target else "again"


def broken(guess: int | None, target: int) -> Literal["stop", "again"]:
    return "halt"
'''

WF = '''workflow retry "a digit is retried until a Python check says stop"
import std
import {mod} as checks
task {{ target: int }}
policy tiny = "tiny"
agent a {{
  policy: tiny
  prompt: "<a>{{task.target}}"
  sample {{ max_tokens: 1, allow: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"] }}
  output: int via std.digit
}}
transition judge {{
  consume: a
  tool verdict = checks.{fn}(a, task.target)
  reward: std.equals(a, task.target)
  activate: route verdict {{ stop -> end, again -> a }}
  max_rounds: 3
}}
start: a
'''


@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory, tiny_copy):
    from tests.support.models import tiny_backend_at

    return tiny_backend_at(tiny_copy(tmp_path_factory.mktemp("tiny") / "tiny"))


def _workflow(tmp_path: Path, fn: str = "verdict") -> Path:
    mod = f"loop_checks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(CHECKS, encoding="utf-8")
    path = tmp_path / f"retry_{fn}.wf"
    path.write_text(WF.format(mod=mod, fn=fn), encoding="utf-8")
    return path


def test_every_firing_routes_as_the_python_check_says(tmp_path, tiny_backend):
    wf = load_workflow(_workflow(tmp_path))
    tasks = [Task(id=f"t{i}", fields={"target": i}) for i in range(10)]
    eps = run(wf, tasks, {"tiny": tiny_backend}, samples=4, seed=0).episodes
    rounds = []
    for ep in eps:
        target = int(ep.task_id[1:])
        value = {o.id: o.value for o in ep.outputs}
        for k, rec in enumerate(ep.transitions):
            guess = value[rec.consumed[0]]
            assert rec.tool_results == {"verdict": "stop" if guess == target else "again"}
            assert rec.activated == (["end"] if guess == target else ["a"])
            assert rec.reward == (1.0 if guess == target else 0.0)
            assert (k < len(ep.transitions) - 1) <= (guess != target)  # only the last firing may stop
        stopped = ep.transitions[-1].tool_results == {"verdict": "stop"}
        assert ep.status == ("ok" if stopped else "truncated") and len(ep.transitions) <= 3
        rounds.append(len(ep.transitions))
    assert {1, 3} <= set(rounds)  # some stop at once, some use every round (random tiny model)


def test_a_check_outside_its_literal_fails_the_episode_naming_the_tool(tmp_path, tiny_backend):
    path = _workflow(tmp_path, "broken")
    wf = load_workflow(path)
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "tool verdict" in s)
    eps = run(wf, [Task(id="t0", fields={"target": 1})], {"tiny": tiny_backend}, samples=2, seed=0).episodes
    for ep in eps:
        assert ep.status == "failed"
        assert ep.error.startswith(f"{wf.path}:{line}:3: error: tool 'verdict' raised ValueError(\"returned 'halt', "
                                   "not one of its labels ['stop', 'again']\")"), ep.error


@pytest.mark.slow
def test_the_loop_trains_end_to_end(tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "target": i % 10}) + "\n" for i in range(16)))
    cfg = validate({"steps": 2, "seed": 0, "run_dir": str(tmp_path / "run"),
                    "rollout": {"tasks": str(tasks), "tasks_per_step": 4, "samples": 4},
                    "eval": {"every": 0}, "checkpoint": {"every": 0},
                    "logging": {"progress": False, "tensorboard": False}})
    summary = train(_workflow(tmp_path), cfg)
    rows = read_metrics(Path(summary.run_dir) / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["updates"] >= 1 and r["events"] > r["episodes"] / 2
        assert abs(r["route/judge/stop"] + r["route/judge/again"] - 1) < 1e-9
        assert r["reward/judge/stop"] == 1.0 and r["reward/judge/again"] == 0.0
