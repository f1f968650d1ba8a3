"""The server's stdio transport: LSP base-protocol framing that survives a faulty client.

Stage: lsp. Replaces pygls's reader loop (``pygls.io_.run_async``), which trusts every
``Content-Length``: a length too large makes it wait forever for bytes that belong to the next
messages, and junk merges with the next header line, so the server stays alive but never answers
again. Here every fault is survived by resynchronising (Note [Framing faults]); each message that
is read is handed to pygls's protocol exactly as pygls would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

log = logging.getLogger(__name__)

# Note [Framing faults]
# A message is ``Content-Length: N\r\n`` (other ``Name: value`` header lines may follow), an empty
# line, then N bytes of JSON. The reader keeps a buffer and a state: looking for a header, or
# reading a body. Faults, and what the reader does:
# * bytes that are not a header (binary junk, the tail of a body whose length was too small): they
#   are dropped up to the next ``Content-Length:`` (only its last 15 bytes are kept while none is
#   seen, so junk never grows the buffer);
# * a header that is malformed (no number, a number over MAX_BODY, a line that is no header, a
#   header block over MAX_HEADER): dropped, and the search resumes one byte further;
# * a body that is cut short by the next header -- a raw ``Content-Length: N\r\n`` cannot occur in
#   valid JSON (a JSON string holds no raw CR or LF, and outside strings the name is no JSON token),
#   so seeing one before N bytes arrived proves the length too large or the body truncated: the
#   partial body is dropped and the new header read, without waiting for the missing bytes (which
#   the client will never send);
# * a body that is not JSON (or not UTF-8): answered with a JSON-RPC parse error (id null), dropped;
#   a request whose params pygls cannot structure is answered with an error under its id.
# Each fault is one line on stderr: ``srpo-graph lsp: framing fault: ...; resynchronised``. So a
# client that sends one bad message loses that message only, and every later valid request gets
# its answer. End of input ends the server.
HEADER = re.compile(rb"Content-Length:", re.I)
_HEADER_LINE = re.compile(rb"Content-Length:[ \t]*(\d+)[ \t]*\r\n", re.I)
_OTHER_LINE = re.compile(rb"[A-Za-z0-9-]+:[^\r\n]*")
MAX_HEADER = 4096  # bytes of one header block
_OVERLAP = 64  # a header line cut by a chunk boundary is searched again from this far back
MAX_BODY = 256 * 1024 * 1024  # bytes of one message (a document of the size limit is far smaller)
PARSE_ERROR = -32700
DRAIN_S = 30.0  # seconds the requests in flight may take to answer at exit
INTERNAL_ERROR = -32603


def fault(what: str) -> None:
    """Say a framing fault on stderr (one line; the client's log shows it)."""
    print(f"srpo-graph lsp: framing fault: {what}; resynchronised", file=sys.stderr, flush=True)


@dataclass
class Framer:
    """Split a byte stream into message bodies (Note [Framing faults]). ``feed`` the bytes as they
    arrive; it returns the complete bodies, in order, and the faults met, as text.

    >>> f = Framer()
    >>> f.feed(b'junk\\x00Content-Length: 2\\r\\n\\r\\n{}Content-Length: 9\\r\\n\\r\\n{"a"')
    ([b'{}'], ['5 bytes before a header dropped'])
    >>> f.feed(b'Content-Length: 2\\r\\n\\r\\n[]')
    ([b'[]'], ['a body of 9 bytes was cut short by a new header after 4 bytes'])
    """

    buf: bytearray = field(default_factory=bytearray)
    body_at: int = -1  # where the body starts in ``buf``; -1: looking for a header
    length: int = 0
    scanned: int = 0  # how far the body was searched for a header already

    def feed(self, data: bytes) -> tuple[list[bytes], list[str]]:
        self.buf += data
        bodies: list[bytes] = []
        faults: list[str] = []
        while True:
            if self.body_at < 0:
                if not self._header(faults):
                    return bodies, faults
                continue
            end = self.body_at + self.length
            window_end = min(end, len(self.buf))
            cut = _HEADER_LINE.search(self.buf, max(self.body_at, self.scanned - _OVERLAP), window_end + _OVERLAP)
            if cut is not None and cut.start() < window_end and cut.end() <= len(self.buf):
                faults.append(f"a body of {self.length} bytes was cut short by a new header after "
                              f"{cut.start() - self.body_at} bytes")
                del self.buf[:cut.start()]
                self.body_at, self.scanned = -1, 0
                continue
            if len(self.buf) < end:
                self.scanned = len(self.buf)
                return bodies, faults
            bodies.append(bytes(self.buf[self.body_at:end]))
            del self.buf[:end]
            self.body_at, self.scanned = -1, 0

    def _header(self, faults: list[str]) -> bool:
        """Read one header block from ``buf``; False: more bytes are needed."""
        m = HEADER.search(self.buf)
        if m is None:
            keep = len(HEADER.pattern) - 1
            junk = bytes(self.buf[:-keep]) if len(self.buf) > keep else b""
            if junk.strip():
                faults.append(f"{len(junk)} bytes that are no message dropped")
            del self.buf[:max(0, len(self.buf) - keep)]
            return False
        if m.start() and bytes(self.buf[:m.start()]).strip():
            faults.append(f"{m.start()} bytes before a header dropped")
        del self.buf[:m.start()]
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 and len(self.buf) <= MAX_HEADER:
            return False  # the header is still arriving
        if end < 0 or end > MAX_HEADER:
            faults.append(f"a header block over {MAX_HEADER} bytes dropped")
            del self.buf[:1]
            return True
        block = bytes(self.buf[:end + 2])
        first = _HEADER_LINE.match(block)
        rest = block[first.end():] if first else b""
        others = [line for line in rest.split(b"\r\n") if line]
        if first is None or int(first.group(1)) > MAX_BODY or len(HEADER.findall(block)) > 1 \
                or not all(_OTHER_LINE.fullmatch(line) for line in others):
            faults.append(f"a malformed header dropped: {block[:80]!r}")
            del self.buf[:1]
            return True
        self.length = int(first.group(1))
        self.body_at, self.scanned = end + 4, end + 4
        return True


def decode_body(protocol: Any, body: bytes, on_fault: Callable[[str], None] = fault) -> Any | None:
    """One body as pygls's ``protocol`` structures a message; None for a body that is not JSON, or
    a request pygls cannot structure, answered with an error here (Note [Framing faults])."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        on_fault(f"a body of {len(body)} bytes that is not JSON ({exc}) answered with a parse error")
        protocol._send_data({"jsonrpc": "2.0", "id": None,
                             "error": {"code": PARSE_ERROR, "message": f"Parse error: {exc}"}})
        return None
    try:  # what json.loads(body, object_hook=protocol.structure_message) gives pygls, parsed once
        message = protocol.structure_message(raw) if isinstance(raw, dict) else raw
    except Exception as exc:  # noqa: BLE001 - pygls's own errors: answered under the request's id
        log.exception("unable to structure a message")
        if isinstance(raw, dict) and "id" in raw and "method" in raw:
            code = getattr(exc, "code", INTERNAL_ERROR)
            protocol._send_data({"jsonrpc": "2.0", "id": raw["id"],
                                 "error": {"code": code, "message": f"{type(exc).__name__}: {exc}"}})
        return None
    if not hasattr(message, "jsonrpc"):
        on_fault(f"a JSON body that is no JSON-RPC message dropped: {body[:80]!r}")
        return None
    return message


async def drain(protocol: Any, timeout: float) -> None:
    """Let the requests in flight answer (at most ``timeout`` seconds): a client that sends
    ``exit`` (or closes stdin) right behind its requests still gets their answers."""
    waiting = [f for f in list(protocol._request_futures.values()) if isinstance(f, asyncio.Future) and not f.done()]
    if waiting:
        await asyncio.wait(waiting, timeout=timeout)


async def read_messages(stdin: BinaryIO, protocol: Any, stop: threading.Event) -> None:
    """Feed ``stdin`` to a :class:`Framer` (read on a daemon thread, so a blocked read never holds
    the process at exit) and each body to ``protocol`` on this loop, until end of input."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue()
    read = getattr(stdin, "read1", stdin.read)

    def pump() -> None:
        while True:
            try:
                data = read(65536)
            except (OSError, ValueError):
                data = b""
            loop.call_soon_threadsafe(chunks.put_nowait, data)
            if not data:
                return

    threading.Thread(target=pump, name="lsp-stdin", daemon=True).start()
    framer = Framer()
    while not stop.is_set():
        data = await chunks.get()
        if not data:
            await drain(protocol, DRAIN_S)
            return
        bodies, faults = framer.feed(data)
        for what in faults:
            fault(what)
        for body in bodies:
            try:
                message = decode_body(protocol, body)
                if message is None:
                    continue
                if getattr(message, "method", None) in ("shutdown", "exit"):  # pygls cancels what is in flight
                    await drain(protocol, DRAIN_S)
                protocol.handle_message(message)
            except Exception:  # noqa: BLE001 - one message's failure must not end the server
                log.exception("unable to handle a message")


def serve_stdio(ls: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """Run the pygls server ``ls`` on stdio with this reader (as ``ls.start_io()`` does with pygls's);
    returns the process's exit status: the protocol's on ``exit`` (0 after ``shutdown``, else 1), 0
    when the input ends, 1 when the client is gone."""
    from pygls.io_ import StdoutWriter

    ls._stop_event = stop = threading.Event()
    ls.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    try:
        asyncio.run(read_messages(stdin or sys.stdin.buffer, ls.protocol, stop))
    except BrokenPipeError:
        log.error("the connection to the client is lost: shutting down")
        return 1
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # pygls's `exit` handler
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        ls.shutdown()
    return 0
