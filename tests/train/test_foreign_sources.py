"""Every command that takes a run folder or checkpoint meets a foreign one with one located error
(issue 36 item 5): a run whose policies are not the workflow's, a run folder where the workflow
belongs, a run folder where a model belongs. Never a traceback, never the hub's "Repo id" error.

Real run folders from 1-step trainings of two workflows whose policies differ (coord_par2 trains
``tiny``; selfplay_frozen trains ``me`` beside a frozen ``past``), made once for the module.
Each case goes through ``srpo-graph`` itself (click's CliRunner on the real ``app``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
WF = {name: ROOT / "workflows" / f"{name}.wf" for name in ("coord_par2", "selfplay_frozen")}
HOLDS = {"coord_par2": ["tiny"], "selfplay_frozen": ["me"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, wf in WF.items():
        run = root / name
        res = CliRunner().invoke(app, ["train", str(wf), "--steps", "1", "--run-dir", str(run),
                                       "rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0",
                                       "logging.tensorboard=false", "logging.plots=false", "checkpoint.every=1"])
        assert res.exit_code == 0, res.output
        out[name] = run
    return out


def _fails(args: list[str], code: int) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args])
    text = res.output + (res.stderr if res.stderr_bytes is not None and res.stderr not in res.output else "")
    assert res.exit_code == code, (res.exit_code, text, res.exception)
    assert "Traceback" not in text and "Repo id" not in text and not isinstance(res.exception, OSError), text
    return text


def _source(runs, name: str, kind: str) -> Path:
    return runs[name] if kind == "run" else runs[name] / "checkpoints" / "step_1"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["run", "checkpoint"])
@pytest.mark.parametrize("workflow,other", [("coord_par2", "selfplay_frozen"), ("selfplay_frozen", "coord_par2")])
def test_eval_of_a_run_that_lacks_the_workflows_policies_is_one_located_error(runs, tmp_path, workflow, other, kind):
    text = _fails(["eval", WF[workflow], _source(runs, other, kind), "--samples", "1", "--num-tasks", "1",
                   "--out", tmp_path / "ev", "--no-progress"], 7)
    assert str(runs[other]) in text  # the run, named
    assert f"holds policies {HOLDS[other]}" in text and f"loads {HOLDS[workflow]}" in text  # what it holds, needs
    assert f"workflow {other!r}" in text and str(WF[other]) in text  # whose run it is, and its .wf as the fix


@pytest.mark.slow
def test_resume_with_another_workflow_is_refused_before_anything_loads(runs):
    text = _fails(["train", WF["coord_par2"], "--resume", runs["selfplay_frozen"], "--steps", "2"], 7)
    assert "this run trained workflow 'selfplay_frozen'" in text and str(WF["selfplay_frozen"]) in text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["run", "checkpoint"])
def test_eval_given_the_run_folder_first_reads_the_workflow_it_recorded(runs, tmp_path, kind):
    src = _source(runs, "selfplay_frozen", kind)
    res = CliRunner().invoke(app, ["eval", str(src), "--samples", "1", "--num-tasks", "1", "--out",
                                   str(tmp_path / "ev"), "--no-progress"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert "selfplay_frozen" in json.dumps(report) and str(src) in json.dumps(report)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["run", "checkpoint"])
def test_train_given_a_run_folder_first_names_its_workflow_and_both_ways_on(runs, kind):
    text = _fails(["train", _source(runs, "coord_par2", kind)], 7)
    assert "takes the workflow (.wf) first" in text
    assert f"--resume {runs['coord_par2']}" in text and str(WF["coord_par2"]) in text


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_folder_that_is_no_run_where_the_workflow_belongs(tmp_path, command):
    text = _fails([command, tmp_path], 7)
    assert "a folder, not a .wf file" in text and f"srpo-graph {command} WORKFLOW.wf" in text


@pytest.mark.slow
def test_run_with_a_run_folder_as_its_model_names_the_policies_inside(runs, tmp_path):
    text = _fails(["run", WF["coord_par2"], "--tasks", ROOT / "workflows" / "tasks" / "coord.jsonl", "--model",
                   runs["selfplay_frozen"], "--out", tmp_path / "t.jsonl", "--samples", "1", "--limit", "1"],
                  ConfigError.exit_code)
    assert "a training run folder, not a model directory" in text and "['me']" in text
    assert str(runs["selfplay_frozen"] / "checkpoints" / "step_1" / "policies" / "me") in text


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_run_folder_given_as_a_policys_model_names_the_policies_inside(runs, tmp_path, command):
    """``rollout.models.<policy>`` pointed at a run folder (every path that loads a model goes through
    ``models.resolve_model``), in training and in evaluation alike."""
    override = f'rollout.models.tiny="{runs["selfplay_frozen"]}"'
    args = (["train", WF["coord_par2"], "--steps", "1", "--run-dir", tmp_path / "r", override] if command == "train"
            else ["eval", WF["coord_par2"], "-o", override, "--samples", "1", "--num-tasks", "1", "--out",
                  tmp_path / "ev", "--no-progress"])
    text = _fails(args, ConfigError.exit_code)  # a refused configuration, not a backend that stopped
    assert "a training run folder, not a model directory" in text and "['me']" in text
    assert "check the server" not in text and "resume" not in text


@pytest.mark.slow
def test_consolidate_and_export_of_a_policy_the_run_does_not_hold(runs, tmp_path):
    text = _fails(["consolidate", runs["coord_par2"], "--out", tmp_path / "c", "--policy", "me"], 7)
    assert "no policy 'me'" in text and "['tiny']" in text
    text = _fails(["export-adapter", runs["coord_par2"], tmp_path / "x", "--policy", "tiny"], 7)
    assert "not a LoRA adapter" in text
