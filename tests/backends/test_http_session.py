"""A remote caller's connections (``bounded_http.Session``, Note [A connection per thread]).

A real threaded HTTP/1.1 server on 127.0.0.1 that records, per request, the client's port (one port:
one connection) and how many requests are in flight. Each calling thread keeps one keep-alive
connection; at most ``concurrency`` requests are in flight, and a wait for a slot is part of the
request's deadline; the connection of a thread that ended is closed, not kept.
"""

from __future__ import annotations

import http.server
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from srpo_graph.backends import bounded_http
from srpo_graph.errors import BackendError
from tests.support.http_servers import LocalServer


class Recorder:
    """A real server answering ``{}`` after ``delay`` seconds; it records client ports and the most
    requests it held at once."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.ports, self.inflight, self.peak = delay, [], 0, 0
        self.closed: set[int] = set()  # client ports whose connection ended
        lock, rec = threading.Lock(), self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle(self):
                try:
                    super().handle()
                finally:
                    rec.closed.add(self.client_address[1])

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    rec.ports.append(self.client_address[1])
                    rec.inflight += 1
                    rec.peak = max(rec.peak, rec.inflight)
                time.sleep(rec.delay)
                with lock:
                    rec.inflight -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = LocalServer(H, "/x")
        self.url = self.server.url

    def stop(self):
        self.server.close()


@pytest.fixture
def recorder():
    made: list[Recorder] = []

    def make(delay: float = 0.0) -> Recorder:
        made.append(Recorder(delay))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def _post(session, url: str, timeout: float = 10.0) -> int:
    return bounded_http.call(session, "POST", url, json={}, timeout=timeout, max_bytes=1 << 10).status


def test_each_thread_keeps_one_connection(recorder):
    rec = recorder()
    with bounded_http.client(concurrency=4) as session, ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: _post(session, rec.url), range(200)))
    assert statuses == [200] * 200
    assert len(rec.ports) == 200 and len(set(rec.ports)) <= 4  # reused, never one connection per request


def test_a_thread_uses_its_own_connection_even_when_another_is_idle(recorder):
    """Two threads taking turns, one request at a time: each stays on its own connection (a shared
    pool would hand the second thread the first one's idle connection)."""
    rec = recorder()
    turns = [threading.Event() for _ in range(8)]
    seen: dict[str, list[int]] = {"a": [], "b": []}

    def player(name: str, mine: range) -> None:
        for i in mine:
            assert turns[i].wait(30)
            _post(session, rec.url)
            seen[name].append(rec.ports[-1])
            if i + 1 < len(turns):
                turns[i + 1].set()

    with bounded_http.client(concurrency=4) as session:
        threads = [threading.Thread(target=player, args=("a", range(0, 8, 2))),
                   threading.Thread(target=player, args=("b", range(1, 8, 2)))]
        for t in threads:
            t.start()
        turns[0].set()
        for t in threads:
            t.join(60)
    assert len(seen["a"]) == len(seen["b"]) == 4
    assert len(set(seen["a"])) == len(set(seen["b"])) == 1 and seen["a"][0] != seen["b"][0], seen


def test_at_most_concurrency_requests_are_in_flight(recorder):
    rec = recorder(delay=0.05)
    with bounded_http.client(concurrency=2) as session, ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda _: _post(session, rec.url), range(24))) == [200] * 24
    assert rec.peak == 2


def test_a_wait_for_a_slot_counts_in_the_deadline(recorder):
    rec = recorder(delay=8.0)
    with bounded_http.client(concurrency=1) as session:
        held = threading.Thread(target=_post, args=(session, rec.url, 60.0))
        held.start()
        deadline = time.monotonic() + 30
        while not rec.ports:  # the one slot is taken by a request the server holds for 8 s
            assert time.monotonic() < deadline, "the held request never reached the server"
            time.sleep(0.01)
        with pytest.raises(bounded_http.AnswerTimeout, match="no answer within 0.5 s"):
            _post(session, rec.url, timeout=0.5)
        # it gave up while the slot was still taken (it did not wait for the slot past its deadline),
        # and it never reached the server
        assert held.is_alive() and rec.inflight == 1 and len(rec.ports) == 1
        held.join()


def test_the_connection_of_a_thread_that_ended_is_closed(recorder):
    rec = recorder()
    session = bounded_http.client(concurrency=8)
    for _ in range(3):  # three short-lived threads, one request each
        t = threading.Thread(target=_post, args=(session, rec.url))
        t.start()
        t.join()
    first = list(rec.ports)
    assert _post(session, rec.url) == 200  # a new thread's connection: the ended threads' are closed now
    deadline = time.monotonic() + 10
    while not set(first) <= rec.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(first) <= rec.closed, (first, rec.closed)
    session.close()
    with pytest.raises(BackendError, match="this session is closed"):
        _post(session, rec.url)
