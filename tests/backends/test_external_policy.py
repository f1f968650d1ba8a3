"""External policies end to end (issue 28): a trained solver on the tiny model, a verifier behind an
OpenAI-compatible endpoint.

* a stalled endpoint (a real local HTTP server that never answers) fails the episodes cleanly,
  the URL named, within the declared deadline -- no hang, and training counts them against
  ``rollout.max_failed_fraction``;
* the real CPU SGLang server's ``/v1/chat/completions`` (on a copy of the tiny model given a chat
  template: the tiny tokenizer has none): outputs recorded as text only (``source = "text"``, no
  ids), compiled as frozen members, and a training run with only the solver updated.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_openai_backend import _Server

from srpo_graph.compiler.compile import compile as compile_batch
from srpo_graph.compiler.options import CompileConfig
from srpo_graph.lang import check, parse
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.trace import Episode

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
TASK_ROWS = [{"id": f"t{i}", "target": i % 3 + 5} for i in range(4)]
TASKS = [Task(id=r["id"], fields=r) for r in TASK_ROWS]


def _wf(url: str, timeout: float = 60, retries: int = 1):
    return check(parse(WF.format(url=url, timeout=timeout, retries=retries), "ext.wf"))


def _backends(wf, tiny_backend):
    from srpo_graph.backends.openai import OpenAIBackend

    return {"solver": tiny_backend, "judge": OpenAIBackend(wf.policy_by_name["judge"].external)}


def test_a_stalled_endpoint_fails_episodes_cleanly_with_its_url(tiny_backend):
    server = _Server("stall")
    try:
        wf = _wf(server.url, timeout=0.5, retries=0)
        backends = _backends(wf, tiny_backend)
        t0 = time.perf_counter()
        res = run(wf, TASKS, backends, samples=2, seed=0, on_backend_error="fail")
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


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A copy of the tiny model whose tokenizer has a chat template (SGLang's chat route needs one)."""
    import shutil

    from transformers import PreTrainedTokenizerFast

    from srpo_graph.backends.tiny import ensure_tiny_model

    src = Path(ensure_tiny_model())
    dst = tmp_path_factory.mktemp("tiny-chat") / "tiny"
    shutil.copytree(src, dst)
    tok = PreTrainedTokenizerFast.from_pretrained(dst)
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<s>{% endif %}")
    tok.save_pretrained(dst)
    # the tiny model's generation_config says top_k = 0 (transformers' "off"); SGLang's OpenAI route
    # takes it as the request default and refuses 0 ("-1 (disable) or at least 1"): drop it here
    gen = dst / "generation_config.json"
    gen.write_text(json.dumps({k: v for k, v in json.loads(gen.read_text()).items() if k != "top_k"}))
    return dst


@pytest.fixture(scope="module")
def chat_server(chat_model_dir, tmp_path_factory):
    from sglang_servers import require_sglang, start_real_server

    require_sglang()
    server = start_real_server(chat_model_dir, tmp_path_factory.mktemp("sglang-chat-logs"))
    try:
        yield server.url
    finally:
        server.stop()


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
    from srpo_graph.train.config import validate
    from srpo_graph.train.trainer import train

    wf_file = tmp_path / "ext.wf"
    wf_file.write_text(WF.format(url=url, timeout=60, retries=1))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASK_ROWS))
    cfg = validate({"run_dir": str(tmp_path / "run"), "steps": 2, "seed": 1,
                    "rollout": {"tasks_per_step": 2, "samples": 4, "tasks": str(tasks)},
                    "checkpoint": {"every": 2}, "eval": {"every": 0},
                    "logging": {"tensorboard": False, "plots": False, "progress": False}})
    summary = train(wf_file, cfg)
    assert summary.steps == 2
    step2 = tmp_path / "run" / "checkpoints" / "step_2"
    assert sorted(p.name for p in (step2 / "policies").iterdir()) == ["solver"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["episodes_failed"] == 0 and r["compile/frozen_only_events"] == r["episodes"] for r in rows)
