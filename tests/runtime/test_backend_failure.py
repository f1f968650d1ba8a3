"""A backend that stops answering mid-run: a clear BackendError, and the finished episodes kept.

The server is the SGLang TEST DOUBLE of tests/support/sglang_double.py (a real local HTTP
server speaking SGLang's documented wire format; SGLang itself needs a GPU and cannot run
here), told to die after a number of generations. The client, executor, CLI and trace file are
the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app
from srpo_graph.errors import BackendError
from srpo_graph.runtime.trace import read_traces
from tests.support.sglang_double import FakeSGLang

ROOT = Path(__file__).resolve().parents[2]


def _run_search(tmp_path, url: str, out: Path):
    args = ["run", str(ROOT / "workflows" / "search.wf"), "--tasks", str(ROOT / "workflows" / "tasks" / "search.jsonl"),
            "--limit", "6", "--samples", "2", "--backend", "sglang", "--url", url, "--model", "tiny",
            "--retries", "0", "--max-concurrent", "2", "--out", str(out), "--quiet"]
    return CliRunner().invoke(app, args)


def test_a_dead_server_stops_the_run_and_keeps_finished_episodes(tmp_path, monkeypatch, tiny_copy):
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    tiny_copy(tmp_path / "home" / "tiny")  # `--model tiny` finds it there (copied, not built again)
    out = tmp_path / "traces.jsonl"
    with FakeSGLang() as server:
        full = _run_search(tmp_path, server.url, tmp_path / "full.jsonl")  # the same run, never failing
        assert full.exit_code == 0, full.output
        per_episode = len(server.requests) / 12
        server.requests.clear()
        server.generated, server.stop_after = 0, 5
        res = _run_search(tmp_path, server.url, out)
    assert res.exit_code == BackendError.exit_code, res.output
    assert "failed after 1 attempts" in res.output and "connection error" in res.output
    kept = read_traces(out)  # a valid trace file: every line validates
    assert "episodes finished before are in" in res.output and f"the {len(kept)} episodes" in res.output
    # episodes run two at a time, one generation each: with 5 generations answered, 4 or 5 episodes
    # finished (the 5th's answer and the 6th's connection error race: whichever the run sees first)
    assert per_episode == 1.0 and len(kept) in (4, 5)
    complete = {(e.task_id, e.sample): e for e in read_traces(tmp_path / "full.jsonl")}
    for ep in kept:  # exactly the episodes of the undisturbed run
        assert ep.status == "ok" and ep == complete[(ep.task_id, ep.sample)]


def test_a_completed_run_is_rewritten_in_task_order(tmp_path, monkeypatch, tiny_copy):
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    tiny_copy(tmp_path / "home" / "tiny")  # `--model tiny` finds it there (copied, not built again)
    with FakeSGLang() as server:
        res = _run_search(tmp_path, server.url, tmp_path / "t.jsonl")
    assert res.exit_code == 0, res.output
    keys = [(e.task_id, e.sample) for e in read_traces(tmp_path / "t.jsonl")]
    assert keys == sorted(keys) and len(keys) == 12
    assert not (tmp_path / "t.jsonl.tmp").exists()


@pytest.mark.parametrize("error", [RuntimeError("device lost"), BackendError("sglang: gone")])
def test_any_backend_exception_becomes_a_backend_error(tmp_path, error, tiny_copy):
    """A backend raising anything mid-run: the run raises BackendError naming the policy."""
    from srpo_graph.models.tiny import load_tokenizer
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task
    from tests.support import workflows as wfs

    class Failing:  # a test double standing for an engine that breaks: it has no model at all
        tokenizer = load_tokenizer(tiny_copy(tmp_path / "tiny"))
        weight_version = 0

        def generate(self, requests):
            raise error

    finished = []
    with pytest.raises(BackendError, match="device lost|sglang: gone") as info:
        run(wfs.coord_seq(), [Task(id="t1", fields={"target": 3})], {"tiny": Failing()}, samples=2,
            on_episode=finished.append)
    assert finished == []
    if isinstance(error, RuntimeError):
        assert "policy 'tiny'" in str(info.value) and info.value.__cause__ is error
