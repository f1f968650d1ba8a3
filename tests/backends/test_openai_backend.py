"""The OpenAI-compatible chat client of external policies (issue 28, ``backends/openai.py``).

Against real servers: a local HTTP server that accepts and never answers (a stalled endpoint:
requests fail within their deadline, the URL named, the others unaffected), one that answers
500 then works (retries). The real CPU SGLang server's ``/v1/chat/completions`` is exercised end to
end in ``test_external_policy.py`` (its tiny model needs a chat template).
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from srpo_graph.backends.openai import ChatError, ChatRequest, OpenAIChat
from srpo_graph.errors import BackendError
from srpo_graph.workflow import ExternalModel
from tests.support.http_servers import LocalServer
from tests.support.signals import signal_to_a_worker_thread


class _Server:
    """A real threaded HTTP server on 127.0.0.1 whose handler is ``mode``."""

    def __init__(self, mode: str):
        calls = self.calls = []
        release = self.release = threading.Event()

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append((body, self.headers.get("Authorization")))
                if mode == "stall":
                    release.wait(30)  # never answers within the client's deadline
                    return
                if mode == "flaky" and len(calls) == 1:
                    self.send_response(500)
                    self.end_headers()
                    return
                out = json.dumps({"choices": [{"message": {"role": "assistant",
                                                            "content": "echo:" + body["messages"][0]["content"]},
                                               "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = LocalServer(H, "/v1")
        self.url = self.httpd.url

    def stop(self):
        self.release.set()
        self.httpd.close()


@pytest.fixture
def server(request):
    s = _Server(request.param)
    yield s
    s.stop()


@pytest.mark.parametrize("server", ["stall"], indirect=True)
def test_a_signal_the_kernel_hands_to_a_request_thread_stops_the_wait_at_once(server):
    """The caller (the main thread) waits on the pool's request threads; a signal that the kernel hands
    to one of them is handled within a slice of that wait (srpo_graph/exiting.py, Note [A signal reaches
    the main thread's waits]), not once the stalled request's 20 s deadline has passed."""
    chat = OpenAIChat(ExternalModel(url=server.url, timeout=20, retries=0, concurrency=2), backoff=0.05)
    try:
        with signal_to_a_worker_thread("openai") as sent:
            with pytest.raises(KeyboardInterrupt):
                chat.chat([ChatRequest("a"), ChatRequest("b")])
            stopped = time.monotonic()
        assert sent and stopped - sent[0] < 10, (sent, stopped)  # a slice, not the 20 s deadline
    finally:
        chat.close()


@pytest.mark.parametrize("server", ["stall"], indirect=True)
def test_a_stalled_endpoint_fails_within_its_deadline_naming_the_url(server):
    chat = OpenAIChat(ExternalModel(url=server.url, timeout=0.5, retries=1, concurrency=4), backoff=0.05)
    t0 = time.perf_counter()
    with pytest.raises(ChatError) as e:
        chat.chat([ChatRequest("a"), ChatRequest("b")])
    took = time.perf_counter() - t0
    assert took < 5, took  # 2 attempts x 0.5 s, both requests in parallel: no hang
    assert server.url in str(e.value) and "no answer within 0.5 s" in str(e.value)
    assert e.value.partial == [None, None] and all(server.url in x for x in e.value.errors)
    assert len(server.calls) == 4  # each request tried twice
    chat.close()


@pytest.mark.parametrize("server", ["flaky"], indirect=True)
def test_retries_then_answers_with_the_key_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("SRPO_TEST_KEY", "sk-test")
    chat = OpenAIChat(ExternalModel(url=server.url, model="m1", api_key_env="SRPO_TEST_KEY", retries=2,
                                    concurrency=1), backoff=0.01)
    assert chat.chat([ChatRequest("hi", max_tokens=5, stop=("\n",))]) == [("echo:hi", "stop")]
    body, auth = server.calls[-1]
    assert auth == "Bearer sk-test" and body["model"] == "m1" and body["max_tokens"] == 5 and body["stop"] == ["\n"]
    assert len(server.calls) == 2  # the 500 was retried
    chat.close()


def test_a_missing_key_variable_is_named(monkeypatch):
    monkeypatch.delenv("SRPO_NO_SUCH_KEY", raising=False)
    with pytest.raises(BackendError, match="SRPO_NO_SUCH_KEY is not set"):
        OpenAIChat(ExternalModel(url="http://127.0.0.1:9/v1", api_key_env="SRPO_NO_SUCH_KEY"))
