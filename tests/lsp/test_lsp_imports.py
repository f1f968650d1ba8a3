"""The editor's import policy: no import by default (``check --no-import``), imports when the
settings say so, in a child process under a time limit, so a module whose import hangs never
blocks the server. A real server over stdio; the modules are real files (one sleeps at import)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from lsprotocol import types as lsp

pytest.importorskip("pytest_lsp")
import pytest_lsp  # noqa: E402
from pytest_lsp import LanguageClient  # noqa: E402

from srpo_graph.errors import SrpoGraphError  # noqa: E402
from srpo_graph.lang.checker import ImportPolicy, check_module  # noqa: E402
from srpo_graph.lang.parser import parse  # noqa: E402

from .conftest import ROOT, Docs, config, record_publishes, start  # noqa: E402
from .test_lsp_server import got, pos  # noqa: E402

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.proc]  # proc: the language server runs as a process

BAD = ROOT / "tests/lang/golden/bad"
HANGS = "import time\n\ntime.sleep(600)\n\n\ndef f(text: str) -> str:\n    return text\n"
WF = """workflow w
import std
import {module}
task {{ target: int }}
policy tiny = "tiny"
agent a {{
  policy: tiny
  prompt: "<a>{{task.target}}"
  output: int via {module}.{function}
}}
transition t {{
  consume: a
  activate: end
}}
start: a
"""


def expected(text: str, path: Path, policy: ImportPolicy) -> set[tuple]:
    from .test_lsp_server import expected as _expected

    if policy.no_import:
        return _expected(text, str(path))
    try:
        diags = check_module(parse(text, str(path)), text, imports=policy).warnings
    except SrpoGraphError as exc:
        diags = exc.diagnostics
    return {((d.span.line - 1, d.span.col - 1, d.span.end_line - 1, d.span.end_col - 1) if d.span else (0, 0, 0, 0),
             1 if d.severity == "error" else 2, d.message, d.code) for d in diags}


@pytest_lsp.fixture(config=config(), scope="module")
async def default_client(lsp_client: LanguageClient):
    record_publishes(lsp_client)
    await start(lsp_client, None)
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=config(), scope="module")
async def importing_client(lsp_client: LanguageClient):
    record_publishes(lsp_client)
    # a generous limit: a child process that imports srpo_graph takes seconds on a loaded machine
    await start(lsp_client, {"imports": "all", "importTimeout": 60, "debounce": 0})
    yield
    await lsp_client.shutdown_session()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copy(BAD / "sigtools.py", tmp_path / "sigtools.py")
    (tmp_path / "hangs.py").write_text(HANGS, encoding="utf-8")
    return tmp_path


async def test_no_import_by_default(default_client, folder):
    docs = Docs(default_client)
    text = WF.format(module="sigtools", function="two_args")
    path = folder / "sig.wf"
    uri, diags = await docs.open(path, text)
    assert got(diags) == expected(text, path, ImportPolicy(no_import=True))
    assert not [d for d in diags if d.code == "bad-signature"]  # the signature is not checked: nothing imported
    docs.close(uri)
    text = WF.format(module="hangs", function="f")  # would hang if imported: answered at once
    uri, diags = await docs.open(folder / "hangs.wf", text)
    assert got(diags) == expected(text, folder / "hangs.wf", ImportPolicy(no_import=True))
    docs.close(uri)


async def test_imports_when_the_settings_allow_them(importing_client, folder):
    client = importing_client
    docs = Docs(client)
    text = WF.format(module="sigtools", function="two_args")
    path = folder / "sig.wf"
    uri = path.resolve().as_uri()
    client.publish_log.clear()
    await docs.open(path, text)  # the no-import diagnostics first ...

    async def until(pred):
        while not pred():
            await client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)

    await asyncio.wait_for(until(lambda: len([u for u, _ in client.publish_log if u == uri]) >= 2), 60)
    final = client.published[uri][1]  # ... then check's own, with the module imported
    want = expected(text, path, ImportPolicy())
    assert got(final) == want and any(code == "bad-signature" for *_, code in want)
    docs.close(uri)

    # a module that hangs at import: the server keeps answering, then gives up after the limit
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"importTimeout": 5}))
    text = WF.format(module="hangs", function="f")
    path = folder / "hangs.wf"
    uri = path.resolve().as_uri()
    client.publish_log.clear()
    _, first = await docs.open(path, text)
    hover = await client.text_document_hover_async(lsp.HoverParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=pos(text, "agent a", delta=6)))
    assert hover is not None and len([u for u, _ in client.publish_log if u == uri]) == 1  # answered meanwhile
    await asyncio.wait_for(until(lambda: len([u for u, _ in client.publish_log if u == uri]) >= 2), 60)
    final = client.published[uri][1]
    note = [d for d in final if d.code == "import-timeout"]
    assert len(note) == 1 and "took longer than 5 s" in note[0].message
    assert note[0].severity == lsp.DiagnosticSeverity.Warning and note[0].range.start == pos(text, "hangs")
    assert got([d for d in final if d.code != "import-timeout"]) == got(first)
    docs.close(uri)

    # the settings change: only `sigtools` may be imported now
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(
        settings={"srpoGraph": {"imports": "allowed", "allowedImports": ["sigtools"], "importTimeout": 60}}))
    text = WF.format(module="hangs", function="f")
    client.publish_log.clear()
    uri, diags = await docs.open(folder / "hangs2.wf", text)
    want = expected(text, folder / "hangs2.wf", ImportPolicy(allowed=("sigtools",)))
    assert got(diags) != want  # the no-import answer first; the allowed-import check (in the child) follows
    await asyncio.wait_for(until(lambda: len([u for u, _ in client.publish_log if u == uri]) >= 2), 60)
    assert got(client.published[uri][1]) == want and any(code == "bad-import" for *_, code in want)
    docs.close(uri)


ROUTE_WF = """workflow r
import std
import looptools as lt
task { target: int }
policy tiny = "tiny"
agent a {
  policy: tiny
  prompt: "<a>{task.target}"
  output: int via std.digit
}
transition t {
  consume: a
  tool verdict = lt.verdict(a)
  activate: route verdict { stop -> end, again -> a }
  max_rounds: 3
}
start: a
"""
LOOPTOOLS = ('from typing import Literal\n\n\ndef verdict(x: int | None) -> Literal["stop", "again"]:\n'
             '    return "stop" if x else "again"\n')


async def _hover_text(client, uri: str, text: str) -> str:
    hover = await client.text_document_hover_async(lsp.HoverParams(
        text_document=lsp.TextDocumentIdentifier(uri=uri), position=pos(text, "verdict =")))
    assert hover is not None
    return hover.contents.value


async def test_hover_shows_a_tools_literal_result_when_imports_are_on(importing_client, folder):
    """Issue 39, item 5: hover showed `text` for a tool returning ``Literal["stop", "again"]``; the type
    comes from the check with imports (the child's answer), and without imports hover says it is unknown."""
    client = importing_client
    docs = Docs(client)
    (folder / "looptools.py").write_text(LOOPTOOLS)
    client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(  # an earlier test narrowed them
        settings={"srpoGraph": {"imports": "all", "importTimeout": 60}}))
    path = folder / "route.wf"
    uri = path.resolve().as_uri()
    await docs.open(path, ROUTE_WF)

    async def typed() -> str:  # the child's answer arrives after the no-import diagnostics
        while "type unknown" in (shown := await _hover_text(client, uri, ROUTE_WF)):
            await client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        return shown

    assert "`choice[stop, again]`" in await asyncio.wait_for(typed(), 60)
    docs.close(uri)


async def test_hover_says_a_tools_type_is_unknown_without_imports(default_client, folder):
    docs = Docs(default_client)
    (folder / "looptools.py").write_text(LOOPTOOLS)
    uri, _ = await docs.open(folder / "route.wf", ROUTE_WF)
    shown = await _hover_text(default_client, uri, ROUTE_WF)
    assert "type unknown" in shown and "`text`" not in shown, shown
    docs.close(uri)
