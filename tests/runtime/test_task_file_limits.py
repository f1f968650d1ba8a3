"""Task files through the one JSONL reader (issue 23, item 5): the attacks that crashed ``run``
and ``train`` -- an integer of more than 4,300 digits, nesting 100,000 deep, a line that is not
UTF-8, each also as the first line of the task file ``train`` finds by itself -- are errors
naming ``file:line``, with the project's exit code and no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.errors import RuntimeFailure
from srpo_graph.lang import load_workflow
from srpo_graph.runtime.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]
GOOD = b'{"id": "a", "target": 3}\n'
BAD = {
    "integer of 5000 digits": (b'{"id": "b", "target": ' + b"7" * 5000 + b"}\n",
                               ":2: error: not valid JSON here: an integer with 5000 digits (at most 100)"),
    "integer of 150 digits": (b'{"id": "b", "target": ' + b"7" * 150 + b"}\n", ":2: error: not valid JSON here: "
                              "an integer with 150 digits"),
    "nesting 100,000 deep": (b'{"id": "b", "target": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
                             ":2: error: not valid JSON here: nested deeper than 64 levels"),
    "nesting 70 deep": (b'{"id": "b", "target": 1, "x": ' + b"[" * 70 + b"]" * 70 + b"}\n",
                        ":2: error: field x" + "[0]" * 64 + ": nested deeper than 64 levels"),
    "not UTF-8": (b'{"id": "b\xff", "target": 1}\n', ":2:10: error: not UTF-8 text (byte 0xff)"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_load_tasks_names_the_line(tmp_path, name):
    line, expected = BAD[name]
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD + line)
    with pytest.raises(RuntimeFailure) as info:
        load_tasks(path, load_workflow(ROOT / "workflows" / "coord_seq.wf"))
    assert str(info.value).startswith(f"{path}{expected}"), str(info.value)[:300]


@pytest.mark.parametrize("name", ["integer of 5000 digits", "nesting 100,000 deep", "not UTF-8"])
def test_run_command_refuses_the_file_without_a_traceback(tmp_path, name):
    line, expected = BAD[name]
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD + line)
    res = CliRunner().invoke(app, ["run", str(ROOT / "workflows" / "coord_seq.wf"), "--tasks", str(path),
                                   "--out", str(tmp_path / "o.jsonl"), "--quiet"])
    assert isinstance(res.exception, SystemExit) and res.exit_code == 5, res.output[-500:]
    assert f"{path}{expected}" in res.output, res.output[-500:]


@pytest.mark.parametrize("name", ["integer of 5000 digits", "nesting 100,000 deep", "not UTF-8"])
def test_train_refuses_a_damaged_first_line_of_its_default_task_file(tmp_path, name):
    line, expected = BAD[name]
    shutil.copy(ROOT / "workflows" / "coord_seq.wf", tmp_path / "coord_seq.wf")
    (tmp_path / "tasks").mkdir()
    default = tmp_path / "tasks" / "coord_seq.jsonl"
    default.write_bytes(line.replace(b'"b', b'"a', 1) + GOOD.replace(b'"a"', b'"z"'))
    res = CliRunner().invoke(app, ["train", str(tmp_path / "coord_seq.wf"), "--run-dir", str(tmp_path / "run"),
                                   "--steps", "1"])
    assert isinstance(res.exception, SystemExit) and res.exit_code == 7, (res.exception, res.output[-800:])
    first = expected.replace(":2:", ":1:").replace(":2", ":1", 1)
    assert f"{default}{first.split(': error: ')[0]}: error: the workflow's default task file: " in res.output, (
        res.output
    )
    assert "Traceback" not in res.output


@pytest.mark.parametrize("name", ["integer of 5000 digits", "not UTF-8"])
def test_train_refuses_a_bad_line_of_its_task_file(tmp_path, name):
    line, expected = BAD[name]
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD + line)
    res = CliRunner().invoke(
        app,
        [
            "train",
            str(ROOT / "workflows" / "coord_seq.wf"),
            "--tasks",
            str(path),
            "--run-dir",
            str(tmp_path / "run"),
            "--steps",
            "1",
        ],
    )
    assert isinstance(res.exception, SystemExit) and res.exit_code == 5, (res.exception, res.output[-800:])
    assert f"{path}{expected}" in res.output
