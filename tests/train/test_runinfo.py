"""``--resume`` with another ``.wf``: the run folder names the workflow it trained, first."""

import json

import pytest

from srpo_graph.errors import ConfigError
from srpo_graph.lang import load_workflow
from srpo_graph.train.run_folder import check_resumed_workflow, record_workflow, recorded_workflow

SEQ, PIPE = "workflows/coord_seq.wf", "workflows/math_pipeline.wf"


def test_another_workflow_is_named_with_its_file(tmp_path):
    record_workflow(tmp_path, load_workflow(SEQ), SEQ)
    assert recorded_workflow(tmp_path)["name"] == "coord_seq"
    check_resumed_workflow(tmp_path, load_workflow(SEQ), SEQ)  # the same one: fine
    with pytest.raises(ConfigError, match=r"this run trained workflow 'coord_seq' \(file .*coord_seq\.wf\), "
                                          r"not 'math_pipeline'") as err:
        check_resumed_workflow(tmp_path, load_workflow(PIPE), PIPE)
    assert "coord_seq.wf --resume" in str(err.value.render() if hasattr(err.value, "render") else err.value)


def test_an_older_run_is_identified_by_its_checkpoint(tmp_path):
    state = tmp_path / "checkpoints" / "step_10" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"step": 10, "extra": {"workflow": "coord_seq"}}))
    (tmp_path / "checkpoints" / "step_2").mkdir()
    (tmp_path / "checkpoints" / "step_2" / "state.json").write_text(json.dumps({"extra": {"workflow": "old"}}))
    with pytest.raises(ConfigError, match="this run trained workflow 'coord_seq', not 'math_pipeline'"):
        check_resumed_workflow(tmp_path, load_workflow(PIPE), PIPE)


def test_an_edited_file_of_the_same_name_resumes_with_a_note(tmp_path, capsys):
    wf = load_workflow(SEQ)
    record_workflow(tmp_path, wf.model_copy(update={"source_hash": "0" * 64}), SEQ)
    check_resumed_workflow(tmp_path, wf, SEQ)
    assert "changed since this run started" in capsys.readouterr().err
    assert recorded_workflow(tmp_path / "none") is None


def test_train_names_the_runs_workflow_before_overrides_or_tasks(tmp_path):
    """`train --resume` with another .wf: the run's workflow is named even when the saved config's
    model overrides and task file belong to the run's workflow, not the one given."""
    from srpo_graph.train.config.loading import validate
    from srpo_graph.train.trainer import train

    record_workflow(tmp_path, load_workflow(PIPE), PIPE)
    cfg = validate({"run_dir": str(tmp_path), "rollout": {"models": {"solver": "tiny"},
                                                          "tasks": str(tmp_path / "math_only.jsonl")}})
    with pytest.raises(ConfigError, match=r"this run trained workflow 'math_pipeline' \(file .*math_pipeline\.wf\), "
                                          r"not 'coord_seq'"):
        train(SEQ, cfg, resume=True)
