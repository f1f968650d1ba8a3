"""The language server under hostile input (issue 40, item 7): each is a class, each test its rule.

* Analysis never blocks the loop: a hover on one document is answered while another document's big
  analysis runs (its answer arrives before that analysis's diagnostics -- an order, not a timing).
* A newer version supersedes an older analysis: only the newest version's diagnostics are published.
* Work per document is bounded: a document over a limit gets one diagnostic, not an analysis.
* A framing fault is survived: after each (a wrong ``Content-Length``, junk, a truncated body, a body
  that is not JSON, a malformed header) the next valid request is answered, and stderr says it.

One real server over stdio (:class:`tests.support.lsp_wire.Wire`, raw bytes) for the module.
Notes [Analysis off the loop] (lsp/server.py), [Bounded work per document] (lsp/document.py),
[Framing faults] (lsp/framing.py).
"""

from __future__ import annotations

import json

import pytest

from tests.support.lsp_wire import ROOT, Wire, frame

pytestmark = pytest.mark.proc  # the language server runs as a process

SMALL = (ROOT / "workflows" / "coord_par2.wf").read_text(encoding="utf-8")


def agents(n: int, policy: str = "tiny") -> str:
    """A chain of ``n`` agents, each consumed by one transition (checks clean with ``policy: tiny``)."""
    parts = ['workflow big\nimport std\ntask { question: text }\npolicy tiny = "tiny"\n']
    parts += [f'agent a{i} {{\n  policy: {policy}\n  prompt: "Q: {{task.question}} {i}"\n'
              '  output: text via std.text\n}\n' for i in range(n)]
    parts += [f"transition t{i} {{\n  consume: a{i}\n  activate: {f'a{i + 1}' if i + 1 < n else 'end'}\n}}\n"
              for i in range(n)]
    return "".join(parts) + "start: a0\n"


@pytest.fixture(scope="module")
def wire():
    w = Wire()
    w.initialize({"tokens": False})
    yield w
    w.close()


def _publish_of(uri):
    return lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri


def test_a_hover_on_another_document_is_answered_during_a_big_analysis(wire, tmp_path):
    small = wire.open(tmp_path / "small.wf", SMALL)
    wire.published(small)
    big = wire.open(tmp_path / "big.wf", agents(1000))  # at the default limit: analyzed, for seconds
    line = next(i for i, s in enumerate(SMALL.splitlines()) if s.startswith("agent "))
    n, _ = wire.request("textDocument/hover", {"textDocument": {"uri": small}, "position": {"line": line,
                                                                                          "character": 6}})
    answer = wire.answer(n)
    assert "agent" in answer["result"]["contents"]["value"]
    wire.published(big)
    assert wire.index(lambda m: m.get("id") == n) < wire.index(_publish_of(big))  # answered first
    wire.close_doc(big)


def test_a_newer_version_supersedes_an_older_analysis(wire, tmp_path):
    small = wire.open(tmp_path / "small.wf", SMALL)
    wire.published(small)
    uri = wire.open(tmp_path / "versions.wf", agents(1000))  # v1: a long analysis starts at once
    n, _ = wire.request("textDocument/documentSymbol", {"textDocument": {"uri": small}})
    wire.answer(n)  # a round trip: v1's analysis now runs on its thread (its result will be dropped)
    wire.change(uri, agents(3, policy="nope2"), 2)  # superseded by v3 before its debounce ends
    wire.change(uri, agents(3, policy="nope3"), 3)
    last = wire.published(uri, 3)
    assert [d["message"].splitlines()[0] for d in last["params"]["diagnostics"]] == ["unknown policy 'nope3'"] * 3
    assert [m["params"]["version"] for m in wire.got if _publish_of(uri)(m)] == [3]  # v1, v2: never published
    wire.close_doc(uri)
    wire.close_doc(small)


HUGE_PROMPT = 'workflow w\nagent a {\n  prompt: "' + "x" * 1_100_000 + '"\n}\n'


@pytest.mark.parametrize("text, why", [
    (HUGE_PROMPT, f"{len(HUGE_PROMPT):,} bytes (the limit is 1,000,000)"),
    (agents(1001), "1,001 agents (the limit is 1,000)"),
], ids=["bytes", "agents"])
def test_a_document_over_a_limit_gets_one_diagnostic(wire, tmp_path, text, why):
    uri = wire.open(tmp_path / "huge.wf", text)
    diags = wire.published(uri, 1)["params"]["diagnostics"]
    assert [(d["code"], d["message"].splitlines()[0]) for d in diags] == [
        ("too-large", f"the document is too large for live analysis: {why}")]
    wire.close_doc(uri)


BODY = json.dumps({"jsonrpc": "2.0", "id": 99, "method": "no/such/method", "params": {}}).encode()
FAULTS = {  # the bytes of one faulty message; a valid request follows each
    "length too large": b"Content-Length: 100000\r\n\r\n" + BODY,
    "length too small": b"Content-Length: 10\r\n\r\n" + BODY,
    "binary junk": bytes(range(256)) * 3 + b"\r\n\r\n\x00\xff",
    "truncated body": frame(BODY)[:40],
    "body not JSON": frame(b"this is not JSON \xff\xfe"),
    "length not a number": b"Content-Length: ten\r\n\r\n" + BODY,
    "no header": BODY + b"\r\n",
}


@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
def test_a_framing_fault_is_survived(wire, tmp_path, fault):
    uri = wire.open(tmp_path / "f.wf", SMALL)
    wire.published(uri)
    before = len(wire.stderr)
    n, valid = wire.request("textDocument/documentSymbol", {"textDocument": {"uri": uri}}, send=False)
    wire.raw(FAULTS[fault] + valid)
    assert wire.answer(n)["result"]  # the outline
    wire.wait_stderr("framing fault", since=before)
    wire.close_doc(uri)
