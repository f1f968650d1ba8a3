"""The exact Qwen3 vocabulary on the real SGLang CPU server (issue 37.4): ``qwen3-realvocab-test``
(srpo_graph/models/released.py: Qwen3's released tokenizer, 151,669 tokens) is served as
``Qwen3ForCausalLM``; a multi-turn chat agent runs token in and token out against it -- each turn's
``input_ids`` extend the last turn's prompt and the ids the server sampled -- and the trainer's fp32
log-probs of every turn match the server's, per agent (bf16 server, ATOL as in test_sglang_chat.py).

Opt-in outside CI like every real-SGLang test (SRPO_GRAPH_SGLANG=1); one module-scoped server.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime.test_chat_agents import SYSTEM, TASKS, WF, Recorder  # noqa: E402
from tests.support.sglang_checks import ATOL
from tests.support.sglang_servers import require_sglang, start_real_servers, stop_servers  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def realvocab_server(tmp_path_factory, realvocab):
    require_sglang()
    path = realvocab("qwen3-realvocab-test")
    # a 151,669-row model on a loaded 2-core machine: its start-up has been seen past 300 s
    (server,) = start_real_servers([path], tmp_path_factory.mktemp("sglang-realvocab"), health_timeout=900)
    yield path, server
    stop_servers([server])


def test_the_exact_vocabulary_runs_token_in_token_out_on_sglang(realvocab_server):
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends import load_backend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import check, parse
    from srpo_graph.runtime.executor import run
    from srpo_graph.srpo.logprobs import packed_logprobs
    from srpo_graph.train.observe.mismatch import agent_mismatch

    path, server = realvocab_server
    backend = load_backend("sglang", str(path), url=server.url, backoff=0.05)
    assert backend.tokenizer.convert_tokens_to_ids("</think>") == 151668
    wf = check(parse(WF.format(model=path, system=SYSTEM, think="keep")))
    rec = Recorder(backend)
    episodes = run(wf, TASKS, {"m": rec}, samples=2, seed=5).episodes
    sent = {req.request_id: req for req, _ in rec.calls}
    later = 0
    for ep in episodes:
        assert ep.status != "failed", ep.error
        talker = [o for o in ep.outputs if o.agent == "talker"]
        assert talker[0].prompt_ids[0] == 151644  # <|im_start|>
        for before, o in zip(talker, talker[1:]):
            assert list(sent[f"{ep.group_id}/{ep.sample}/{o.id}"].prompt_ids) == o.prompt_ids
            history = before.prompt_ids + before.completion_ids
            assert o.prompt_ids[: len(history)] == history
            later += 1
    assert later >= len(episodes)
    batch = compile(episodes, CompileConfig(micro_batch_tokens=0))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    with torch.no_grad():
        batch.old_logprobs, _ = packed_logprobs([model], batch)
    gaps = agent_mismatch(batch)
    print(gaps)
    assert {"talker/max_abs", "critic/max_abs"} <= set(gaps)
    assert gaps["talker/max_abs"] < ATOL and gaps["critic/max_abs"] < ATOL, gaps
    backend.close()
