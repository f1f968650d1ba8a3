"""The language server (``srpo-graph lsp``) driven over stdio by a real LSP client (pytest-lsp).

One server for the module (starting one costs about a second); every document is a real file
or a real text sent as the client would. Expected values come from the checker and the
formatter called directly, and from ``srpo-graph check`` run as a process, with positions
converted to UTF-16 here independently of the server.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from lsprotocol import types as lsp

pytest.importorskip("pytest_lsp")
import pytest_lsp  # noqa: E402
from pytest_lsp import LanguageClient  # noqa: E402

from srpo_graph.errors import SrpoGraphError, source_lines  # noqa: E402
from srpo_graph.lang.checker import ImportPolicy, check_module  # noqa: E402
from srpo_graph.lang.fmt import format_source  # noqa: E402
from srpo_graph.lang.parser import parse  # noqa: E402
from srpo_graph.runtime.tokens import check_local_tokens  # noqa: E402

from .conftest import ROOT, Docs, config, record_publishes, start  # noqa: E402

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.proc]  # proc: the language server runs as a process

EXAMPLES = sorted((ROOT / "workflows").rglob("*.wf"))
def _utf8(p: Path) -> bool:  # an editor sends decoded text: a file that is not UTF-8 never reaches the server
    try:
        p.read_text(encoding="utf-8")
        return True
    except UnicodeDecodeError:
        return False


BROKEN = [p for p in sorted((ROOT / "tests/lang/golden/bad").glob("*.wf")) if _utf8(p)]


@pytest_lsp.fixture(config=config(), scope="module")
async def client(lsp_client: LanguageClient):
    record_publishes(lsp_client)
    await start(lsp_client, {"debounce": 0.05})
    yield
    await lsp_client.shutdown_session()


@pytest.fixture(scope="module")
def docs(client) -> Docs:
    return Docs(client)


def utf16(line: str, col: int) -> int:
    """UTF-16 code units before the 1-based character column ``col``."""
    return len(line[: col - 1].encode("utf-16-le")) // 2


def expected(text: str, path: str) -> set[tuple]:
    """``check --no-import``'s diagnostics of ``text`` (with the token rule) as (range, severity,
    first line of message, code), positions in UTF-16."""
    try:
        result = check_module(parse(text, path), text, imports=ImportPolicy(no_import=True))
        diags = result.warnings + check_local_tokens(result.workflow)  # check's token rule, as the CLI runs it
    except SrpoGraphError as exc:
        diags = exc.diagnostics
    lines = source_lines(text)
    out = set()
    for d in diags:
        if d.span is None:
            rng = (0, 0, 0, 0)
        else:
            s = d.span
            end_text = lines[s.end_line - 1] if s.end_line <= len(lines) else ""
            rng = (s.line - 1, utf16(lines[s.line - 1], s.col), s.end_line - 1, utf16(end_text, s.end_col))
        out.add((rng, 1 if d.severity == "error" else 2, d.message, d.code))
    return out


def got(diags: list[lsp.Diagnostic]) -> set[tuple]:
    out = set()
    for d in diags:
        r = d.range
        message = d.message.split("\nwhy: ")[0].split("\nfix: ")[0]
        message = re.sub(r"^\S+\.wf: ", "", message) if d.range == lsp.Range(
            start=lsp.Position(line=0, character=0), end=lsp.Position(line=0, character=0)) else message
        out.add(((r.start.line, r.start.character, r.end.line, r.end.character), int(d.severity), message, d.code))
    return out


def pos(text: str, needle: str, nth: int = 0, delta: int = 0) -> lsp.Position:
    """The LSP (UTF-16) position of the ``nth`` occurrence of ``needle`` (plus ``delta`` characters)."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    at += delta
    line = text.count("\n", 0, at)
    start = text.rfind("\n", 0, at) + 1
    return lsp.Position(line=line, character=len(text[start:at].encode("utf-16-le")) // 2)


def doc_id(uri: str) -> lsp.TextDocumentIdentifier:
    return lsp.TextDocumentIdentifier(uri=uri)


# --------------------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("path", EXAMPLES + BROKEN, ids=lambda p: str(p.relative_to(ROOT)))
async def test_diagnostics_equal_checks(client, docs, path):
    text = path.read_text(encoding="utf-8")
    uri, diags = await docs.open(path)
    try:
        assert got(diags) == expected(text, str(path))
        if path in EXAMPLES:
            assert not [d for d in diags if d.severity == lsp.DiagnosticSeverity.Error]
    finally:
        docs.close(uri)


async def test_diagnostics_match_the_check_command(client, docs):
    """The same files through `srpo-graph check --no-import` (in process: tests/support/cli.py): every
    `path:line:col: severity: message` it prints is a diagnostic the server published."""
    from tests.support.cli import invoke

    files = [p for p in BROKEN if not p.name.startswith(("bom", "not_utf8"))]
    run = invoke("check", "--no-import", *files)
    headlines = re.findall(r"^(\S+\.wf):(\d+):(\d+): (error|warning): (.*)$", run.stderr, re.M)
    assert len(headlines) >= len(files) - 3  # nearly every file has at least one located error
    by_file: dict[str, list] = {}
    for path, line, col, sev, message in headlines:
        by_file.setdefault(path, []).append((int(line), int(col), sev, message))
    for path, rows in by_file.items():
        p = Path(path)
        text = p.read_text(encoding="utf-8")
        lines = source_lines(text)
        uri, diags = await docs.open(p)
        docs.close(uri)
        published = {(d.range.start.line, d.range.start.character, d.severity, d.message.split("\n")[0]) for d in diags}
        for line, col, sev, message in rows:
            want = (line - 1, utf16(lines[line - 1], col), 1 if sev == "error" else 2, message)
            assert want in published, (path, want, published)


async def test_utf16_columns_after_non_ascii_prompt_text(client, docs, tmp_path):
    text = ('workflow w\nimport std\ntask { q: text }\npolicy p = "tiny"\n'
            'agent a { policy: p  prompt: "𝔖 café 😀 {task.nope} then {b}"  output: int }\n'
            'agent b { policy: p  prompt: "x {task.q}" unconsumed: allow }\n'
            'transition t { consume: a  activate: b }\nstart: a\n')
    path = tmp_path / "unicode.wf"
    uri, diags = await docs.open(path, text)
    by_message = {d.message.split("\n")[0]: d for d in diags}
    d = by_message["unknown task field 'nope'"]
    assert d.range.start == pos(text, "{task.nope}")  # 𝔖 and 😀 are two UTF-16 units each
    assert d.range.end == pos(text, "{task.nope}", delta=len("{task.nope}"))
    assert d.range.start.character == len(text.split("\n")[4][: text.split("\n")[4].index("{task.nope}")]) + 2
    assert got(diags) == expected(text, str(path))
    where = lsp.HoverParams(text_document=doc_id(uri), position=pos(text, "{b}", delta=1))
    hover = await client.text_document_hover_async(where)
    assert hover is not None and "**agent** `b`" in hover.contents.value
    assert hover.range.start == pos(text, "{b}", delta=1)
    docs.close(uri)


async def test_the_token_rule_of_check(client, docs, tmp_path):
    """`allow` entries that are not single tokens of the tiny tokenizer: check's error, on the agent."""
    text = (
        'workflow w\nimport std\npolicy p = "tiny"\n'
        'agent a { policy: p  prompt: "<judge>x"  sample { allow: ["0", "10"] } }\n'
        "transition t { consume: a  activate: end }\nstart: a\n"
    )
    uri, diags = await docs.open(tmp_path / "tokens.wf", text)
    docs.close(uri)
    assert {d.code for d in diags} == {"bad-token", "unknown-token"}
    assert got(diags) == expected(text, str(tmp_path / "tokens.wf"))


async def test_related_locations(client, docs):
    path = ROOT / "tests/lang/golden/bad/duplicate_name.wf"
    text = path.read_text(encoding="utf-8")
    uri, diags = await docs.open(path)
    docs.close(uri)
    dup = next(d for d in diags if d.code == "duplicate-name")
    assert "fix: 'a' is already declared at line 5" in dup.message
    (rel,) = dup.related_information
    assert rel.location.uri == uri and rel.location.range.start == pos(text, "agent a", delta=6)
    path = ROOT / "tests/lang/golden/bad/double_consume.wf"
    text = path.read_text(encoding="utf-8")
    uri, diags = await docs.open(path)
    docs.close(uri)
    double = next(d for d in diags if d.code == "double-consume")
    assert double.range.start == pos(text, "consume: b, a", delta=12)
    (rel,) = double.related_information
    assert rel.message == "'a' consumed by 't' here" and rel.location.range.start == pos(text, "consume: a", delta=9)


async def test_debounced_diagnostics_publish_the_last_version(client, docs, tmp_path):
    path = ROOT / "workflows/coord_routed.wf"
    text = path.read_text(encoding="utf-8")
    uri, _ = await docs.open(path)
    # a debounce far longer than the gaps between the edits, even on a loaded machine
    client.publish_log.clear()
    client.workspace_did_change_configuration(
        lsp.DidChangeConfigurationParams(settings={"srpoGraph": {"debounce": 1.0}})
    )
    while (uri, 1) not in client.publish_log:  # new settings: the open documents are checked again
        await asyncio.wait_for(client.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS), 60)
    client.publish_log.clear()
    try:
        for k in range(1, 6):  # five edits in quick succession, each a broken text
            version = docs.change(uri, text + "agent" * k)
        diags = await docs.diagnostics_of(uri, version)
        assert any(d.severity == lsp.DiagnosticSeverity.Error for d in diags)
        assert [v for u, v in client.publish_log if u == uri] == [version]  # the earlier versions were never checked
        version = docs.change(uri, text)
        assert got(await docs.diagnostics_of(uri, version)) == expected(text, str(path))
    finally:
        client.workspace_did_change_configuration(
            lsp.DidChangeConfigurationParams(settings={"srpoGraph": {"debounce": 0.05}})
        )
        docs.close(uri)


# --------------------------------------------------------------------------- navigation


SEARCH = ROOT / "workflows/paper/search_k5_qwen25.wf"


async def test_hover_agent_transition_std_function_and_field(client, docs):
    text = SEARCH.read_text(encoding="utf-8")
    uri, _ = await docs.open(SEARCH)

    async def hover(needle, nth=0, delta=0):
        h = await client.text_document_hover_async(
            lsp.HoverParams(text_document=doc_id(uri), position=pos(text, needle, nth, delta))
        )
        return h.contents.value if h is not None else None

    reader = await hover("agent reader", delta=7)
    assert 'policy: `qwen` = "Qwen/Qwen2.5-3B-Instruct"' in reader
    assert "output: `{action: choice[search, answer], query: text}` via `std.search_action`" in reader
    assert "consumed by: `read`" in reader and "activated by: `search`" in reader
    q1 = await hover("consume: q1", delta=9)
    assert "consumed by: `search`" in q1 and "`start`" in q1 and "`read`" in q1
    search = await hover("transition search", delta=11)
    assert "consumes: `q1`, `q2`, `q3`, `q4`, `q5`" in search
    assert "active-set sizes (proved by `check`): 5" in search
    assert "tool `d1` = `std.retrieve(q1, k=3)`" in search
    retrieve = await hover("std.retrieve", delta=4)
    from srpo_graph import std
    from srpo_graph.lang.stdref import std_entry

    kind, sig, doc = std_entry("retrieve", std.retrieve)
    assert f"**std.retrieve** ({kind})" in retrieve and sig in retrieve and doc in retrieve
    assert "`task.question`: `text`" in await hover("{task.question}", delta=6)
    assert "**tool result** `d3`: `text`" in await hover("{d3}", delta=1)
    assert await hover("Write one web-search") is None  # prompt text names nothing
    docs.close(uri)


async def test_definition_and_references(client, docs, tmp_path):
    (tmp_path / "mytools.py").write_text(
        'import time\n\n\ndef lookup(query: str, k: int = 2) -> str:\n    """Look it up."""\n    return query\n',
        encoding="utf-8",
    )
    text = (
        'workflow w\nimport std\nimport mytools\ntask { q: text }\npolicy p = "tiny"\n'
        'agent a { policy: p  prompt: "{task.q}" }\n'
        'agent b { policy: p  prompt: "{a} {docs}" }\n'
        "transition t { consume: a  tool docs = mytools.lookup(a, k=3)  activate: b }\n"
        "transition u { consume: b  reward: std.exact_match(b, task.q)  activate: end }\nstart: a\n"
    )
    path = tmp_path / "nav.wf"
    uri, diags = await docs.open(path, text)
    assert not [d for d in diags if d.severity == lsp.DiagnosticSeverity.Error]

    async def definition(needle, delta=0):
        return await client.text_document_definition_async(
            lsp.DefinitionParams(text_document=doc_id(uri), position=pos(text, needle, delta=delta))
        )

    (loc,) = await definition("consume: a", delta=9)
    assert loc.uri == uri and loc.range.start == pos(text, "agent a", delta=6)
    (loc,) = await definition("{docs}", delta=2)
    assert loc.range.start == pos(text, "tool docs", delta=5)
    (loc,) = await definition("{task.q}", delta=6)
    assert loc.range.start == pos(text, "task { q", delta=7)
    (loc,) = await definition("mytools.lookup", delta=9)  # into the imported .py file (never imported)
    assert loc.uri == (tmp_path / "mytools.py").as_uri()
    assert (loc.range.start.line, loc.range.start.character, loc.range.end.character) == (3, 4, 10)
    (loc,) = await definition("std.exact_match", delta=5)
    import inspect

    from srpo_graph import std

    assert loc.uri == Path(std.__file__).resolve().as_uri()
    assert loc.range.start.line == inspect.getsourcelines(std.exact_match)[1] - 1
    refs = await client.text_document_references_async(
        lsp.ReferenceParams(
            text_document=doc_id(uri),
            position=pos(text, "agent a", delta=6),
            context=lsp.ReferenceContext(include_declaration=True),
        )
    )
    want = [
        pos(text, "agent a", delta=6),
        pos(text, "{a}", delta=1),
        pos(text, "consume: a", delta=9),
        pos(text, "lookup(a", delta=7),
        pos(text, "start: a", delta=7),
    ]
    assert sorted((r.range.start.line, r.range.start.character) for r in refs) == sorted(
        (p.line, p.character) for p in want
    )
    refs = await client.text_document_references_async(
        lsp.ReferenceParams(
            text_document=doc_id(uri),
            position=pos(text, "{a}", delta=1),
            context=lsp.ReferenceContext(include_declaration=False),
        )
    )
    assert len(refs) == 4
    docs.close(uri)


async def test_document_symbols(client, docs):
    uri, _ = await docs.open(SEARCH)
    syms = await client.text_document_document_symbol_async(lsp.DocumentSymbolParams(text_document=doc_id(uri)))
    docs.close(uri)
    names = [s.name for s in syms]
    assert names == [
        "std",
        "task",
        "qwen",
        "q1",
        "q2",
        "q3",
        "q4",
        "q5",
        "reader",
        "search",
        "read",
        "start",
        "reward",
        "max_steps",
    ]
    by = {s.name: s for s in syms}
    assert [c.name for c in by["task"].children] == ["question", "answer"]
    assert [c.name for c in by["reader"].children] == ["action", "query"]
    assert [c.name for c in by["search"].children] == ["d1", "d2", "d3", "d4", "d5"]
    assert by["search"].kind == lsp.SymbolKind.Event and by["reader"].kind == lsp.SymbolKind.Function


# --------------------------------------------------------------------------- editing


async def _complete(client, uri, text, offset):
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    res = await client.text_document_completion_async(
        lsp.CompletionParams(
            text_document=doc_id(uri),
            position=lsp.Position(line=line, character=len(text[start:offset].encode("utf-16-le")) // 2),
        )
    )
    return [i.label for i in res.items]


async def test_completion_lists(client, docs, tmp_path):
    text = SEARCH.read_text(encoding="utf-8")
    path = tmp_path / "complete.wf"
    uri, _ = await docs.open(path, text)
    agents = ["q1", "q2", "q3", "q4", "q5", "reader"]

    async def at_edit(before: str, insert: str) -> list[str]:
        """Type ``insert`` right after ``before`` and complete at the end of it."""
        cut = text.index(before) + len(before)
        edited = text[:cut] + insert + text[cut:]
        docs.change(uri, edited)
        return await _complete(client, uri, edited, cut + len(insert))

    assert await at_edit("  consume: q1, q2, q3, q4, q5\n", "  consume: ") == agents
    transition_words = ["consume:", "tool", "reward:", "activate:", "max_rounds:"]
    assert await at_edit("  activate: reader\n", "") == transition_words  # a new line in a transition
    got_ = await at_edit("transition read {\n", "  activate: ")
    assert got_ == agents + ["end", "route"]
    assert await at_edit("Question: {task.question}\n", "{") == agents + ["d1", "d2", "d3", "d4", "d5", "task"]
    assert await at_edit("Question: {task.question}\n", "{task.") == ["question", "answer"]
    assert await at_edit("Question: {task.question}\n", "{reader.") == ["action", "query"]
    from srpo_graph.lang.stdref import std_functions

    assert await at_edit("  tool d5 = std.retrieve(q5, k=3)\n", "  reward: std.") == [n for n, _ in std_functions()]
    assert await at_edit("  tool d5 = std.retrieve(q5, k=3)\n", "  reward: ") == ["std"]  # the imported modules
    assert await at_edit("  tool d5 = std.retrieve(q5, k=3)\n", "  tool d6 = ") == ["std"]
    from srpo_graph.lang.agents import SAMPLING_KEYS

    assert await at_edit("  sample { ", "") == list(SAMPLING_KEYS)
    assert await at_edit("  output: text via std.text\n", "  output: ") == [
        "text",
        "int",
        "float",
        "bool",
        "choice[",
        "choices[",
        "list[",
        "{",
    ]
    assert await at_edit("  policy: qwen\n", "  policy: ") == ["qwen"]
    assert await at_edit("max_steps: 6\n", "") == [
        "import",
        "task",
        "policy",
        "agent",
        "transition",
        "start:",
        "reward:",
        "max_steps:",
    ]
    assert await at_edit("transition read {\n", "  ") == ["consume:", "tool", "reward:", "activate:", "max_rounds:"]
    assert await at_edit("# The paper", "") == []  # inside a comment
    docs.close(uri)


def _apply(text: str, edits: list[lsp.TextEdit]) -> str:
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)

    def off(p: lsp.Position) -> int:  # ASCII text: UTF-16 units are characters
        return offsets[p.line] + p.character

    for e in sorted(edits, key=lambda e: off(e.range.start), reverse=True):
        text = text[: off(e.range.start)] + e.new_text + text[off(e.range.end) :]
    return text


@pytest.mark.parametrize(
    "needle,delta,old,new,count",
    [
        # decl, activate, consume, route, reward (chat agents: no prompt reads it)
        ("agent reader", 7, "reader", "judge", 5),
        ("transition search", 11, "search", "lookup", 1),  # not the `search` choice label of the reader
        ("policy qwen", 7, "qwen", "base", 7),
        ("tool d3", 5, "d3", "docs3", 2),
        ("{task.question}", 6, "question", "query", 7),
    ],
)
async def test_rename_edits(client, docs, tmp_path, needle, delta, old, new, count):
    text = SEARCH.read_text(encoding="utf-8")
    path = tmp_path / "rename.wf"
    uri, _ = await docs.open(path, text)
    at = pos(text, needle, delta=delta)
    prep = await client.text_document_prepare_rename_async(
        lsp.PrepareRenameParams(text_document=doc_id(uri), position=at)
    )
    assert prep is not None and _apply(text, []) == text
    edit = await client.text_document_rename_async(
        lsp.RenameParams(text_document=doc_id(uri), position=at, new_name=new)
    )
    edits = edit.changes[uri]
    assert len(edits) == count
    lines = text.split("\n")
    assert all(lines[e.range.start.line][e.range.start.character : e.range.end.character] == old for e in edits)
    renamed = _apply(text, edits)
    # the renamed file checks to the same workflow under the new name
    a = check_module(parse(text, "x.wf"), text, imports=ImportPolicy(no_import=True)).workflow
    b = check_module(parse(renamed, "x.wf"), renamed, imports=ImportPolicy(no_import=True)).workflow
    rn = lambda x: new if x == old else x  # noqa: E731
    assert [(t.name if t.name != old else new, t.set_sizes, tuple(map(rn, t.consume))) for t in a.transitions] == [
        (t.name, t.set_sizes, t.consume) for t in b.transitions
    ]
    assert [rn(x.name) for x in a.agents] == [x.name for x in b.agents]
    assert [rn(x.name) for x in a.policies] == [x.name for x in b.policies]
    docs.close(uri)


async def test_rename_refuses_a_taken_or_bad_name(client, docs, tmp_path):
    text = SEARCH.read_text(encoding="utf-8")
    uri, _ = await docs.open(tmp_path / "rename_bad.wf", text)
    at = pos(text, "agent reader", delta=7)
    for bad, why in (
        ("q1", "already names an agent"),
        ("search", "already names a transition"),
        ("d1", "already names a tool"),
        ("2x", "is not a name"),
        ("end", "is reserved"),
    ):
        with pytest.raises(Exception, match=why):
            await client.text_document_rename_async(
                lsp.RenameParams(text_document=doc_id(uri), position=at, new_name=bad)
            )
    prep = await client.text_document_prepare_rename_async(
        lsp.PrepareRenameParams(text_document=doc_id(uri), position=pos(text, "std.retrieve", delta=5))
    )
    assert prep is None  # a std function is not the file's to rename
    docs.close(uri)


@pytest.mark.parametrize("path", EXAMPLES[:3] + [ROOT / "tests/lang/golden/ok/features.wf"], ids=lambda p: p.name)
async def test_formatting_edits_are_fmt(client, docs, tmp_path, path):
    text = path.read_text(encoding="utf-8")
    messy = re.sub(r"\n\n+", "\n", text).replace("  ", "    ").replace(": ", " :  ")
    uri, _ = await docs.open(tmp_path / path.name, messy)
    edits = await client.text_document_formatting_async(
        lsp.DocumentFormattingParams(
            text_document=doc_id(uri), options=lsp.FormattingOptions(tab_size=2, insert_spaces=True)
        )
    )
    assert _apply(messy, edits) == format_source(messy)
    docs.change(uri, format_source(messy))
    assert await client.text_document_formatting_async(
        lsp.DocumentFormattingParams(
            text_document=doc_id(uri), options=lsp.FormattingOptions(tab_size=2, insert_spaces=True)
        )
    ) in ([], ())
    docs.close(uri)


async def test_typing_a_file_character_by_character(client, docs, tmp_path):
    """Every prefix of a real workflow, sent as the user types it, with a request at the cursor
    every few characters: the server answers each (no error) and ends with check's diagnostics."""
    text = (ROOT / "workflows/coord_routed.wf").read_text(encoding="utf-8")
    uri, _ = await docs.open(tmp_path / "typed.wf", "")
    for end in range(1, len(text) + 1):
        prefix = text[:end]
        docs.change(uri, prefix)
        if end % 7 == 0:
            line = prefix.count("\n")
            cursor = lsp.Position(line=line, character=len(prefix) - (prefix.rfind("\n") + 1))
            ident = doc_id(uri)
            await client.text_document_completion_async(lsp.CompletionParams(text_document=ident, position=cursor))
            await client.text_document_hover_async(lsp.HoverParams(text_document=ident, position=cursor))
            await client.text_document_definition_async(lsp.DefinitionParams(text_document=ident, position=cursor))
        if end % 97 == 0:
            await client.text_document_document_symbol_async(lsp.DocumentSymbolParams(text_document=doc_id(uri)))
            await client.text_document_formatting_async(
                lsp.DocumentFormattingParams(
                    text_document=doc_id(uri), options=lsp.FormattingOptions(tab_size=2, insert_spaces=True)
                )
            )
    diags = await docs.diagnostics_of(uri, docs.versions[uri])
    assert got(diags) == expected(text, str(tmp_path / "typed.wf"))
    assert client.error is None
    docs.close(uri)


async def test_graph_command_returns_the_viz_svg(client, docs):
    uri, _ = await docs.open(SEARCH)
    out = await client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command="srpo-graph.graphSvg", arguments=[uri])
    )
    assert out["error"] is None and out["svg"].lstrip().startswith("<?xml") and "reader" in out["svg"]
    broken = ROOT / "tests/lang/golden/bad/duplicate_name.wf"
    uri2, _ = await docs.open(broken)
    out = await client.workspace_execute_command_async(
        lsp.ExecuteCommandParams(command="srpo-graph.graphSvg", arguments=[uri2])
    )
    assert out["svg"] is None and "duplicate node name 'a'" in out["error"]
    docs.close(uri)
    docs.close(uri2)
