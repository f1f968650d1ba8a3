"""Every remote call that reads an answer is bounded in time and size (issue 40.4, ``bounded_http.py``).

Real hostile servers on 127.0.0.1 (``http.server`` in a thread): one that drips the answer's body a
byte at a time, one that drips its status line and headers, one that sends 200 MB of JSON, one
that sends 200 MB of junk, one whose 200 MB hide behind a small gzip body. Each remote call of
the package -- an ``openai(...)`` chat request, SGLang's ``/generate`` (a request, and a wave in
one call) and control routes, its
health check, a launched server's start-up probe, the weight-sync control calls -- meets each of
them: it fails naming the URL, within its deadline (a generous bound: the point is not minutes),
having read a bounded number of bytes (the server could not write its 200 MB). A static check
finds any remote call that bypasses the helper.
"""

from __future__ import annotations

import ast
import gzip
import http.server
import json
import time
from pathlib import Path

import pytest

from srpo_graph.errors import BackendError
from tests.support.http_servers import LocalServer

PKG = Path(__file__).resolve().parents[2] / "srpo_graph"
HUGE = 200 << 20  # bytes a huge answer would be
DRIP_S = 0.5  # seconds between two bytes of a dripping answer
TIMEOUT = 2.0  # the deadline each call is given against a dripping server
# ... and against a huge answer: a call there must stop at its size limit, not at its deadline. Under
# CI load, with 30 cases reading at once, reading the ~1 MB up to a limit took over 2 s, and a deadline
# that passes first is a different failure (a timeout, retried). The start-up probe keeps TIMEOUT: it
# polls until its deadline, each probe reading a bounded answer, so a long one only makes it read more.
HUGE_TIMEOUT = 60.0


_BOMB: list[bytes] = []


def _bomb() -> bytes:
    """200 MB of zeros, gzipped (~200 KB on the wire), made once."""
    if not _BOMB:
        _BOMB.append(gzip.compress(b"0" * HUGE, compresslevel=9))
    return _BOMB[0]


class Hostile:
    """A real threaded HTTP server on 127.0.0.1 answering every GET and POST as ``mode`` says.

    ``written`` counts the bytes it managed to send before the client hung up.
    """

    def __init__(self, mode: str):
        self.mode, self.written, self.calls = mode, 0, 0
        if mode == "gzip_bomb":
            _bomb()  # made before any request: compressing 200 MB must not eat the client's deadline
        hostile = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, data: bytes) -> bool:
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:  # the client hung up
                    return False
                hostile.written += len(data)
                return True

            def _answer(self):
                hostile.calls += 1
                if "Content-Length" in self.headers:
                    self.rfile.read(int(self.headers["Content-Length"]))
                body = json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}).encode()
                if hostile.mode == "drip_head":
                    raw = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\n\r\n" + body)
                    for i in range(len(raw)):
                        if not self._send(raw[i:i + 1]):
                            return
                        time.sleep(DRIP_S)
                    return
                if hostile.mode == "gzip_bomb":
                    bomb = _bomb()
                    self.send_response(200)
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(bomb)))
                    self.end_headers()
                    self._send(bomb)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                size = len(body) if hostile.mode == "drip_body" else HUGE
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if hostile.mode == "drip_body":
                    for i in range(len(body)):
                        if not self._send(body[i:i + 1]):
                            return
                        time.sleep(DRIP_S)
                    return
                # huge_json: a chat answer whose content never ends; huge_junk: not JSON at all
                head = b'{"choices": [{"message": {"content": "' if hostile.mode == "huge_json" else b""
                chunk = (b"x" if hostile.mode == "huge_json" else b"\xff<junk>") * (1 << 17)
                sent = 0
                if not self._send(head):
                    return
                while sent < HUGE - len(head):
                    piece = chunk[: HUGE - len(head) - sent]
                    if not self._send(piece):
                        return
                    sent += len(piece)

            do_GET = do_POST = _answer

        self.httpd = LocalServer(H)
        self.url = self.httpd.url

    def stop(self):
        self.httpd.close()


# --------------------------------------------------------------------------- each remote call of the package


def _openai_chat(url: str, timeout: float) -> None:
    from srpo_graph.backends.openai import ChatError, ChatRequest, OpenAIChat
    from srpo_graph.workflow import ExternalModel

    chat = OpenAIChat(ExternalModel(url=url + "/v1", timeout=timeout, retries=1, concurrency=2), backoff=0.01)
    try:
        chat.chat([ChatRequest("hi", max_tokens=8)])
    except ChatError as exc:
        raise BackendError(exc.errors[0] or str(exc)) from None
    finally:
        chat.close()


def _sglang_sample(url: str, timeout: float, wave: bool = False) -> None:
    """``generate`` of one request, or (``wave``) ``generate_together`` of two: one batched call."""
    from srpo_graph.backends.base import GenerationRequest
    from srpo_graph.backends.sglang import BatchError, SGLangBackend

    b = SGLangBackend(url, tokenizer=None, timeout=timeout, max_retries=1, backoff=0.01, check_health=False)
    try:
        if wave:
            b.generate_together([GenerationRequest((1, 2), 8), GenerationRequest((3,), 4)])
        else:
            b.generate([GenerationRequest((1, 2), 8)])
    except BatchError as exc:
        raise BackendError(exc.errors[0] or str(exc)) from None
    finally:
        b.close()


def _sglang_control(url: str, timeout: float) -> None:
    from srpo_graph.backends.sglang import SGLangBackend

    b = SGLangBackend(url, tokenizer=None, timeout=timeout, max_retries=1, backoff=0.01, check_health=False)
    try:
        b._post(url, "/pause_generation", {"mode": "retract"})
    finally:
        b.close()


def _sglang_health(url: str, timeout: float) -> None:
    from srpo_graph.backends.sglang import SGLangBackend

    SGLangBackend(url, tokenizer=None, timeout=timeout).close()


def _server_start_up(url: str, timeout: float) -> None:
    from srpo_graph.backends.sglang_server import SGLangServer

    port = int(url.rsplit(":", 1)[1])
    SGLangServer(["true"], port).wait_healthy(timeout=timeout)  # no process: only the probes


def _weight_sync_call(url: str, timeout: float) -> None:
    from srpo_graph.backends.weight_sync import http_call

    http_call(url, "/init_weights_update_group", {"x": 1}, timeout)


CALLS = {"openai chat": (_openai_chat, "max_tokens 8"), "sglang /generate": (_sglang_sample, "max_new_tokens 8"),
         "sglang /generate, a wave": (lambda url, timeout: _sglang_sample(url, timeout, wave=True),
                                      "2 requests of max_new_tokens 8"),
         "sglang control": (_sglang_control, "/pause_generation"), "sglang /health": (_sglang_health, "health"),
         "server start-up": (_server_start_up, "healthy"), "weight sync": (_weight_sync_call, "update_weights")}
# the start-up probe waits 5 s per probe and then the start-up deadline: its bound is its own
SLACK_S = {"server start-up": 10.0}


DRIPS = ["drip_body", "drip_head"]
HUGES = ["huge_json", "huge_junk", "gzip_bomb"]


def deadline(site: str, mode: str) -> float:
    """The deadline one case's call is given: HUGE_TIMEOUT where it must stop at a size limit."""
    return HUGE_TIMEOUT if mode in HUGES and site != "server start-up" else TIMEOUT


class Outcome:
    """What one remote call did against one hostile server: the error it raised (or None), the
    seconds it took, and what the server saw (bytes written, calls answered)."""

    def __init__(self, site: str, mode: str):
        server = Hostile(mode)
        self.error: Exception | None = None
        try:
            t0 = time.monotonic()
            try:
                CALLS[site][0](server.url, deadline(site, mode))
            except Exception as exc:  # anything but a BackendError fails this case's test alone, named
                self.error = exc
            self.took = time.monotonic() - t0
        finally:
            server.stop()
        self.url, self.written, self.calls = server.url, server.written, server.calls


@pytest.fixture(scope="module")
def outcomes():
    """Every (site, mode) case -- 7 sites x 5 modes -- each on a hostile server of its own, all at once:
    a case mostly waits out its deadline (a dripping server: 2-5 s asleep), and one after another
    they left both workers idle for ~25 s of a CI run. Each case is still its own test below (the
    fixture runs all 35 even for one selected with -k: ~7 s)."""
    from concurrent.futures import ThreadPoolExecutor

    _bomb()  # once, before the clocks start
    # the calls' modules too (weight_sync imports torch): an import is not the deadline's to wait for
    import srpo_graph.backends.openai  # noqa: F401
    import srpo_graph.backends.sglang  # noqa: F401
    import srpo_graph.backends.sglang_server  # noqa: F401
    import srpo_graph.backends.weight_sync  # noqa: F401
    import srpo_graph.workflow  # noqa: F401
    cases = [(site, mode) for site in sorted(CALLS) for mode in DRIPS + HUGES]
    with ThreadPoolExecutor(len(cases)) as pool:
        done = dict(zip(cases, pool.map(lambda case: Outcome(*case), cases)))
    return done


@pytest.mark.parametrize("mode", DRIPS)
@pytest.mark.parametrize("site", sorted(CALLS))
def test_a_dripping_server_is_cut_off_at_the_deadline(outcomes, site, mode):
    out = outcomes[site, mode]
    assert isinstance(out.error, BackendError), f"{site}: {out.error!r} after {out.took:.1f} s (not a BackendError)"
    assert out.url in str(out.error), str(out.error)
    if site != "server start-up":
        assert "within 2" in str(out.error), str(out.error)
    # a deadline bound as a correctness property (each try takes at most TIMEOUT), not a speed
    assert out.took < 2 * TIMEOUT + 10 + SLACK_S.get(site, 0.0), out.took


@pytest.mark.parametrize("mode", HUGES)
@pytest.mark.parametrize("site", sorted(CALLS))
def test_a_huge_answer_is_cut_off_at_its_size_limit(outcomes, site, mode):
    out = outcomes[site, mode]
    assert isinstance(out.error, BackendError), f"{site}: {out.error!r} on a {mode} answer (not a BackendError)"
    if site == "server start-up":  # the probe never says why a server is unhealthy, only that it is
        assert "not healthy" in str(out.error)
    else:
        assert out.url in str(out.error) and "bytes" in str(out.error), str(out.error)
    assert out.written < 48 << 20, out.written  # far from 200 MB: the rest was never read
    if site in ("openai chat", "sglang /generate", "sglang /generate, a wave"):
        assert CALLS[site][1] in str(out.error) and out.calls == 1  # a too-large answer is not asked twice


def test_the_limit_scales_with_max_tokens():
    from srpo_graph.backends.bounded_http import FLOOR_BYTES, answer_limit

    assert answer_limit(0) == FLOOR_BYTES < answer_limit(8) < answer_limit(32768) < 16 << 20


# --------------------------------------------------------------------------- no remote call bypasses the helper

# httpx names a module may use outside bounded_http.py: exception classes only
HELPER = "backends/bounded_http.py"
FORBIDDEN_MODULES = ("urllib.request", "http.client", "requests", "aiohttp", "urllib3")


def _bypasses(path: Path, rel: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "httpx":
            if not node.attr.endswith(("Error", "Exception")) and node.attr != "__version__":
                found.append(f"{rel}:{node.lineno}: httpx.{node.attr}")
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{rel}:{node.lineno}: import {n}" for n in names if n.startswith(FORBIDDEN_MODULES)]
    return found


def test_every_remote_call_goes_through_the_bounded_helper():
    found = [hit for p in sorted(PKG.rglob("*.py")) if (rel := str(p.relative_to(PKG))) != HELPER
             for hit in _bypasses(p, rel)]
    assert not found, "remote calls without a whole deadline and a size bound:\n" + "\n".join(found)


@pytest.mark.parametrize("planted", ["httpx.get(url)", "httpx.Client()", "import urllib.request",
                                     "from http.client import HTTPConnection"])
def test_the_bypass_check_finds_a_planted_call(tmp_path, planted):
    path = tmp_path / "planted.py"
    path.write_text(f"def f(url):\n    {planted}\n")
    assert len(_bypasses(path, "planted.py")) == 1
