"""Task files and trace JSONL: validation errors name the line and the field; round trips."""

from __future__ import annotations

import json

import pytest

from srpo_graph.errors import RuntimeFailure, TraceError
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.runtime.trace import read_traces, write_traces
from tests.support import workflows as wfs


def test_load_tasks_ok_and_ids(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"id": "x", "target": 3}\n\n{"target": 4, "extra": "kept"}\n')
    tasks = load_tasks(p, wfs.coord_seq())
    assert [(t.id, t.fields) for t in tasks] == [("x", {"target": 3}), ("t-3", {"target": 4, "extra": "kept"})]


@pytest.mark.parametrize("content, message", [
    ('{"target": 1}\n{"target": "7"}\n', r"t.jsonl:2: error: field target: expected int, got str '7'"),
    ('{"target": 1}\n{"targt": 7}\n', r"t.jsonl:2: error: field target: missing"),
    ('{"target": 1}\n{"target": 1,}\n', r"t.jsonl:2:14: error: not valid JSON"),
    ('[1, 2]\n', r"t.jsonl:1: error: a task must be a JSON object"),
    ('{"id": "a", "target": 1}\n{"id": "a", "target": 2}\n', r"t.jsonl:2: error: field id: 'a' already used on line 1"),
    ('{"target": true}\n', r"field target: expected int, got bool"),
    ('', r"no tasks"),
])
def test_load_tasks_errors_name_line_and_field(tmp_path, content, message):
    p = tmp_path / "t.jsonl"
    p.write_text(content)
    with pytest.raises(RuntimeFailure, match=message):
        load_tasks(p, wfs.coord_seq())


def test_trace_round_trip_and_broken_lines(tmp_path, tiny_backend, coord_tasks):
    res = run(wfs.coord_mixed(), coord_tasks[:2], {"tiny": tiny_backend}, samples=2, seed=4)
    path = tmp_path / "tr.jsonl"
    assert write_traces(path, res.episodes) == 4
    assert read_traces(path) == res.episodes
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["outputs"][0]["logprobs"] = bad["outputs"][0]["logprobs"] + [-1.0]
    lines[1] = json.dumps(bad)
    lines[2] = lines[2][:-5]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"tr.jsonl:2: error: field outputs.0: .*2 logprobs for 1 completion tokens"):
        read_traces(path)
    errors: list = []
    kept = read_traces(path, skip_bad=True, errors=errors)
    assert len(kept) == 2 and len(errors) == 2 and "tr.jsonl:3:" in str(errors[1])


@pytest.mark.proc
def test_committed_data_files_are_current():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "scripts" / "make_data.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_shipped_task_files_fit_their_workflows():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    lang = pytest.importorskip("srpo_graph.lang")
    pairs = {
        "coord_seq": "coord",
        "coord_mixed": "coord",
        "coord_par3": "coord",
        "coord_routed": "routed",
        "math_pipeline": "math",
        "search": "search",
    }
    for wf_name, tasks in pairs.items():
        wf = lang.load_workflow(root / "workflows" / f"{wf_name}.wf")
        for split in ("", "_eval"):
            assert load_tasks(root / "workflows" / "tasks" / f"{tasks}{split}.jsonl", wf)
