"""Chat agents on the real SGLang CPU server (issue 21): a qwen3-test chat agent runs token in and
token out against it -- each turn's ``input_ids`` extend the last turn's prompt and the ids the
server sampled (under ``think: strip`` without the think block) -- and the trainer's fp32
log-probs of every turn match the server's per agent (``train/observe/mismatch.agent_mismatch``;
bf16 server, ATOL as in test_sglang_local_models.py).

Opt-in outside CI like every real-SGLang test (SRPO_GRAPH_SGLANG=1); the qwen3-test server is the
session's, shared with test_sglang_local_models.py (conftest.py::local_sglang).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime.test_chat_agents import SYSTEM, TASKS, WF, Recorder  # noqa: E402
from tests.support.sglang_checks import ATOL

pytestmark = pytest.mark.sglang


SGLANG_MODELS = ("qwen3-test",)  # served by the session's shared server (conftest.py::local_sglang)


@pytest.fixture(scope="module")
def qwen3_server(local_sglang):
    return local_sglang("qwen3-test")


def test_a_chat_agent_runs_token_in_token_out_on_sglang(qwen3_server):
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends import load_backend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import check, parse
    from srpo_graph.runtime.chat import chat_plan
    from srpo_graph.runtime.executor import run
    from srpo_graph.srpo.logprobs import packed_logprobs
    from srpo_graph.train.observe.mismatch import agent_mismatch

    path, server = qwen3_server
    backend = load_backend("sglang", str(path), url=server.url, backoff=0.05)
    wf = check(parse(WF.format(model=path, system=SYSTEM, think="strip")))
    rec = Recorder(backend)
    episodes = run(wf, TASKS, {"m": rec}, samples=2, seed=5).episodes
    sent = {req.request_id: req for req, _ in rec.calls}
    cp = chat_plan(wf.agent_by_name["talker"], backend.tokenizer)
    later = 0
    for ep in episodes:
        assert ep.status != "failed", ep.error
        talker = [o for o in ep.outputs if o.agent == "talker"]
        for before, o in zip(talker, talker[1:]):
            assert list(sent[f"{ep.group_id}/{ep.sample}/{o.id}"].prompt_ids) == o.prompt_ids
            kept = list(cp.strip_think(before.completion_ids))
            assert o.prompt_ids[:len(before.prompt_ids) + len(kept)] == before.prompt_ids + kept
            later += 1
    assert later >= len(episodes)
    batch = compile(episodes, CompileConfig(micro_batch_tokens=0))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        batch.old_logprobs, _ = packed_logprobs([model], batch)
    gaps = agent_mismatch(batch)
    print(gaps)
    assert set(gaps) == {
        "mean_abs",
        "max_abs",
        "talker/mean_abs",
        "talker/max_abs",
        "critic/mean_abs",
        "critic/max_abs",
    }
    assert gaps["talker/max_abs"] < ATOL and gaps["critic/max_abs"] < ATOL, gaps
    backend.close()


def test_the_chat_workflow_trains_with_one_command_on_sglang(qwen3_server, tmp_path, monkeypatch):
    """workflows/chat_search_qwen3.wf trains on the real server (the module's, connected to: its
    weights are this run's and are put back after: the server is shared), one command, two steps, overlapped (k = 1):
    both steps update, the second on weights synced to the server, and the per-agent sampler/trainer
    gap is logged within the bf16 tolerance."""
    import json

    from click.testing import CliRunner

    from srpo_graph.backends import load_backend
    from srpo_graph.cli import app

    path, server = qwen3_server
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    run = tmp_path / "run"
    try:
        res = CliRunner().invoke(
            app,
            [
                "train",
                "workflows/chat_search_qwen3.wf",
                "--steps",
                "2",
                "--run-dir",
                str(run),
                f'rollout.models={{"*"={json.dumps(str(path))}}}',
                "rollout.backend=sglang",
                f"rollout.sglang.url={json.dumps(server.url)}",
                "rollout.sglang.update_connected=true",
                "rollout.sglang.sync=disk",
                f"rollout.sglang.weight_dir={json.dumps(str(tmp_path / 'w'))}",
                "rollout.max_staleness=1",
                "rollout.tasks_per_step=2",
                "rollout.samples=2",
                "eval.every=0",
                "logging.tensorboard=false",
                "logging.plots=false",
            ],
        )
        assert res.exit_code == 0, res.output
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2] and all(r["tokens"] > 0 for r in rows)
        # the gap of record is on the outputs sampled at the weights being updated (numerics only); step 2
        # also trains outputs sampled one version earlier, whose gap holds an update: kept apart
        assert rows[0]["mismatch/fresh_share"] == 1.0 and "mismatch/stale_mean_abs" not in rows[0]
        assert rows[0]["mismatch/searcher/max_abs"] < ATOL, rows[0]["mismatch/searcher/max_abs"]
        second = rows[1]  # one-step-off: its batch was dispatched during update 1, at version 0
        assert second["mismatch/fresh_share"] < 1.0 and second["mismatch/stale_mean_abs"] > 0
        assert second.get("mismatch/searcher/max_abs", 0.0) < ATOL  # what is fresh, if any, is numerics only
    finally:  # the other tests of this module sample the base weights
        b = load_backend("sglang", str(path), url=server.url, sync="disk", weight_dir=tmp_path / "w0")
        b.sync_weights(str(path), 0)
        b.close()
