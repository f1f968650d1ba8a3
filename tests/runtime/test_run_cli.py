"""``srpo-graph run`` / ``show`` / ``init-model`` on the shipped example workflows (tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.runtime.trace import read_traces

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [
    ("coord_seq", "coord"), ("coord_par2", "coord"), ("coord_par3", "coord"), ("coord_par4", "coord"),
    ("coord_par5", "coord"), ("coord_mixed", "coord"), ("coord_routed", "routed"),
    ("math_pipeline", "math"), ("math_mixed", "math"), ("math_routed", "math"), ("search", "search"),
]




@pytest.mark.parametrize("wf, tasks", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_run_every_example_with_the_tiny_model(tmp_path, monkeypatch, wf, tasks, tiny_copy):
    if not (ROOT / "workflows" / f"{wf}.wf").exists():
        pytest.skip(f"workflows/{wf}.wf not written yet")
    home = tmp_path.parent / "shared-home"
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(home))  # one tiny model for all (copied, not built again)
    if not (home / "tiny").exists():
        tiny_copy(home / "tiny")
    out = tmp_path / "tr.jsonl"
    small = wf.startswith(("math", "search"))
    args = [
        "run",
        str(ROOT / "workflows" / f"{wf}.wf"),
        "--tasks",
        str(ROOT / "workflows" / "tasks" / f"{tasks}.jsonl"),
        "--samples",
        "2",
        "--limit",
        "2" if small else "4",
        "--out",
        str(out),
        "--model",
        "tiny",
        "--quiet",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    episodes = read_traces(out)
    assert len(episodes) == (4 if small else 8)
    assert all(e.status in ("ok", "truncated") for e in episodes), [e.error for e in episodes]
    assert "mean reward" in res.output and "tokens/s" in res.output
    show = CliRunner().invoke(app, ["show", str(out), "--episode", "1", "--html", str(tmp_path / "e.html")])
    assert show.exit_code == 0, show.output
    assert episodes[1].task_id in show.output and "<html" in (tmp_path / "e.html").read_text()


def test_bad_task_file_exits_with_a_located_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"target": 1}\n{"target": "x"}\n')
    res = CliRunner().invoke(
        app, ["run", str(ROOT / "workflows" / "coord_seq.wf"), "--tasks", str(bad), "--out", str(tmp_path / "o.jsonl")]
    )
    assert res.exit_code == 5 and "bad.jsonl:2: error: field target" in res.output


def test_model_override_names_a_real_policy(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(ROOT / "workflows" / "coord_seq.wf"),
            "--tasks",
            str(ROOT / "workflows" / "tasks" / "coord.jsonl"),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--model",
            "nosuch=tiny",
        ],
    )
    assert res.exit_code == 7 and "no policy 'nosuch'" in res.output


def test_init_model(tmp_path):
    res = CliRunner().invoke(app, ["init-model", str(tmp_path / "m")])
    assert res.exit_code == 0 and (tmp_path / "m" / "config.json").exists()
