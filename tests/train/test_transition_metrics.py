"""Per-transition reward means and per-route-label statistics: metrics.jsonl, TensorBoard, plots.

A real run (the tiny model, coord_routed.wf: a router picks one of three specialists, every
transition has its own reward); the logged values are compared with a plain loop over the
step's own trace file, which reads the router's label straight from the router's output.
"""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow
from srpo_graph.runtime.trace import read_traces
from srpo_graph.train.config.loading import validate
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.observe.transitions import transition_metrics
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_routed.wf"


def _reference(episodes) -> dict[str, float]:
    rewards, picks, by_label, returns = defaultdict(list), defaultdict(int), defaultdict(list), defaultdict(list)
    firings = 0
    for ep in episodes:
        value_of = {o.id: o.value for o in ep.outputs}
        for rec in ep.transitions:
            rewards[rec.name].append(rec.reward)
            if rec.name == "dispatch":
                firings += 1
                label = value_of[rec.consumed[0]] or "none"
                picks[label] += 1
                by_label[label].append(rec.reward)
                returns[label].append(ep.reward)
    out = {f"reward/{t}": sum(v) / len(v) for t, v in rewards.items()}
    out.update({f"reward/dispatch/{k}": sum(v) / len(v) for k, v in by_label.items()})
    out.update({f"route/dispatch/{k}": n / firings for k, n in picks.items()})
    out.update({f"route_return/dispatch/{k}": sum(v) / len(v) for k, v in returns.items()})
    return out


@pytest.mark.slow
def test_a_routed_run_logs_each_transition_and_route_label(tmp_path):
    tasks = tmp_path / "routed.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "target": i % 10, "route": "abc"[i % 3]}) + "\n"
                             for i in range(12)))
    cfg = validate({"steps": 2, "seed": 3, "run_dir": str(tmp_path / "run"),
                    "rollout": {"tasks": str(tasks), "tasks_per_step": 4, "samples": 4},
                    "eval": {"every": 0}, "checkpoint": {"every": 0},
                    "logging": {"plots_every": 1, "traces_every": 1, "progress": False}})
    run = Path(train(WF, cfg).run_dir)
    rows = read_metrics(run / "metrics.jsonl")
    wf = load_workflow(WF)
    for row in rows:
        episodes = read_traces(run / "traces" / f"step_{row['step']}.jsonl")
        expect = _reference(episodes)
        got = {k: v for k, v in row.items() if k.split("/")[0] in ("reward", "route", "route_return") and "/" in k}
        assert got.keys() == expect.keys()
        assert all(abs(got[k] - expect[k]) < 1e-12 for k in expect), (got, expect)
        assert "reward/dispatch" in got and abs(sum(v for k, v in got.items() if k.startswith("route/")) - 1) < 1e-9
        assert transition_metrics(wf, episodes) == got
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert {"reward/dispatch", "reward/done_a"} <= set(acc.Tags()["scalars"])
    assert any(t.startswith("route/dispatch/") for t in acc.Tags()["scalars"])
    assert {"transition_rewards.png", "routes.png"} <= {p.name for p in (run / "plots").glob("*.png")}
