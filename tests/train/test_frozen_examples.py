"""The frozen-policy examples (issue 28) train with one command: a few steps each on CPU (the command
in process: tests/support/cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("wf,extra", [
    ("selfplay_frozen.wf", []),
    # the recipe model takes minutes to build: the same workflow on the tiny model
    ("tinymath_frozen_verifier.wf", ['rollout.models={"*"="tiny"}']),
])
def test_example_trains(tmp_path, wf, extra):
    res = invoke("train", ROOT / "workflows" / wf, "--steps", "2", "--run-dir", tmp_path / "run",
                 "rollout.tasks_per_step=2", "rollout.samples=2", "logging.plots=false", "logging.tensorboard=false",
                 "eval.every=0", *extra, cwd=ROOT)
    assert res.exit_code == 0, res.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()
    assert not (tmp_path / "run" / "checkpoints" / "step_2" / "policies" / "past").exists()


def test_selfplay_against_a_later_checkpoint(tmp_path):
    """The self-play opponent pointed at a saved policy of an earlier run (its checkpoint folder is
    a model folder): it trains, and the opponent's outputs come from those frozen weights."""
    first = tmp_path / "first"
    base = ["--steps", "2", "rollout.tasks_per_step=2", "rollout.samples=2", "logging.plots=false",
            "logging.tensorboard=false", "eval.every=0"]
    src = ROOT / "workflows" / "selfplay_frozen.wf"
    res = invoke("train", src, *base, "--run-dir", first, cwd=ROOT)
    assert res.exit_code == 0, res.stderr[-2000:]
    saved = first / "checkpoints" / "step_2" / "policies" / "me"
    wf = tmp_path / "selfplay_frozen.wf"
    wf.write_text(src.read_text().replace('policy past = "tiny" frozen', f'policy past = "{saved}" frozen'))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "selfplay.jsonl").write_text((ROOT / "workflows" / "tasks" / "selfplay.jsonl").read_text())
    res = invoke("train", wf, *base, "--run-dir", tmp_path / "second", cwd=ROOT)
    assert res.exit_code == 0, res.stderr[-2000:]
    import json

    state = json.loads((tmp_path / "second" / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["extra"]["frozen"] == {"past": f'"{saved}" frozen'}


def test_frozen_verifier_breakdown_against_hand_counts(tmp_path):
    """``benchmarks/frozen_verifier.py``'s reading of an eval's traces (docs/results.md): the solver's and
    the verifier's accuracy, the copy rate, the verifier's accuracy after a right / a wrong solution, and
    the solver's paired difference to ``base``, against counts made by hand on made-up episodes."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("frozen_verifier", ROOT / "benchmarks" / "frozen_verifier.py")
    fv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fv)
    tasks = [
        json.loads(line) for line in (ROOT / "workflows" / "tasks" / "tinymath_eval.jsonl").read_text().splitlines()[:2]
    ]

    def ep(task, solver, verifier):
        return {
            "task_id": task["id"],
            "outputs": [{"agent": "solver", "text": solver}, {"agent": "verifier", "text": verifier}],
        }

    right = [f"1+1=2;#{t['answer']}" for t in tasks]
    wrong = "1+1=2;#99"
    (tmp_path / "traces").mkdir()
    (tmp_path / "eval.json").write_text(json.dumps({"reports": [{"label": "base"}, {"label": "run"}]}))
    base = [
        ep(tasks[0], wrong, right[0]),
        ep(tasks[0], wrong, wrong),
        ep(tasks[1], right[1], right[1]),
        ep(tasks[1], wrong, wrong),
    ]
    run = [
        ep(tasks[0], right[0], right[0]),
        ep(tasks[0], right[0], wrong),
        ep(tasks[1], right[1], right[1]),
        ep(tasks[1], wrong, "x"),
    ]
    for i, eps in enumerate((base, run)):
        (tmp_path / "traces" / f"{i}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    rows = fv.breakdown(tmp_path)
    # base: solver right 1/4, verifier right 2/4, copies 3/4 (the two wrong-wrong and the right-right),
    # verifier right after a right solution 1/1, after a wrong one 1/3
    assert rows[2] == "| base | 0.250 | 0.500 | 0.750 | 1.000 / 0.333 |"
    # run: solver right 3/4; per problem: task 0 0 -> 1, task 1 0.5 -> 0.5, so the paired difference is +0.5
    assert rows[3].startswith("| run | 0.750 (+0.500 [") and rows[3].endswith("| 0.500 | 0.500 | 0.667 / 0.000 |")
