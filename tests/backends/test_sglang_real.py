"""The SGLang backend against a REAL SGLang 0.5.23 server (CPU build, bf16), started by the
``sglang_url`` fixture (conftest.py) on the tiny model, or the one SRPO_GRAPH_SGLANG_URL names.

Opt-in outside CI (SRPO_GRAPH_SGLANG=1; they start real servers) and skipped where SGLang is not
installed, each skip saying why; .ci/run installs SGLang and sets SRPO_GRAPH_REQUIRE_SGLANG=1, so in
CI these tests run and a server that cannot start fails them.

Tolerance: the server computes in bf16 (the CPU kernels have no fp32 path), the reference is a
transformers fp32 forward of the same weights. Measured here: max |gap| 0.002-0.007 nats on
the tiny model; the tests allow ATOL = 0.03 per token.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from srpo_graph.backends.base import GenerationRequest
from srpo_graph.errors import BackendError
from tests.support.sglang_checks import ATOL, client, reference_logprobs
from tests.support.sglang_servers import require_sglang, start_real_server, start_real_servers, stop_servers  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from srpo_graph.models.tiny import load_tokenizer

    return load_tokenizer(str(tiny_dir))


@pytest.fixture(scope="module")
def model(tiny_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()


# a call per request, and a wave in one batched call (Note [A wave in one call])
WAYS = ["generate", "generate_together"]


@pytest.mark.parametrize("way", WAYS)
def test_generate_ids_and_logprobs_match_a_transformers_forward(sglang_url, tiny_dir, tok, model, way):
    b = client(sglang_url, tiny_dir)
    prompts = [tuple(tok(f"<a>{i}")["input_ids"]) for i in range(8)]
    reqs = [GenerationRequest(p, max_new_tokens=6, temperature=t) for p in prompts for t in (1.0, 0.6)]
    comps = getattr(b, way)(reqs)
    gaps = []
    for r, c in zip(reqs, comps):
        assert 1 <= len(c.completion_ids) <= 6 and len(c.logprobs) == len(c.completion_ids)
        ref = reference_logprobs(model, r.prompt_ids, c.completion_ids, r.temperature)
        gaps.append((torch.tensor(c.logprobs) - ref).abs().max().item())
    assert max(gaps) < ATOL, gaps
    # greedy: the server's argmax is the trainer's (the tiny model's margins dwarf bf16 error)
    g = b.generate([GenerationRequest(prompts[0], max_new_tokens=4, temperature=0.0)])[0]
    seq = list(prompts[0])
    with torch.no_grad():
        for t in g.completion_ids:
            assert int(model(torch.tensor([seq])).logits[0, -1].argmax()) == t
            seq.append(t)
    b.close()


@pytest.mark.parametrize("way", WAYS)
def test_allow_samples_only_allowed_tokens_with_renormalized_logprobs(sglang_url, tiny_dir, tok, model, way):
    """`allow:` through SGLang's DisallowedTokensLogitsProcessor: only allowed ids come back, and
    their log-probs are renormalized over the allowed set -- what the trainer recomputes."""
    b = client(sglang_url, tiny_dir)
    digits = tuple(tok.convert_tokens_to_ids(str(d)) for d in range(10))
    evens = digits[::2]
    reqs = []
    for i in range(12):  # two different allowed sets in flight together (separate processor groups)
        allowed = digits if i % 2 else evens
        reqs.append(
            GenerationRequest(
                tuple(tok(f"<b>{i}")["input_ids"]),
                max_new_tokens=3,
                temperature=(1.0, 0.7)[i % 3 == 0],
                allowed_token_ids=allowed,
            )
        )
    comps = getattr(b, way)(reqs)
    worst_renorm, best_full = 0.0, float("inf")
    for r, c in zip(reqs, comps):
        assert set(c.completion_ids) <= set(r.allowed_token_ids), (r.allowed_token_ids, c.completion_ids)
        renorm = reference_logprobs(model, r.prompt_ids, c.completion_ids, r.temperature, r.allowed_token_ids)
        full = reference_logprobs(model, r.prompt_ids, c.completion_ids, r.temperature)
        got = torch.tensor(c.logprobs)
        worst_renorm = max(worst_renorm, (got - renorm).abs().max().item())
        best_full = min(best_full, (got - full).abs().min().item())
    assert worst_renorm < ATOL
    assert best_full > 10 * ATOL  # and they are NOT the full-vocabulary log-probs
    b.close()


@pytest.mark.parametrize("way", WAYS)
def test_unconstrained_and_constrained_requests_share_a_batch(sglang_url, tiny_dir, tok, way):
    b = client(sglang_url, tiny_dir)
    digits = tuple(tok.convert_tokens_to_ids(str(d)) for d in range(10))
    reqs = [
        GenerationRequest(tuple(tok("<a>3")["input_ids"]), 4, allowed_token_ids=digits if i % 2 else None)
        for i in range(16)
    ]
    comps = getattr(b, way)(reqs)  # generate_together: one call, a processor for every other request
    assert all(set(c.completion_ids) <= set(digits) for c in comps[1::2])
    assert any(not set(c.completion_ids) <= set(digits) for c in comps[0::2])
    b.close()


def test_samples_follow_the_policy_distribution_at_each_temperature(sglang_url, tiny_dir, tok, model):
    """What the log-prob tests cannot see: that the server *samples* from the distribution it reports
    (and the trainer recomputes). 1,000 one-token draws per (prompt, temperature) against the fp32
    softmax over the allowed digits: total variation within sampling noise (expected ~0.04 at the
    flattest row; 0.09 is ~5 of its standard deviations), and at T=0.25 far from the T=1 distribution
    (a server that ignored the temperature would land there: TV 0.4-0.6 apart). The draws of a row go
    as one batched call (``generate_together``): the same prompt 1,000 times in one batch, sampled
    independently (correlated draws would widen the distance), where a call each was 4,000 calls."""
    b = client(sglang_url, tiny_dir)
    digits = tuple(tok.convert_tokens_to_ids(str(d)) for d in range(10))
    n = 1000
    for text in ("<a>7", "<b>3"):
        prompt = tuple(tok(text)["input_ids"])
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1, list(digits)].double()
        for temperature in (1.0, 0.25):
            comps = b.generate_together(
                [GenerationRequest(prompt, 1, temperature=temperature, allowed_token_ids=digits) for _ in range(n)]
            )
            counts = torch.zeros(len(digits), dtype=torch.float64)
            for c in comps:
                counts[digits.index(c.completion_ids[0])] += 1
            want = torch.softmax(logits / temperature, -1)
            tv = 0.5 * (counts / n - want).abs().sum().item()
            assert tv < 0.09, (text, temperature, tv, (counts / n).tolist(), want.tolist())
            if temperature != 1.0:
                assert 0.5 * (counts / n - torch.softmax(logits, -1)).abs().sum().item() > 0.2
    b.close()


def perturbed(model_dir, out_dir, scale: float = 3.0, seed: int = 0):
    """A copy of the model with every weight perturbed: other outputs, same architecture."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1.0))
    return m


def _greedy(b, prompts, n=5):
    return [c.completion_ids for c in b.generate([GenerationRequest(p, n, temperature=0.0) for p in prompts])]


def test_weight_sync_changes_outputs_and_tags_versions(sglang_url, tiny_dir, tok, model, tmp_path):
    """The disk route (``sync="disk"``; the process-group route is tests/backends/test_weight_sync.py)."""
    b = client(sglang_url, tiny_dir, weight_dir=tmp_path / "w", sync="disk")
    (tmp_path / "w" / "venv").mkdir(parents=True)  # not ours: must survive every sync
    prompts = [tuple(tok(f"<a>{i}")["input_ids"]) for i in range(6)]
    before = _greedy(b, prompts)
    other = perturbed(tiny_dir, tmp_path)
    b.sync_weights(other, 7)
    after = _greedy(b, prompts)
    assert after != before
    comps = b.generate([GenerationRequest(prompts[0], 4, temperature=1.0)])
    assert comps[0].weight_version == 7  # the server's meta_info.weight_version
    ref = reference_logprobs(other, prompts[0], comps[0].completion_ids, 1.0)
    assert (torch.tensor(comps[0].logprobs) - ref).abs().max() < ATOL  # it samples from the new weights
    b.sync_weights(model, 8)
    b.sync_weights(model, 9)
    assert _greedy(b, prompts) == before  # back to the original weights
    names = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert names == [".srpo-graph-lease.json", ".srpo-graph-weights.json", "v8", "v9", "venv"]  # the lease: held
    b.close()


def test_sync_while_requests_are_in_flight_loses_nothing(sglang_url, tiny_dir, tok, model, tmp_path):
    """An update sent while long generations run: none is aborted, each reports a version."""
    b = client(sglang_url, tiny_dir, weight_dir=tmp_path / "w")
    prompts = [tuple(tok(f"<b>{i}")["input_ids"]) for i in range(16)]
    reqs = [GenerationRequest(p, 60, temperature=1.0) for p in prompts]
    v0 = b.generate(reqs[:1])[0].weight_version  # what the (session) server holds now
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("c", b.generate(reqs)))
    t.start()
    time.sleep(0.3)
    b.sync_weights(model, 11)
    t.join(120)
    comps = out["c"]
    assert len(comps) == 16 and all(c.finish_reason != "abort" for c in comps)
    assert all(c.weight_version in (v0, 11) for c in comps) and v0 != 11
    b.close()


def test_qwen2_shaped_model_with_biased_layers_syncs(tmp_path, tiny_dir, tok):
    """A locally built Qwen2-architecture model (qkv bias, as Qwen2.5) served, synced, compared; stopped, it
    leaves none of its shared memory in /dev/shm (Note [A server's shared memory])."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    require_sglang()
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    m0 = Qwen2ForCausalLM(cfg).eval()
    assert m0.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():
        for layer in m0.model.layers:  # make the biases matter
            layer.self_attn.q_proj.bias.normal_(0, 1.0)
            layer.self_attn.k_proj.bias.normal_(0, 1.0)
            layer.self_attn.v_proj.bias.normal_(0, 1.0)
    m0.save_pretrained(tmp_path / "qwen2")
    tok.save_pretrained(tmp_path / "qwen2")
    server = start_real_server(tmp_path / "qwen2", tmp_path)
    try:
        from srpo_graph.backends import load_backend

        b = load_backend("sglang", str(tmp_path / "qwen2"), url=server.url, weight_dir=tmp_path / "w", backoff=0.05)
        prompts = [tuple(tok(f"<a>{i}")["input_ids"]) for i in range(4)]
        c = b.generate([GenerationRequest(p, 4, temperature=1.0) for p in prompts])
        for p, ci in zip(prompts, c):
            assert (torch.tensor(ci.logprobs) - reference_logprobs(m0, p, ci.completion_ids, 1.0)).abs().max() < ATOL
        m1 = Qwen2ForCausalLM(cfg).eval()
        with torch.no_grad():  # small moves of every weight (larger ones make bf16 rounding alone
            for (name, p0), p1 in zip(m0.named_parameters(), m1.parameters()):  # exceed ATOL), new biases
                p1.copy_(torch.randn_like(p0) if name.endswith("bias") else p0 + torch.randn_like(p0) * 0.05)
        b.sync_weights(m1, 1)
        assert server.alive()  # the CPU bias bug (amx_utils) crashed the server here on AMX machines
        c = b.generate([GenerationRequest(p, 4, temperature=1.0) for p in prompts])
        to_old = 0.0
        for p, ci in zip(prompts, c):
            assert ci.weight_version == 1
            assert (torch.tensor(ci.logprobs) - reference_logprobs(m1, p, ci.completion_ids, 1.0)).abs().max() < ATOL
            to_old = max(
                to_old, (torch.tensor(ci.logprobs) - reference_logprobs(m0, p, ci.completion_ids, 1.0)).abs().max()
            )
        assert to_old > 3 * ATOL  # the new weights (biases included) are what it samples from
        b.close()
        shared = server.shared_memory()  # (a 270 MB all-reduce buffer with the AMX kernel build)
    finally:
        server.stop()
    assert not server.alive()
    # what SGLang left in /dev/shm goes with the server (Note [A server's shared memory])
    assert not [path for path in shared if path.exists()], shared


def test_a_killed_server_fails_the_episodes_it_held_or_stops_a_raising_run(tmp_path, tiny_dir):
    """Kill the server by its PID mid-rollout: finished episodes stay ok, the ones it held are
    failed with a message naming the server, counted in the run's stats; the run does not crash.
    Then the default for `srpo-graph run` (``on_backend_error="raise"``) against that dead server:
    the first backend failure stops the run, naming the server (one real server for both facts;
    each used to start its own)."""

    from srpo_graph.backends import load_backend
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task

    require_sglang()
    root = Path(__file__).resolve().parents[2]
    wf = load_workflow(root / "workflows" / "coord_seq.wf")
    tasks = [Task(id=f"t{i}", fields={"target": i % 10}) for i in range(64)]
    server = start_real_server(tiny_dir, tmp_path)
    try:
        b = load_backend("sglang", str(tiny_dir), url=server.url, max_retries=0)
        raising = load_backend("sglang", str(tiny_dir), url=server.url, max_retries=1, backoff=0.05)  # for the end

        def killer():
            while b.stats["requests"] < 24:
                time.sleep(0.005)
            os.kill(server.pid, signal.SIGKILL)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        res = run(wf, tasks, {"tiny": b}, samples=2, max_concurrent=4, on_backend_error="fail")
        t.join(5)
    finally:
        server.stop()
    failed = [e for e in res.episodes if e.status == "failed"]
    ok = [e for e in res.episodes if e.status == "ok"]
    assert len(res.episodes) == 128 and len(ok) >= 8 and len(failed) >= 64
    assert res.stats.backend_failures == len(failed) == res.stats.failures
    assert all(server.url in e.error and "connection error" in e.error for e in failed), failed[0].error
    assert server.url in res.stats.backend_error

    assert not server.alive()
    par2 = load_workflow(root / "workflows" / "coord_par2.wf")
    with pytest.raises(BackendError, match="failed after 2 attempts; last: connection error") as info:
        run(par2, [Task(id="t", fields={"target": 3})], {"tiny": raising}, samples=2)
    assert server.url in str(info.value)


def _until_the_router_uses_both(backend, prompt, workers, seconds: float = 90.0) -> None:
    """The router answers /health before it has registered every worker (then it sends all requests
    to the first): send pairs of small requests until each worker's log shows one (bounded)."""
    import time

    def counts():
        return [w.log_path.read_text().count("POST /generate") for w in workers]

    base, deadline = counts(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        backend.generate([GenerationRequest(prompt, 1, temperature=1.0)] * 2)
        if all(n > s for n, s in zip(counts(), base)):
            return
        time.sleep(1.0)
    pytest.fail(f"the router sent no request to one of its workers within {seconds:.0f} s (counts {counts()})")


def test_router_spreads_one_policy_over_workers_and_sync_reaches_each(tmp_path, tiny_dir, tok, trainable_sglang):
    """sglang-router (round robin) in front of two real workers: both serve, and after one
    sync_weights over a process group per worker, every completion, from either worker, reports
    the new version and weights. The first worker is the session's server (it serves the tiny
    model's weights at version 0, and gets them back after the test: ``trainable_sglang``), the
    second one is started for the test: one launch instead of two. (A failure in the middle of the
    sync can leave the session server unusable for the tests after it on this worker; the reset's
    error then names this test.)"""
    from types import SimpleNamespace

    from srpo_graph.backends import load_backend
    from srpo_graph.backends.sglang_server import SGLangServer, sglang_python

    require_sglang()
    probe = __import__("subprocess").run([sglang_python(), "-c", "import sglang_router"], capture_output=True)
    if probe.returncode != 0:
        if os.environ.get("SRPO_GRAPH_REQUIRE_SGLANG"):
            pytest.fail("sglang-router is not installed in the SGLang venv (.ci/run installs it)")
        pytest.skip("sglang-router is not installed in the SGLang venv (pip install sglang-router)")
    session_url, session_log = trainable_sglang
    if session_log is not None:
        (w2,) = start_real_servers([tiny_dir], tmp_path)
        port = int(session_url.rsplit(":", 1)[1])
        w1 = SimpleNamespace(url=session_url, port=port, log_path=session_log, stop=lambda: None)  # not ours to stop
    else:  # an outside session server (SRPO_GRAPH_SGLANG_URL): its log is not readable here
        w1, w2 = start_real_servers([tiny_dir, tiny_dir], tmp_path)  # started together: one start-up's wait
    from srpo_graph.backends.ports import claim_ports

    (port,) = claim_ports(1)
    router = SGLangServer(
        [
            sglang_python(),
            "-m",
            "sglang_router.launch_router",
            "--worker-urls",
            w1.url,
            w2.url,
            "--policy",
            "round_robin",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        port,
        log_path=tmp_path / "router.log",
    )
    try:
        router.start().wait_healthy(120)
        b = load_backend(
            "sglang",
            str(tiny_dir),
            url=router.url,
            worker_urls=[w1.url, w2.url],
            weight_dir=tmp_path / "w",
            backoff=0.05,
            sync="distributed",
        )  # a group per worker
        prompts = [tuple(tok(f"<a>{i}")["input_ids"]) for i in range(16)]
        _until_the_router_uses_both(b, prompts[0], (w1, w2))
        other = perturbed(tiny_dir, tmp_path, scale=0.05)
        b.sync_weights(other, 5)
        served = [w.log_path.read_text().count("POST /generate") for w in (w1, w2)]
        comps = b.generate([GenerationRequest(p, 3, temperature=1.0) for p in prompts])
        now = [w.log_path.read_text().count("POST /generate") for w in (w1, w2)]
        assert all(n > s for n, s in zip(now, served)), (served, now)  # both workers answered
        assert {c.weight_version for c in comps} == {5}
        assert b._streamer.stats["syncs"] == 1 and len(b._streamer.groups) == 2 and not (tmp_path / "w").exists()
        for p, c in zip(prompts, comps):
            assert (torch.tensor(c.logprobs) - reference_logprobs(other, p, c.completion_ids, 1.0)).abs().max() < ATOL
        b.close()
    finally:
        stop_servers([router, w1, w2])
