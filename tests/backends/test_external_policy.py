"""External policies end to end (issue 28): a trained solver on the tiny model, a verifier behind an
OpenAI-compatible endpoint.

* a stalled endpoint (a real local HTTP server that never answers) fails the episodes cleanly,
  the URL and the agent's .wf position named, within the declared deadline -- no hang (training
  runs the executor the same way, ``on_backend_error="fail"``, and counts them);
* the real CPU SGLang server's ``/v1/chat/completions`` (launched as the external example says):
  outputs recorded as text only (``source = "text"``, no ids), compiled as frozen members, a
  training run with only the solver updated, and the example workflow trained by one command.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from srpo_graph.compiler.compile import compile as compile_batch
from srpo_graph.compiler.options import CompileConfig
from srpo_graph.lang import check, parse
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.trace import Episode
from tests.backends.test_openai_backend import _Server  # its real local HTTP server
from tests.support.cli import invoke

WF = """workflow ext
import std
task {{ target: int }}
policy solver = "tiny"
policy judge = openai("{url}", model="default", timeout={timeout}, retries={retries}, concurrency=4)
agent s {{ policy: solver prompt: "<a>{{task.target}}" sample {{ max_tokens: 1, allow: ["1", "2", "3", "4", "5"] }}
  output: int via std.digit }}
agent v {{ policy: judge prompt: "<b>{{s}}" sample {{ max_tokens: 3, temperature: 1.0 }} output: text }}
transition propose {{ consume: s activate: v }}
transition verify {{ consume: v activate: end }}
start: s
reward: std.digits_sum_to(task.target, s, s)
"""
ROOT = Path(__file__).resolve().parents[2]
TASK_ROWS = [{"id": f"t{i}", "target": i % 3 + 5} for i in range(4)]
TASKS = [Task(id=r["id"], fields=r) for r in TASK_ROWS]


def _wf(url: str, timeout: float = 60, retries: int = 1):
    return check(parse(WF.format(url=url, timeout=timeout, retries=retries), "ext.wf"))


def _backends(wf, tiny_backend):
    from srpo_graph.backends.openai import OpenAIBackend

    return {"solver": tiny_backend, "judge": OpenAIBackend(wf.policy_by_name["judge"].external)}


@pytest.mark.parametrize("scheduler", ["auto", "streaming"])  # auto: lockstep (the solver is in-process)
def test_a_stalled_endpoint_fails_episodes_cleanly_with_its_url(tiny_backend, scheduler):
    server = _Server("stall")
    try:
        wf = _wf(server.url, timeout=0.5, retries=0)
        backends = _backends(wf, tiny_backend)
        t0 = time.perf_counter()
        res = run(wf, TASKS, backends, samples=2, seed=0, on_backend_error="fail", scheduler=scheduler)
        took = time.perf_counter() - t0
        backends["judge"].close()
    finally:
        server.stop()
    assert took < 30, took
    assert res.stats.backend_failures == len(res.episodes) == 8
    for ep in res.episodes:
        assert ep.status == "failed" and server.url in ep.error and "no answer within 0.5 s" in ep.error
        assert "ext.wf:8:" in ep.error  # the agent's .wf position
    assert server.url in res.stats.backend_error
    assert res.stats.failed_by_kind == {"backend": 8}


def test_external_text_outputs_are_the_same_under_both_schedulers(tiny_backend):
    """A real local echo endpoint: the streaming scheduler sends each request's ``prompt_text`` and
    records the answer as text only (no ids, version 0), exactly as lockstep does."""
    server = _Server("echo")
    try:
        wf = _wf(server.url)
        backends = _backends(wf, tiny_backend)
        try:
            lock = run(wf, TASKS, backends, samples=2, seed=1, scheduler="lockstep")
            streamed = run(wf, TASKS, backends, samples=2, seed=1, scheduler="streaming")
        finally:
            backends["judge"].close()
    finally:
        server.stop()
    def key(ep):  # the solver's log-probs: batched vs single forward differ in the last bits
        d = ep.model_dump()
        return d, [lp for o in d["outputs"] for lp in o.pop("logprobs")]

    for (ds, ls), (dl, ll) in zip(map(key, streamed.episodes), map(key, lock.episodes), strict=True):
        assert ds == dl
        assert ls == pytest.approx(ll, abs=1e-5)
    assert streamed.stats.generate_calls == 2 * len(streamed.episodes) > lock.stats.generate_calls
    for ep in streamed.episodes:
        s, v = ep.outputs
        assert ep.status == "ok" and v.source == "text" and v.completion_ids == [] and v.prompt_ids == []
        assert v.text == f"echo:<b>{s.text}" and v.policy_version == 0


def test_run_cli_fails_episodes_of_a_stalled_endpoint_and_goes_on(tmp_path):
    """`srpo-graph run` on the same workflow: every episode is written to the traces, failed with the
    URL, and -- since every one failed -- the run exits 5 saying so (a run that produced nothing
    usable never "succeeds"; docs/training.md, User code: deadlines and failures)."""
    server = _Server("stall")
    try:
        wf = tmp_path / "ext.wf"
        wf.write_text(WF.format(url=server.url, timeout=0.5, retries=0))
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text("".join(json.dumps(t) + "\n" for t in TASK_ROWS))
        res = invoke("run", wf, "--tasks", tasks, "--samples", "1", "--out", tmp_path / "t.jsonl", "--quiet")
    finally:
        server.stop()
    assert res.exit_code == 5, res.stderr[-2000:]
    assert "every one of the 4 episodes failed" in res.stderr and server.url in res.stderr
    assert "4 failed (backend)" in res.stderr and "Traceback" not in res.stderr
    eps = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(eps) == 4 and all(e["status"] == "failed" and server.url in e["error"] for e in eps)


@pytest.fixture(scope="module")
def chat_server(sglang_url):
    """The real CPU SGLang server on the plain tiny model, launched as the external example's
    comment says: the session's ``sglang_url`` server (conftest.py), which is launched with those
    flags (tests/support/sglang_servers.py::CHAT_FLAGS). Not a server SRPO_GRAPH_SGLANG_URL names:
    its flags are unknown."""
    from tests.support.sglang_servers import require_sglang

    require_sglang()
    return sglang_url


@pytest.mark.slow
def test_real_sglang_endpoint_runs_compiles_and_trains(chat_server, tiny_backend, tmp_path):
    url = chat_server + "/v1"
    wf = _wf(url)
    backends = _backends(wf, tiny_backend)
    res = run(wf, TASKS, backends, samples=2, seed=0, on_backend_error="fail")
    backends["judge"].close()
    assert all(ep.status == "ok" for ep in res.episodes), [ep.error for ep in res.episodes]
    judged = [o for ep in res.episodes for o in ep.outputs if o.agent == "v"]
    assert len(judged) == 8
    assert all(o.source == "text" and not o.prompt_ids and not o.completion_ids and not o.logprobs for o in judged)
    assert any(o.text for o in judged)
    # the trace round-trips through the validating reader, and compiles: the verifier is frozen
    again = [Episode.model_validate_json(ep.to_json()) for ep in res.episodes]
    b = compile_batch(again, CompileConfig(frozen_policies=("judge",), micro_batch_tokens=0))
    assert b.policies == ["solver"] and b.stats.frozen_only_events == 8 and b.num_sets == 8

    # training: one command's worth (train()), the solver alone updates
    from srpo_graph.train.config.loading import validate
    from srpo_graph.train.trainer import train

    wf_file = tmp_path / "ext.wf"
    wf_file.write_text(WF.format(url=url, timeout=60, retries=1))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASK_ROWS))
    cfg = validate(
        {
            "run_dir": str(tmp_path / "run"),
            "steps": 2,
            "seed": 1,
            "rollout": {"tasks_per_step": 2, "samples": 4, "tasks": str(tasks)},
            "checkpoint": {"every": 2},
            "eval": {"every": 0},
            "logging": {"tensorboard": False, "plots": False, "progress": False},
        }
    )
    summary = train(wf_file, cfg)
    assert summary.steps == 2
    step2 = tmp_path / "run" / "checkpoints" / "step_2"
    assert sorted(p.name for p in (step2 / "policies").iterdir()) == ["solver"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["episodes_failed"] == 0 and r["compile/frozen_only_events"] == r["episodes"] for r in rows)


@pytest.mark.slow
def test_the_external_example_trains_with_one_command(chat_server, tmp_path):
    """workflows/tinymath_external_verifier.wf against the server launched as its comment says (the
    tiny model standing in for tiny-reason, whose build takes minutes), its URL pointed at it."""
    import subprocess
    import sys

    src = (ROOT / "workflows" / "tinymath_external_verifier.wf").read_text()
    wf = tmp_path / "tinymath_external_verifier.wf"
    wf.write_text(src.replace("http://127.0.0.1:30000/v1", chat_server + "/v1"))
    (tmp_path / "tasks").mkdir()
    for name in ("tinymath.jsonl", "tinymath_eval.jsonl"):
        (tmp_path / "tasks" / name).write_text((ROOT / "workflows" / "tasks" / name).read_text())
    cmd = [
        sys.executable,
        "-m",
        "srpo_graph.cli",
        "train",
        str(wf),
        "--steps",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
        "rollout.tasks_per_step=2",
        "rollout.samples=2",
        "logging.plots=false",
        "logging.tensorboard=false",
        "eval.every=0",
        'rollout.models={m="tiny"}',
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["episodes_failed"] == 0 for r in rows)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "step_2" / "policies").iterdir()) == ["m"]


def test_run_with_the_openai_backend_records_text_and_refuses_token_options(tmp_path):
    """`srpo-graph run --backend openai` on a workflow of plain policies (a real local echo server):
    the answers are recorded as text only; an agent with `allow:` is refused, located, before any request."""
    server = _Server("echo")
    try:
        wf = tmp_path / "plain.wf"
        wf.write_text(
            'workflow plain\nimport std\ntask { target: int }\npolicy p = "m1"\n'
            'agent a { policy: p prompt: "say {task.target}" sample { max_tokens: 4 } output: text }\n'
            "transition t { consume: a activate: end }\nstart: a\n"
        )
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text("".join(json.dumps(t) + "\n" for t in TASK_ROWS))
        base = ["run", wf, "--tasks", tasks, "--samples", "1", "--quiet", "--backend", "openai",
                "--openai-url", server.url]
        res = invoke(*base, "--out", tmp_path / "t.jsonl")
        assert res.exit_code == 0, res.stderr[-2000:]
        eps = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
        outs = [e["outputs"][0] for e in eps]
        assert [o["text"] for o in outs] == [f"echo:say {t['target']}" for t in TASK_ROWS]
        assert all(o["source"] == "text" and o["prompt_ids"] == [] for o in outs)
        assert server.calls[0][0]["model"] == "m1"
        wf.write_text(wf.read_text().replace("max_tokens: 4", 'max_tokens: 1, allow: ["1"]'))
        res = invoke(*base, "--out", tmp_path / "t2.jsonl")
        assert res.exit_code != 0 and "plain.wf:5:" in res.stderr and "cannot honour" in res.stderr
        assert "Traceback" not in res.stderr
    finally:
        server.stop()
