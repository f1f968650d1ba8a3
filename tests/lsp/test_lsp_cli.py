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
