"""Backends stage: every remote call that reads an answer, bounded in time and in size.

Consumes a URL, a JSON body, a deadline in seconds and a byte limit; produces the answer's status
and bytes, or a :class:`~srpo_graph.errors.BackendError` naming the URL. It knows nothing about
SGLang or chat completions: ``openai.py``, ``sglang.py``, ``sglang_server.py`` and
``weight_sync.py`` call it.

Note [A deadline over the whole answer]: httpx's timeouts bound each read, so a server that sends
one byte a second keeps a request alive for as long as it likes (an ``openai(..., timeout=5)``
request took 90 s; issue 40). Here the deadline is one instant for the whole request -- waiting
for a free slot of the session (Note [A connection per thread]), connecting, TLS, sending, the
headers and every read of the body: the client's network backend gives each socket operation only
the time left before the instant the calling thread set (a thread-local: a request runs in the
thread that makes it), and an operation begun after it fails at once. No timer thread, no read
that outlives the deadline.

Note [An answer's size]: an answer can only be as long as what was asked for: ``max_tokens``
tokens of text, some JSON around them. A body past :func:`answer_limit` (a generous multiple of
that with a floor) is cut off as it arrives, chunk by chunk, and the request fails naming the URL
-- a 200 MB answer to ``max_tokens: 8`` once made a 1.68 GB trace and a 3 GB peak. The size is
counted after decompression, so a compressed bomb is cut off too. Control routes (health, weight
updates, server info) answer a few KB: :data:`CONTROL_LIMIT`.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from srpo_graph.errors import BackendError

FLOOR_BYTES = 1 << 20  # an answer may always be this long (JSON, metadata, an error page)
BYTES_PER_TOKEN = 256  # a token's text JSON-escaped (up to ~6 bytes a character) with its log-prob and id
CONTROL_LIMIT = 4 << 20  # the answer of a control route (/health, /server_info, weight updates)
CHUNK = 64 << 10  # bytes read at once


def answer_limit(max_tokens: int) -> int:
    """The most bytes an answer of ``max_tokens`` tokens may take (Note [An answer's size]).

    >>> answer_limit(8) == (1 << 20) + 8 * 256
    True
    """
    return FLOOR_BYTES + max(0, int(max_tokens)) * BYTES_PER_TOKEN


class AnswerTimeout(BackendError):
    """No whole answer before the deadline (connecting, sending and every read included).

    Attributes:
        url: the URL called.
        timeout: the deadline, in seconds from the start of the call.
    """

    def __init__(self, url: str, timeout: float):
        super().__init__(f"{url}: no answer within {timeout:g} s (the deadline covers connecting, sending and "
                         "every byte of the answer)")
        self.url, self.timeout = url, timeout


class AnswerTooLarge(BackendError):
    """The answer grew past its limit (Note [An answer's size]); it was cut off there.

    Attributes:
        url: the URL called.
        limit: the most bytes the answer could take.
    """

    def __init__(self, url: str, limit: int, why: str):
        super().__init__(f"{url}: the answer passed {limit:,} bytes, more than {why} can produce; cut off there "
                         "(is the endpoint the server you meant, and well?)")
        self.url, self.limit = url, limit


@dataclass(frozen=True)
class Answer:
    """An HTTP answer read whole: its status and its (decompressed) body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


_DEADLINE = threading.local()  # .at: the monotonic instant the calling thread's request must end by


def _left(timeout: float | None, exc_type: Any) -> float | None:
    """The socket operation's timeout: at most what is left before the calling thread's deadline."""
    at = getattr(_DEADLINE, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise exc_type("the deadline of the whole request passed")
    return left if timeout is None else min(timeout, left)


def _backend(inner: Any) -> Any:
    """``inner`` (an httpcore network backend) with every operation bounded by :func:`_left`."""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, stream: Any):
            self._stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self._stream.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> "Stream":
            return Stream(self._stream.start_tls(ssl_context, server_hostname,
                                                 _left(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Stream:
            return Stream(inner.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout), local_address,
                                            socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Stream:
            return Stream(inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

        def sleep(self, seconds: float) -> None:
            inner.sleep(seconds)

    return Backend()


_SSL: Any = None  # one verifying TLS context for every client of the process (loading the CA bundle: ~20 ms of CPU)
_SSL_LOCK = threading.Lock()
_CHECKED = False  # this httpx's pool was found boundable (Session.__init__)


def _ssl_context() -> Any:
    global _SSL
    import httpx

    with _SSL_LOCK:
        if _SSL is None:
            _SSL = httpx.create_ssl_context()
        return _SSL


def _bounded_client(headers: dict[str, str] | None) -> Any:
    """One ``httpx.Client`` of one connection whose every socket operation keeps to the deadline."""
    import httpx

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    made = httpx.Client(headers=headers, limits=limits, verify=_ssl_context())
    # every transport (the default one and those of proxies from the environment) reads through the
    # bounded backend; httpx builds its pools itself, so the backend is put into each pool
    transports = [made._transport, *(t for t in made._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            made.close()
            raise BackendError(f"httpx {httpx.__version__}: no connection pool to bound (srpo_graph/backends/"
                               "bounded_http.py expects httpcore's ConnectionPool); install httpx<1")
        pool._network_backend = _backend(pool._network_backend)
    return made


class Session:
    """The connections of one remote caller: each calling thread has its own keep-alive connection
    (a client of one), and at most ``concurrency`` requests are in flight at once.

    Note [A connection per thread]: one shared pool of N connections costs O(N) per request, twice
    (httpcore assigns queued requests by scanning every connection, and checks each idle one's
    socket with a poll): with the 64 threads of an SGLang backend, 4 ms of CPU a request, more than
    the tiny model's server spent on it. A thread's own connection costs O(1); the callers already
    bound their threads (a pool of ``concurrency`` workers), and the semaphore keeps the bound for
    any other caller, its wait counted in the request's deadline like the pool's wait was. The
    connection of a thread that ended is closed when the next thread makes one.
    """

    def __init__(self, concurrency: int, headers: dict[str, str] | None = None):
        self._headers = dict(headers) if headers else None
        self._slots = threading.BoundedSemaphore(max(1, int(concurrency)))
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: list[tuple[threading.Thread, Any]] = []
        self._closed = False
        global _CHECKED
        if not _CHECKED:  # an httpx whose pool cannot be bounded is refused here, at once (once a process)
            _bounded_client(self._headers).close()
            _CHECKED = True

    def _client(self) -> Any:
        made = getattr(self._local, "client", None)
        if made is not None:
            return made
        made = _bounded_client(self._headers)
        with self._lock:
            if self._closed:
                made.close()
                raise BackendError("bounded_http: this session is closed")
            gone = [c for t, c in self._clients if not t.is_alive()]
            self._clients = [(t, c) for t, c in self._clients if t.is_alive()]
            self._clients.append((threading.current_thread(), made))
        for c in gone:
            c.close()
        self._local.client = made
        return made

    @contextmanager
    def stream(self, method: str, url: str, **kwargs: Any) -> Iterator[Any]:
        """``httpx.Client.stream`` on this thread's connection, once a slot is free before the deadline."""
        import httpx

        if self._closed:
            raise BackendError("bounded_http: this session is closed")
        at = getattr(_DEADLINE, "at", None)
        wait = None if at is None else max(0.0, at - time.monotonic())
        if not self._slots.acquire(timeout=wait):
            raise httpx.PoolTimeout(f"no free slot of {url}'s session before the deadline")
        try:
            with self._client().stream(method, url, **kwargs) as resp:
                yield resp
        finally:
            self._slots.release()

    def close(self) -> None:
        """Close every connection (idempotent)."""
        with self._lock:
            self._closed, clients, self._clients = True, self._clients, []
        for _, c in clients:
            c.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def client(*, concurrency: int = 16, headers: dict[str, str] | None = None) -> Session:
    """A :class:`Session` whose calls through :func:`call` keep to their whole deadline.

    Raises:
        BackendError: this httpx keeps its connection pool elsewhere (the deadline could not be
            installed; a test of this module fails first).
    """
    return Session(concurrency, headers)


@contextmanager
def _deadline(at: float) -> Iterator[None]:
    before = getattr(_DEADLINE, "at", None)
    _DEADLINE.at = at
    try:
        yield
    finally:
        _DEADLINE.at = before


def call(session: Any, method: str, url: str, *, timeout: float, max_bytes: int, json: Any = None,
         why: str = "this request") -> Answer:
    """One request through ``session`` (from :func:`client`), done within ``timeout`` seconds and
    ``max_bytes`` bytes of answer, whatever the status.

    Args:
        json: the body (None: no body).
        why: what bounds the answer, for the message (``"max_tokens 8"``).
    Raises:
        AnswerTimeout: the whole request took longer than ``timeout``.
        AnswerTooLarge: the answer passed ``max_bytes``.
        httpx.TransportError: no connection, or it broke (the caller decides whether to retry).
    """
    import httpx

    at = time.monotonic() + timeout
    try:
        with _deadline(at):
            # the wait for a free slot of the session is bounded by the same instant (Session.stream)
            bound = httpx.Timeout(timeout)
            with session.stream(method, url, json=json, timeout=bound) as resp:
                chunks, size = [], 0
                for chunk in resp.iter_bytes(CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise AnswerTooLarge(url, max_bytes, why)
                    chunks.append(chunk)
                return Answer(resp.status_code, b"".join(chunks))
    except httpx.TimeoutException:
        raise AnswerTimeout(url, timeout) from None
    except httpx.TransportError:
        if time.monotonic() >= at:  # a read cut off by the deadline may surface as a broken connection
            raise AnswerTimeout(url, timeout) from None
        raise
