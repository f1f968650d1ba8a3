"""The language server (``srpo-graph lsp``) in a child process, driven with raw bytes.

pytest-lsp's client (tests/lsp/conftest.py) only sends well-formed messages; a test of a faulty
client needs the wire itself: :class:`Wire` writes any bytes to the server's stdin and records
every message the server writes, in arrival order, and its stderr lines. Waits poll what arrived
and fail when the server exits, or after ``timeout`` seconds -- a bound on a hang, far above
any answer's time on a loaded machine.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "srpo_graph.cli", "lsp"]
# the checkout under test, ahead of any installed srpo_graph (an editable install may point elsewhere)
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def frame(message: dict | bytes) -> bytes:
    """One message as the base protocol frames it."""
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Wire:
    """A server process, the messages it sent (``got``, in order) and its stderr lines."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
        self.got: list[dict] = []
        self.stderr: list[str] = []
        self.ids = itertools.count(1)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                elif line == b"\r\n" and length is not None:
                    break
            self.got.append(json.loads(out.read(length)))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace").rstrip())

    # -- sending -------------------------------------------------------------------------
    def raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, method: str, params: Any = None, send: bool = True) -> tuple[int, bytes]:
        """A request's id and frame (sent unless ``send`` is false)."""
        n = next(self.ids)
        data = frame({"jsonrpc": "2.0", "id": n, "method": method, "params": params})
        if send:
            self.raw(data)
        return n, data

    def notify(self, method: str, params: Any = None) -> None:
        self.raw(frame({"jsonrpc": "2.0", "method": method, "params": params}))

    # -- waiting -------------------------------------------------------------------------
    def wait(self, pred: Callable[[dict], bool], what: str, timeout: float = 120.0) -> dict:
        """The first message ``pred`` accepts, waited for."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for m in self.got[seen:]:
                if pred(m):
                    return m
            seen = len(self.got)
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the reader threads drain what was written before the exit
                raise AssertionError(f"the server exited ({self.proc.returncode}) before {what}; "
                                     f"stderr:\n" + "\n".join(self.stderr[-30:]))
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} in {timeout:.0f} s; stderr:\n" + "\n".join(self.stderr[-30:]))
            time.sleep(0.01)

    def wait_stderr(self, text: str, since: int = 0, timeout: float = 60.0) -> str:
        """The first stderr line from index ``since`` on that holds ``text``, waited for."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((line for line in self.stderr[since:] if text in line), None)
            if hit is not None:
                return hit
            time.sleep(0.01)
        raise AssertionError(f"no stderr line with {text!r} in {timeout:.0f} s: {self.stderr[since:]}")

    def answer(self, n: int, timeout: float = 120.0) -> dict:
        return self.wait(lambda m: m.get("id") == n and "method" not in m, f"answer to request {n}", timeout)

    def published(self, uri: str, version: int | None = None) -> dict:
        return self.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri
                         and (version is None or m["params"].get("version") == version),
                         f"diagnostics of {uri} v{version}")

    def index(self, pred: Callable[[dict], bool]) -> int:
        """Where the first message ``pred`` accepts arrived (-1: none yet)."""
        return next((i for i, m in enumerate(self.got) if pred(m)), -1)

    # -- the session ---------------------------------------------------------------------
    def initialize(self, options: dict | None = None) -> None:
        n, _ = self.request("initialize", {"processId": None, "rootUri": None, "capabilities": {},
                                           "initializationOptions": options})
        self.answer(n)
        self.notify("initialized", {})

    def open(self, path: Path, text: str, version: int = 1) -> str:
        uri = path.resolve().as_uri()
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "wf", "version": version,
                                                              "text": text}})
        return uri

    def change(self, uri: str, text: str, version: int) -> None:
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": [{"text": text}]})

    def close_doc(self, uri: str) -> None:
        self.notify("textDocument/didClose", {"textDocument": {"uri": uri}})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                n, _ = self.request("shutdown")
                self.answer(n, timeout=30)
                self.notify("exit")
                self.proc.wait(timeout=30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
