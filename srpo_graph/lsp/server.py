"""``srpo-graph lsp``: the Language Server of ``.wf`` files, over stdio (pygls).

Stage: lsp. Wires the LSP requests to :mod:`.document` (diagnostics: the parser and checker
themselves), :mod:`.features` and :mod:`.completion`; converts positions (:mod:`.positions`,
the client's column unit). Decisions:

* Full document sync: each change carries the whole text (a ``.wf`` file is a few KB), so the
  server never applies an edit with a line model other than the parser's.
* Diagnostics are published on open at once, and after a change once the user has paused
  (``debounce`` seconds, default 0.15); a newer change cancels the pending check.
* Imports: none by default (``check --no-import``); ``imports: "all"`` or ``"allowed"`` (with
  ``allowedImports``) runs the check with imports in a child process under ``importTimeout``
  seconds (:mod:`.imports`): its diagnostics replace the no-import ones when it answers in time,
  else a warning on the import line says why they are not shown.
* Analysis runs on worker threads, never on the event loop, one per document at a time; a newer
  version supersedes an older one, whose result is dropped (Note [Analysis off the loop]). A
  document over the limits (``maxBytes``, ``maxLines``, ``maxAgents``) is not analyzed: one
  warning says so (Note [Bounded work per document] in :mod:`.document`).
* Every handler answers from the analysis of the current text, waiting for it at most
  ``requestWait`` seconds, else from the last completed one (an edit -- formatting, rename -- is
  only computed on the current text); completion falls back to the last version that parsed
  (mid-edit text rarely does). A failure inside a handler is answered as an LSP error, never a
  crash.
* The transport survives framing faults (a wrong ``Content-Length``, junk bytes, a body that is
  not JSON): :mod:`.framing` resynchronises at the next header.

* ``check``'s token rule (``allow`` entries against local tokenizers) runs on a worker thread
  when the file checks, before the diagnostics are published (setting ``tokens``, default on;
  transformers is imported in the background at start, so only a cold start waits for it).

Settings come from ``initializationOptions`` and ``workspace/didChangeConfiguration``
(``{"srpoGraph": {...}}`` or the bare object): ``imports``, ``allowedImports``,
``importTimeout``, ``debounce``, ``tokens``, ``maxBytes``, ``maxLines``, ``maxAgents``,
``requestWait``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from srpo_graph.errors import Diagnostic
from srpo_graph.lang.checker import ImportPolicy
from srpo_graph.lsp import completion, features
from srpo_graph.lsp.document import NO_IMPORT, Analysis, Limits, too_large
from srpo_graph.lsp.framing import serve_stdio
from srpo_graph.lsp.imports import check_in_child
from srpo_graph.lsp.positions import Lines
from srpo_graph.lsp.workers import analyze_without_gc, token_diagnostics, warm_analysis, warm_tokens

log = logging.getLogger(__name__)

GRAPH_COMMAND = "srpo-graph.graphSvg"
SOURCE = "srpo-graph"


@dataclass(frozen=True)
class Settings:
    """The editor's settings (see the module docstring)."""

    imports: str = "none"  # none | allowed | all
    allowed_imports: tuple[str, ...] = ()
    import_timeout: float = 5.0  # seconds
    debounce: float = 0.15  # seconds
    tokens: bool = True  # check's token rule against local tokenizers (the first check loads transformers)
    limits: Limits = field(default_factory=Limits)  # what is analyzed live (Note [Bounded work per document])
    request_wait: float = 2.0  # seconds a request waits for the analysis of the current text

    def policy(self) -> ImportPolicy:
        if self.imports == "all":
            return ImportPolicy()
        if self.imports == "allowed":
            return ImportPolicy(allowed=self.allowed_imports)
        return NO_IMPORT

    def updated(self, raw: Any) -> "Settings":
        if not isinstance(raw, dict):
            return self
        raw = raw.get("srpoGraph", raw) if isinstance(raw.get("srpoGraph", raw), dict) else raw
        out = self
        if raw.get("imports") in ("none", "allowed", "all"):
            out = replace(out, imports=raw["imports"])
        if isinstance(raw.get("allowedImports"), list):
            out = replace(out, allowed_imports=tuple(str(x) for x in raw["allowedImports"]))
        if isinstance(raw.get("importTimeout"), (int, float)) and raw["importTimeout"] > 0:
            out = replace(out, import_timeout=float(raw["importTimeout"]))
        if isinstance(raw.get("tokens"), bool):
            out = replace(out, tokens=raw["tokens"])
        if isinstance(raw.get("debounce"), (int, float)) and raw["debounce"] >= 0:
            out = replace(out, debounce=float(raw["debounce"]))
        if isinstance(raw.get("requestWait"), (int, float)) and raw["requestWait"] >= 0:
            out = replace(out, request_wait=float(raw["requestWait"]))
        for key, attr in (("maxBytes", "max_bytes"), ("maxLines", "max_lines"), ("maxAgents", "max_agents")):
            if isinstance(raw.get(key), int) and not isinstance(raw[key], bool) and raw[key] > 0:
                out = replace(out, limits=replace(out.limits, **{attr: raw[key]}))
        return out


# Note [Analysis off the loop]
# The event loop only reads messages and answers from analyses already made; parse + check runs on
# worker threads (``_ANALYSIS_THREADS``), so a hover on one document never waits for another's
# analysis. A thread, not a child process, despite the GIL: CPython hands the lock to the waiting
# loop every switch interval (5 ms), so hovers during a 3,000-agent analysis take 14 ms (median;
# benchmarks/bench_lsp_hostile.py, 2 loaded cores; 9 s before), while a child process would have to
# send the whole analysis (syntax tree, index, workflow) back. The worst hover, ~0.6 s there, is
# the one full garbage collection right after the analysis (Note [No garbage collection during an
# analysis]).
# Per document, at most one analysis runs at a time, and each is tagged with the text and version
# it analyzed: a newer change cancels the scheduled check; if its analysis is already running on a
# thread (it cannot be interrupted) its result is dropped when it ends, and the newest version's
# analysis starts only then, so a burst of edits costs at most one stale analysis, never a queue of
# them. A request waits for the analysis of the document's current text at most ``requestWait``
# seconds, then answers from the last completed analysis (read-only features) or declines (edits:
# formatting, rename), so no request waits on a document longer than that bound. Two threads: a
# small file is not queued behind one big one. The first analysis waits for ``warm_analysis``
# (imports and grammar built once, on one thread), and the garbage collector is off while
# analyses run (Note [No garbage collection during an analysis] in :mod:`.workers`).
_ANALYSIS_THREADS = 2


@dataclass
class _Doc:
    analysis: Analysis | None = None  # the last completed analysis
    version: int | None = None  # the version it analyzed
    last_parsed: Analysis | None = None  # the last analysis whose text parsed (for completion)
    pending: asyncio.Task | None = None  # the scheduled check: debounce, analysis, publish
    running: Future | None = None  # the analysis on a worker thread, if one runs
    fresh: asyncio.Event = field(default_factory=asyncio.Event)  # set whenever an analysis completes


@dataclass
class WfServer:
    """The state of the server: settings and, per open document, its latest analysis."""

    ls: LanguageServer
    settings: Settings = field(default_factory=Settings)
    docs: dict[str, _Doc] = field(default_factory=dict)
    threads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        _ANALYSIS_THREADS, thread_name_prefix="wf-analysis"))
    warmed: Future = field(default_factory=Future)  # done once the analysis modules are imported (warm_analysis)

    # -- documents -----------------------------------------------------------------------
    def lines(self, uri: str, text: str) -> Lines:
        codec = self.ls.workspace.position_codec
        return Lines(text, codec.client_num_units)

    async def current(self, uri: str, exact: bool = False) -> tuple[Analysis, Lines] | None:
        """The analysis of the document's current text, waited for at most ``requestWait`` seconds;
        then the last completed one, unless ``exact`` (Note [Analysis off the loop]). None: there is
        none to answer from."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.request_wait
        while True:
            source = self.ls.workspace.get_text_document(uri).source
            state = self.docs.get(uri)
            if state is not None and state.analysis is not None and state.analysis.text == source:
                return state.analysis, self.lines(uri, source)
            if state is None or state.pending is None or state.pending.done():
                self.schedule(uri, 0)  # a document never opened, or a check that ended stale
                state = self.docs[uri]
            left = deadline - loop.time()
            if left <= 0:
                break
            state.fresh.clear()
            try:
                await asyncio.wait_for(state.fresh.wait(), left)
            except asyncio.TimeoutError:
                break
        if exact or state.analysis is None:
            return None
        return state.analysis, self.lines(uri, state.analysis.text)

    def remember(self, uri: str, analysis: Analysis, version: int | None) -> _Doc:
        state = self.docs.setdefault(uri, _Doc())
        state.analysis, state.version = analysis, version
        if analysis.module is not None:
            state.last_parsed = analysis
        state.fresh.set()
        return state

    def stale(self, uri: str, text: str, version: int | None) -> bool:
        """The document changed since ``text``/``version`` was read (or was closed)."""
        if uri not in self.docs:
            return True
        doc = self.ls.workspace.get_text_document(uri)
        return doc.version != version or doc.source != text

    async def analysis_of(self, uri: str, text: str) -> Analysis:
        """``text`` analyzed on a worker thread, after the document's running analysis, if any
        (Note [Analysis off the loop]); over the limits: the one diagnostic, at once."""
        why = self.settings.limits.exceeded(text)
        if why is not None:
            return too_large(text, path_of(uri), why)
        if not self.warmed.done():
            await asyncio.shield(asyncio.wrap_future(self.warmed))  # a cancelled check must not cancel it
        state = self.docs.setdefault(uri, _Doc())
        while state.running is not None and not state.running.done():
            await asyncio.wait([asyncio.wrap_future(state.running)])
        running = state.running = self.threads.submit(analyze_without_gc, text, path_of(uri))
        return await asyncio.wrap_future(running)

    # -- diagnostics ---------------------------------------------------------------------
    def schedule(self, uri: str, delay: float) -> None:
        state = self.docs.setdefault(uri, _Doc())
        if state.pending is not None:
            state.pending.cancel()
        state.pending = asyncio.ensure_future(self.publish_after(uri, delay))

    async def publish_after(self, uri: str, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        doc = self.ls.workspace.get_text_document(uri)
        text, version = doc.source, doc.version
        analysis = await self.analysis_of(uri, text)
        if self.stale(uri, text, version):
            return  # superseded: a newer check is on its way (Note [Analysis off the loop])
        self.remember(uri, analysis, version)
        token_diags: list[Diagnostic] = []
        if self.settings.tokens and analysis.workflow is not None:
            token_diags = await asyncio.to_thread(token_diagnostics, analysis)
            if self.stale(uri, text, version):
                return  # edited meanwhile: a newer check is on its way
        self.publish(uri, analysis, [*token_diags, *analysis.diagnostics], version)
        policy = self.settings.policy()
        if policy is NO_IMPORT or analysis.module is None or not analysis.index or not analysis.index.names("module"):
            return
        if all(_is_std(analysis, alias) for alias in analysis.index.names("module")):
            return
        outcome = await check_in_child(text, path_of(uri), policy, self.settings.import_timeout)
        if self.stale(uri, text, version):
            return  # edited meanwhile: a newer check is on its way
        if outcome.diagnostics is not None:
            analysis.tool_types = outcome.tool_types  # hover shows the imported functions' result types
            checked = not any(d.severity == "error" for d in outcome.diagnostics)
            self.publish(uri, analysis, [*(token_diags if checked else []), *outcome.diagnostics], version)
        else:
            imp = next((o for o in analysis.index.items if o.kind == "module" and o.is_decl
                        and not _is_std(analysis, o.name)), None)
            note = Diagnostic(outcome.problem, imp.span if imp else None, code="import-timeout", severity="warning")
            self.publish(uri, analysis, [*token_diags, *analysis.diagnostics, note], version)

    def publish(self, uri: str, analysis: Analysis, diags: list[Diagnostic], version: int | None) -> None:
        lines = self.lines(uri, analysis.text)
        self.ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=uri, version=version, diagnostics=[to_lsp(d, lines, uri) for d in diags]))


class Refused(JsonRpcInvalidParams):
    """A request the server declines on purpose (a rename to a taken name): answered as an error the
    editor shows, and logged as one line -- it is not a server fault, so no traceback (issue 39, item 5)."""


class _RefusalsWithoutTraceback(logging.Filter):
    """pygls logs every error answer with ``logger.exception``; a :class:`Refused` one becomes one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, Refused):
            record.msg, record.args, record.exc_info, record.exc_text = f"refused: {exc.message}", (), None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


logging.getLogger("pygls.protocol.json_rpc").addFilter(_RefusalsWithoutTraceback())


def _is_std(a: Analysis, alias: str) -> bool:
    imp = features.import_of(a.index, alias) if a.index is not None else None
    return imp is not None and imp.dotted == "std"


def path_of(uri: str) -> str:
    """The file path of a ``file:`` URI (other schemes: the URI itself, imports then resolve
    nowhere).

    >>> path_of("file:///tmp/a%20b.wf")
    '/tmp/a b.wf'
    """
    return (to_fs_path(uri) or uri) if uri.startswith("file:") else uri


def to_lsp(d: Diagnostic, lines: Lines, uri: str) -> lsp.Diagnostic:
    """One checker diagnostic as an LSP diagnostic: its span, severity, code, the ``why`` and
    ``fix:`` lines under the message, related locations (e.g. the first declaration)."""
    message = d.message
    if d.span is None and d.where and not d.where.endswith(".wf"):
        message = f"{d.where}: {message}"
    for label, text in (("why", d.why), ("fix", d.hint)):
        if text:
            message += f"\n{label}: {text}"
    related = [lsp.DiagnosticRelatedInformation(location=lsp.Location(uri=uri, range=lines.span_range(s)), message=what)
               for s, what in d.related] or None
    return lsp.Diagnostic(range=lines.span_range(d.span), message=message, source=SOURCE, code=d.code,
                          severity=lsp.DiagnosticSeverity.Error if d.severity == "error"
                          else lsp.DiagnosticSeverity.Warning, related_information=related)


def make_server() -> LanguageServer:
    """A new server with every feature registered (``start_io()`` runs it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("srpo-graph")
    except PackageNotFoundError:  # pragma: no cover - a source checkout without an install
        ver = "0"
    ls = LanguageServer("srpo-graph", ver, text_document_sync_kind=lsp.TextDocumentSyncKind.Full)
    st = WfServer(ls)
    threading.Thread(target=warm_analysis, args=(st.warmed,), daemon=True).start()

    async def at(params, exact: bool = False) -> tuple[Analysis, int, int, Lines] | None:
        """(analysis, line, column, lines) at the request's position: the features' arguments."""
        got = await st.current(params.text_document.uri, exact)
        if got is None:
            return None
        analysis, lines = got
        line0, char0 = lines.from_lsp(params.position)
        return analysis, line0 + 1, char0 + 1, lines

    @ls.feature(lsp.INITIALIZE)
    def initialize(params: lsp.InitializeParams) -> None:
        st.settings = st.settings.updated(params.initialization_options)
        if st.settings.tokens:  # the token rule's imports (transformers) load while the editor starts
            threading.Thread(target=warm_tokens, args=(st.warmed,), daemon=True).start()

    @ls.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(params: lsp.DidChangeConfigurationParams) -> None:
        st.settings = st.settings.updated(params.settings)
        for uri in list(st.docs):
            st.schedule(uri, 0)

    @ls.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: lsp.DidOpenTextDocumentParams) -> None:
        st.schedule(params.text_document.uri, 0)

    @ls.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: lsp.DidChangeTextDocumentParams) -> None:
        st.schedule(params.text_document.uri, st.settings.debounce)

    @ls.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: lsp.DidSaveTextDocumentParams) -> None:
        st.schedule(params.text_document.uri, 0)  # an imported .py may have changed too

    @ls.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: lsp.DidCloseTextDocumentParams) -> None:
        state = st.docs.pop(params.text_document.uri, None)
        if state is not None and state.pending is not None:
            state.pending.cancel()
        ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))

    @ls.feature(lsp.TEXT_DOCUMENT_HOVER)
    async def hover(params: lsp.HoverParams):
        got = await at(params)
        return features.hover(*got) if got else None

    @ls.feature(lsp.TEXT_DOCUMENT_DEFINITION)
    async def definition(params: lsp.DefinitionParams):
        got = await at(params)
        return features.definition(*got) if got else None

    @ls.feature(lsp.TEXT_DOCUMENT_REFERENCES)
    async def references(params: lsp.ReferenceParams):
        got = await at(params)
        return features.references(*got, params.context.include_declaration) if got else None

    @ls.feature(lsp.TEXT_DOCUMENT_PREPARE_RENAME)
    async def prepare_rename(params: lsp.PrepareRenameParams):
        got = await at(params, exact=True)
        return features.prepare_rename(*got) if got else None

    @ls.feature(lsp.TEXT_DOCUMENT_RENAME, lsp.RenameOptions(prepare_provider=True))
    async def rename(params: lsp.RenameParams):
        got = await at(params, exact=True)
        if got is None:
            raise Refused(message="the file is still being analyzed: try the rename again")
        a, line, col, lines = got
        try:
            return features.rename(a, line, col, params.new_name, lines)
        except features.RenameError as exc:  # answered as an error the editor shows; not a server fault
            raise Refused(message=str(exc)) from None

    @ls.feature(lsp.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    async def document_symbol(params: lsp.DocumentSymbolParams):
        got = await st.current(params.text_document.uri)
        return features.document_symbols(*got) if got else None

    @ls.feature(lsp.TEXT_DOCUMENT_FORMATTING)
    async def formatting(params: lsp.DocumentFormattingParams):
        got = await st.current(params.text_document.uri, exact=True)  # edits of another text would corrupt it
        return features.formatting(*got) if got else None

    @ls.feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=[".", "{", ":", " ", ","]))
    async def complete(params: lsp.CompletionParams):
        got = await at(params)
        if got is None or got[0].too_large:
            return lsp.CompletionList(is_incomplete=False, items=[])
        a, line, col, lines = got
        state = st.docs.get(params.text_document.uri)
        ix = a.index if a.index is not None else (state.last_parsed.index if state and state.last_parsed else None)
        base = Path(a.path).resolve().parent if not a.path.startswith("<") else None
        items = completion.complete(a.text, lines.offset(line - 1, col - 1), ix, base)
        return lsp.CompletionList(is_incomplete=False, items=items)

    @ls.command(GRAPH_COMMAND)
    async def graph_svg(uri: str) -> dict:
        """The routing graph of an open document as SVG (``viz``), or the reason there is none."""
        got = await st.current(uri)
        a = got[0] if got else None
        if a is None or a.workflow is None:
            first = next((d for d in a.diagnostics if d.severity == "error"), None) if a else None
            return {"svg": None, "error": "the file has errors" + (f": {first.headline()}" if first else "")
                    if a else "the file is still being analyzed"}
        from srpo_graph.viz import to_svg

        return {"svg": to_svg(a.workflow), "error": None}

    return ls


def serve() -> int:
    """Run the server on stdin/stdout until the client says exit (or closes stdin); returns the
    exit status (:func:`~srpo_graph.lsp.framing.serve_stdio`)."""
    return serve_stdio(make_server())
