"""The SGLang client against a local test-double server (sglang_double.py: NOT SGLang) for what a
real server does not do on demand: 503s, dropped connections, a server that drips bytes, the
exact wire format. The real-server tests are in test_sglang_real.py."""

from __future__ import annotations

import pytest

from srpo_graph.backends.base import Backend, GenerationRequest
from srpo_graph.errors import BackendError
from tests.support.sglang_double import FakeSGLang, toy_logprob, toy_next  # noqa: E402


def backend(server, **kw):
    from srpo_graph.backends.sglang import SGLangBackend

    kw.setdefault("backoff", 0.01)
    return SGLangBackend(server.url, tokenizer=None, **kw)


def expected(prompt, n, stops=()):
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(toy_next(seq))
        seq.append(out[-1])
        if out[-1] in stops:
            break
    return out


def test_request_format_and_response(tmp_path):
    with FakeSGLang() as server:
        b = backend(server)
        assert isinstance(b, Backend)
        reqs = [GenerationRequest((1, 4, 14 + i), max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=0,
                                  stop_token_ids=(2,), seed=i) for i in range(12)]
        comps = b.generate(reqs)
        gens = [body for path, body in server.requests if path == "/generate"]
        assert len(gens) == 12  # one request per sample
        body = next(g for g in gens if g["input_ids"] == [1, 4, 14])
        assert body == {"input_ids": [1, 4, 14], "return_logprob": True, "sampling_params": {
            "max_new_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "stop_token_ids": [2],
            "skip_special_tokens": False, "no_stop_trim": True}}
        for r, c in zip(reqs, comps):  # order kept, ids and log-probs exactly as sent
            assert list(c.completion_ids) == expected(r.prompt_ids, 5, (2,))
            assert list(c.logprobs) == [toy_logprob(t) for t in c.completion_ids]
            assert c.finish_reason == ("stop" if c.completion_ids[-1] == 2 else "length")
        assert b.stats["retractions"] == 12
        b.close()


def test_old_retraction_counter_name_and_seed_option():
    with FakeSGLang(retraction_key="total_retractions") as server:
        b = backend(server, send_seed=True)
        b.generate([GenerationRequest((1, 2), 2, top_k=5, seed=9)])
        assert b.stats["retractions"] == 1
        params = server.requests[-1][1]["sampling_params"]
        assert params["sampling_seed"] == 9 and params["top_k"] == 5


def test_retries_after_503_and_dropped_connections():
    with FakeSGLang() as server:
        b = backend(server, max_retries=4)
        server.fail_next, server.drop_next = 2, 0
        c1 = b.generate([GenerationRequest((5, 6), 3)])[0]
        server.drop_next = 2
        c2 = b.generate([GenerationRequest((5, 6), 3)])[0]
        assert c1 == c2 and list(c1.completion_ids) == expected((5, 6), 3)
        assert b.stats["retries"] == 4
        server.fail_next = 10
        with pytest.raises(BackendError, match="failed after 3 attempts; last: HTTP 503"):
            backend(server, max_retries=2).generate([GenerationRequest((5, 6), 3)])


def test_timeout_is_a_backend_error():
    with FakeSGLang() as server:
        b = backend(server, timeout=0.2)
        server.delay = 1.0
        with pytest.raises(BackendError, match="did not answer within 0.2s"):
            b.generate([GenerationRequest((1,), 1)])
        server.delay = 0.0


def test_health_failure_is_clear():
    with FakeSGLang() as server:
        server.healthy = False
        with pytest.raises(BackendError, match="/health answered HTTP 503"):
            backend(server)
    with pytest.raises(BackendError, match="no server answers at .*docs/sglang.md"):
        backend(server)  # shut down: nothing listens on that port any more


def test_constrained_requests_carry_the_disallow_processor():
    import json

    from srpo_graph.backends.sglang import _DISALLOW_CALLABLE

    with FakeSGLang() as server:
        b = backend(server, vocab_size=8)
        body = b.payload(GenerationRequest((1,), 1, allowed_token_ids=(3, 4)))
        assert body["sampling_params"]["custom_params"] == {"token_ids": [0, 1, 2, 5, 6, 7]}
        assert json.loads(body["custom_logit_processor"])["callable"] == _DISALLOW_CALLABLE
        with pytest.raises(BackendError, match=r"inside the vocabulary \[0, 8\)"):
            b.generate([GenerationRequest((1,), 1), GenerationRequest((1,), 1, allowed_token_ids=(3, 9))])
        assert not [p for p, _ in server.requests if p == "/generate"]  # refused before sending anything
        with pytest.raises(BackendError, match="vocab_size"):
            backend(server).payload(GenerationRequest((1,), 1, allowed_token_ids=(3,)))


def test_disallow_callable_is_a_reference_to_sglangs_class():
    """The constant names SGLang's own class and nothing else (read with pickletools, never loaded)."""
    import pickletools

    from srpo_graph.backends.sglang import _DISALLOW_CALLABLE

    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(bytes.fromhex(_DISALLOW_CALLABLE))]
    assert [a for n, a in ops if n == "SHORT_BINUNICODE"] == [
        "sglang.srt.sampling.custom_logit_processor", "DisallowedTokensLogitsProcessor"]
    assert {n for n, _ in ops} <= {"PROTO", "FRAME", "SHORT_BINUNICODE", "MEMOIZE", "STACK_GLOBAL", "STOP"}


def test_a_failed_request_keeps_the_others():
    from srpo_graph.backends.sglang import BatchError

    with FakeSGLang() as server:
        b = backend(server, max_retries=0)
        server.drop_next = 1
        with pytest.raises(BatchError) as info:
            b.generate([GenerationRequest((5, 6), 2)])
        assert info.value.partial == [None] and "connection error" in info.value.errors[0]
        server.stop_after = server.generated + 3  # three answers, then a dead server
        with pytest.raises(BatchError, match=r"\(and 1 more of 5 requests failed\)") as info:
            backend(server, max_retries=0, concurrency=1).generate([GenerationRequest((5, i), 2) for i in range(5)])
        assert [c is not None for c in info.value.partial] == [True, True, True, False, False]


def test_a_wave_is_one_call_with_the_answers_of_one_call_each():
    """``generate_together`` sends the requests as one batched ``/generate`` (every field a list, one
    entry per request; a constrained request's processor beside unconstrained ones) and answers
    exactly what ``generate`` answers, request by request (Note [A wave in one call])."""
    with FakeSGLang() as server:
        b = backend(server, vocab_size=73)
        reqs = [GenerationRequest((1, 4, 14 + i), max_new_tokens=2 + i, temperature=0.7, stop_token_ids=(2,))
                for i in range(3)] + [GenerationRequest((9, 9), 3, allowed_token_ids=(3, 4))]
        apart = b.generate(reqs)
        del server.requests[:]
        together = b.generate_together(reqs)
        [(path, body)] = server.requests
        assert path == "/generate" and body["input_ids"] == [list(r.prompt_ids) for r in reqs]
        assert body == {k: [b.payload(r).get(k) for r in reqs] for k in body}  # each field, request by request
        assert body["custom_logit_processor"][:3] == [None] * 3 and body["custom_logit_processor"][3]
        assert together == apart and b.stats["requests"] == 2 * len(reqs)
        del server.requests[:]
        assert b.generate_together(reqs[:1]) == apart[:1] and len(server.requests) == 1  # one request: a call
        b.close()


def test_a_wave_goes_as_one_call_only_where_the_backends_own_generate_is_skipped_by_nothing():
    """The streaming scheduler's choice (runtime/requests.py ``generate_for_waves``): SGLangBackend's
    ``generate_together``; but a wrapper that delegates by ``__getattr__`` (this one records what it
    sees, as tests/runtime/test_chat_agents.py's Recorder does) or a subclass that overrides
    ``generate`` keeps its ``generate``: it would not see the requests otherwise."""
    from srpo_graph.backends.sglang import SGLangBackend
    from srpo_graph.runtime.requests import generate_for_waves

    class Wrapper:
        def __init__(self, inner):
            self.inner, self.seen = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def generate(self, requests):
            self.seen += requests
            return self.inner.generate(requests)

    class Counting(SGLangBackend):
        def generate(self, requests):
            return super().generate(requests)

    class Adapted(SGLangBackend):  # a subclass that changes the payload only (as sglang_lora.py's)
        pass

    with FakeSGLang() as server:
        b, c, a = backend(server), Counting(server.url, None), Adapted(server.url, None)
        assert generate_for_waves(b) == b.generate_together and generate_for_waves(a) == a.generate_together
        w = Wrapper(b)
        assert generate_for_waves(w) == w.generate and generate_for_waves(c) == c.generate
        for x in (b, c, a):
            x.close()


def test_a_wave_behind_a_router_is_a_call_per_request():
    """Several workers (a router in front): each request stays a call, for the router to spread."""
    with FakeSGLang() as server:
        b = backend(server, worker_urls=[server.url, server.url + "/other"])
        comps = b.generate_together([GenerationRequest((1, i), 2) for i in range(3)])
        gens = [body for path, body in server.requests if path == "/generate"]
        assert len(gens) == 3 and all(isinstance(g["input_ids"][0], int) for g in gens) and len(comps) == 3
        b.close()


def test_a_failed_wave_call_fails_every_request_in_it_with_its_error():
    from srpo_graph.backends.sglang import BatchError

    with FakeSGLang() as server:
        b = backend(server, max_retries=1)
        server.fail_next = 1  # a 503, then an answer: the call is asked again, whole
        assert len(b.generate_together([GenerationRequest((1, i), 2) for i in range(3)])) == 3
        assert [p for p, _ in server.requests].count("/generate") == 2
        server.drop_next = 2  # every try dropped
        with pytest.raises(BatchError, match=r"\(and 2 more of 3 requests failed\)") as info:
            b.generate_together([GenerationRequest((1, i), 2) for i in range(3)])
        assert info.value.partial == [None] * 3 and len(set(info.value.errors)) == 1
        assert "connection error" in info.value.errors[0] and b.stats["failed"] == 3
        b.close()


def test_deadline_cuts_off_a_server_that_drips_bytes():
    with FakeSGLang() as server:
        server.drip = 0.2  # one byte every 0.2 s: each read is quick, the answer takes ~minutes
        b = backend(server, timeout=1.0)
        t0 = __import__("time").monotonic()
        with pytest.raises(BackendError, match="did not answer within 1s"):
            b.generate([GenerationRequest((1,), 3)])
        assert __import__("time").monotonic() - t0 < 10  # generous: the point is not minutes
        server.drip = 0.0


def test_client_errors_are_not_retried():
    from srpo_graph.backends.sglang import SGLangBackend

    class Extra(SGLangBackend):
        def payload(self, req):
            p = super().payload(req)
            p["sampling_params"]["bogus"] = 1
            return p

    with FakeSGLang() as server:
        with pytest.raises(BackendError, match="HTTP 400"):
            Extra(server.url, None, backoff=0.01).generate([GenerationRequest((1,), 1)])
        assert len([p for p, _ in server.requests if p == "/generate"]) == 1


def test_weight_sync_from_disk(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    with FakeSGLang() as server:
        b = backend(server, weight_dir=tmp_path / "w")
        (tmp_path / "w" / "venv").mkdir(parents=True)  # someone else's folder: never touched
        (tmp_path / "w" / "v99").mkdir()
        server.flush_busy = 3  # requests still queued: the update's flush is refused, /flush_cache waits
        b.sync_weights(model, 3)
        paths = [p.split("?")[0] for p, _ in server.requests]
        # no /pause_generation (its default mode aborts requests); the prefix cache flushed once idle
        assert paths == ["/update_weights_from_disk", "/flush_cache", "/flush_cache", "/flush_cache"]
        assert server.flushes == 1 and all("?timeout=" in p for p, _ in server.requests[1:])
        body = server.requests[0][1]
        assert body == {"model_path": str(tmp_path / "w" / "v3"), "weight_version": "3", "flush_cache": True,
                        "torch_empty_cache": False, "abort_all_requests": False}
        assert (tmp_path / "w" / "v3" / "model.safetensors").exists()
        assert b.weight_version == 3
        assert b.generate([GenerationRequest((1, 2), 1)])[0].weight_version == 3  # the server's tag
        del server.requests[:]
        b.sync_weights(model, 4)
        b.sync_weights(model, 5)
        # an idle server: the update flushed the cache itself, no /flush_cache (Note [The update flushes the cache])
        assert [p for p, _ in server.requests] == ["/update_weights_from_disk"] * 2 and server.flushes == 3
        names = sorted(p.name for p in (tmp_path / "w").iterdir())
        assert names == [".srpo-graph-lease.json", ".srpo-graph-weights.json", "v4", "v5", "v99", "venv"]  # leased
        with pytest.raises(BackendError, match="v99: error: exists and was not written by srpo-graph"):
            b.sync_weights(model, 99)
        assert (tmp_path / "w" / "v99").is_dir()
    with FakeSGLang() as server:  # a server that stays busy past the timeout: a clear error
        b = backend(server, weight_dir=tmp_path / "w2", timeout=1.0)
        server.flush_busy = 10**6
        with pytest.raises(BackendError, match="flush_cache answered HTTP 400 after the weight update"):
            b.sync_weights(model, 1)


def test_load_backend_without_a_server_says_where_it_looked_and_how_to_fix_it():
    from srpo_graph.backends import load_backend
    from tests.support.ports import unanswered_port

    with unanswered_port() as port, pytest.raises(
        BackendError, match=rf"no server answers at http://127.0.0.1:{port}.*--url.*sglang.launch"
    ):
        load_backend("sglang", "tiny", url=f"http://127.0.0.1:{port}", max_retries=0)
    with pytest.raises(BackendError, match="unknown backend 'vllm' .known: transformers, sglang"):
        load_backend("vllm", "tiny")
