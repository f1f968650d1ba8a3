"""`srpo-graph lsp` is a subcommand of the CLI and speaks LSP on stdio (a raw JSON-RPC
exchange with the real process: initialize, shutdown, exit)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app

from .conftest import ENV


def test_lsp_is_a_subcommand():
    out = CliRunner().invoke(app, ["lsp", "--help"])
    assert out.exit_code == 0 and "language server of .wf files" in out.output


def _frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode("utf-8")
    return f"Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body


@pytest.mark.proc
def test_the_process_answers_initialize_and_exits_on_exit():
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None,
                                                                         "capabilities": {}}},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    run = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "lsp"], input=b"".join(map(_frame, messages)),
                         capture_output=True, timeout=60, env=ENV)
    assert run.returncode == 0, run.stderr.decode()
    bodies = [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in run.stdout.split(b"Content-Length: ")[1:]]
    init = next(b for b in bodies if b.get("id") == 1)["result"]
    caps = init["capabilities"]
    assert init["serverInfo"]["name"] == "srpo-graph"
    assert caps["textDocumentSync"]["change"] == 1  # full sync
    for feature in ("hoverProvider", "definitionProvider", "referencesProvider", "documentSymbolProvider",
                    "documentFormattingProvider", "completionProvider", "renameProvider"):
        assert caps.get(feature), feature
    assert "srpo-graph.graphSvg" in caps["executeCommandProvider"]["commands"]


@pytest.mark.proc
def test_exit_without_shutdown_ends_with_status_1():
    """The protocol's rule (pygls's ``exit`` handler chooses it): ``exit`` before ``shutdown`` ends
    the server with 1. The status used to be lost (the server's loop swallowed the SystemExit), so
    every exit was 0."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None,
                                                                         "capabilities": {}}},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    run = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "lsp"], input=b"".join(map(_frame, messages)),
                         capture_output=True, timeout=60, env=ENV)
    assert run.returncode == 1, run.stderr.decode()
    assert b'"id": 1' in run.stdout and not run.stderr


@pytest.mark.proc
def test_a_refused_rename_is_an_error_answer_without_a_traceback_and_a_broken_file_keeps_its_outline(tmp_path):
    """Issue 39, item 5: refused renames printed tracebacks on the server's stderr, and the outline was
    empty on any syntax error. The real process over stdio: the rename is answered with an error
    naming why (no traceback logged); the outline of a file with a broken item lists the items that
    parse (Note [Syntax error recovery])."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflows" / "coord_par2.wf").read_text()
    broken = text.replace("transition joint {", "transition joint {{{")
    good_uri, broken_uri = (tmp_path / "good.wf").as_uri(), (tmp_path / "broken.wf").as_uri()
    line = next(i for i, s in enumerate(text.splitlines()) if s.startswith("agent a"))

    def opened(uri, body):
        return {"jsonrpc": "2.0", "method": "textDocument/didOpen",
                "params": {"textDocument": {"uri": uri, "languageId": "wf", "version": 1, "text": body}}}

    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None,
                                                                         "capabilities": {}}},
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        opened(good_uri, text), opened(broken_uri, broken),
        {"jsonrpc": "2.0", "id": 2, "method": "textDocument/rename",
         "params": {"textDocument": {"uri": good_uri}, "position": {"line": line, "character": 6}, "newName": "b"}},
        {"jsonrpc": "2.0", "id": 3, "method": "textDocument/documentSymbol",
         "params": {"textDocument": {"uri": broken_uri}}},
        {"jsonrpc": "2.0", "id": 4, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    run = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "lsp"], input=b"".join(map(_frame, messages)),
                         capture_output=True, timeout=60, env=ENV)
    assert run.returncode == 0, run.stderr.decode()
    bodies = [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in run.stdout.split(b"Content-Length: ")[1:]]
    rename = next(b for b in bodies if b.get("id") == 2)
    assert "already names an agent" in rename["error"]["message"]
    assert "Traceback" not in run.stderr.decode()
    outline = [s["name"] for s in next(b for b in bodies if b.get("id") == 3)["result"]]
    assert outline[:5] == ["std", "task", "tiny", "a", "b"] and "start" in outline
