"""Hover, definition, references, rename, outline and formatting of one analyzed document.

Stage: lsp. Each function takes an :class:`~srpo_graph.lsp.document.Analysis`, a cursor as a
1-based (line, column) and the document's :class:`~srpo_graph.lsp.positions.Lines`, and returns
``lsprotocol`` values (the server only converts the cursor and sends the answer). What a name
means comes from the parser's tree (:mod:`.symbols`) and, when the file checks, from the
checked ``Workflow`` (the proven active-set sizes, default extractors); ``std`` functions are
described by :func:`srpo_graph.lang.stdref.std_entry`, the source of ``docs/std.md``;
formatting is ``srpo-graph fmt`` (:func:`srpo_graph.lang.fmt.format_source`).
"""

from __future__ import annotations

import re
from pathlib import Path

from lsprotocol import types as lsp
from pygls.uris import from_fs_path

from srpo_graph import std
from srpo_graph.errors import Span, WorkflowSyntaxError
from srpo_graph.lang import ast
from srpo_graph.lang.checker import RESERVED
from srpo_graph.lang.fmt import fmt_activation, fmt_call, fmt_policy_model, fmt_type, format_source
from srpo_graph.lang.stdref import std_entry
from srpo_graph.lsp.document import Analysis
from srpo_graph.lsp.positions import Lines
from srpo_graph.lsp.pyfiles import functions, module_file
from srpo_graph.lsp.symbols import Index, Occurrence
from srpo_graph.workflow import type_str

RENAMEABLE = ("agent", "transition", "policy", "tool", "field")
# names that live in one namespace: a node (agent, transition) and a tool variable may not share a name
_NAMESPACE = {"agent": "node", "transition": "node", "tool": "node", "policy": "policy", "field": "field"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def uri_of(path: str | Path) -> str:
    return from_fs_path(str(Path(path).resolve())) or Path(path).resolve().as_uri()


def _md(lines: list[str]) -> lsp.Hover:
    return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value="\n".join(lines)))


def _base_dir(a: Analysis) -> Path | None:
    return Path(a.path).resolve().parent if not a.path.startswith("<") else None


def import_of(ix: Index, alias: str) -> ast.ImportStmt | None:
    return next((it for it in ix.module.items if isinstance(it, ast.ImportStmt)
                 and (it.alias.value if it.alias else it.module[-1].value) == alias), None)


# --------------------------------------------------------------------------- hover


def hover(a: Analysis, line: int, col: int, lines: Lines) -> lsp.Hover | None:
    """What the name under the cursor is (see the module docstring)."""
    ix = a.index
    occ = ix.at(line, col) if ix is not None else None
    if ix is None or occ is None:
        return None
    describe = {"agent": _hover_agent, "transition": _hover_transition, "policy": _hover_policy,
                "field": _hover_field, "tool": _hover_tool, "function": _hover_function,
                "module": _hover_module, "record field": _hover_record_field, "workflow": _hover_workflow}
    out = describe[occ.kind](a, ix, occ)
    if out is None:
        return None
    out.range = lines.span_range(occ.span)
    return out


def _consumers(ix: Index, agent: str) -> list[str]:
    return sorted({o.owner for o in ix.uses("agent", agent) if o.role == "consume"})


def _activators(ix: Index, agent: str) -> list[str]:
    out = []
    for o in ix.uses("agent", agent):
        if o.role == "start":
            out.append("`start`")
        elif o.role in ("activate", "route label"):
            owner = o.owner if o.role == "activate" else next(
                (u.owner for u in ix.items if u.role == "route" and u.name == o.owner), o.owner)
            out.append(f"`{owner}`")
    return list(dict.fromkeys(out))


def _hover_agent(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    decl = ix.node_decl(occ.name)
    if not isinstance(decl, ast.AgentDecl):
        return None
    items = {type(i): i for i in reversed(decl.items)}
    pol = items.get(ast.PolicyItem)
    out = [f"**agent** `{occ.name}`", ""]
    if isinstance(pol, ast.PolicyItem):
        model = next((fmt_policy_model(p.model) for p in ix.module.items
                      if isinstance(p, ast.PolicyDecl) and p.name.value == pol.policy.value), "?")
        out.append(f"- policy: `{pol.policy.value}` = {model}")
    checked = next((x for x in a.workflow.agents if x.name == occ.name), None) if a.workflow else None
    output = items.get(ast.OutputItem)
    if checked is not None:
        out.append(f"- output: `{type_str(checked.output)}` via `{checked.extractor.qualname}`")
    elif isinstance(output, ast.OutputItem):
        via = f" via `{fmt_call(output.via)}`" if output.via else " (the type's default extractor)"
        out.append(f"- output: `{fmt_type(output.type)}`{via}")
    else:
        out.append("- output: `text` via `std.text` (the default)")
    consumers = _consumers(ix, occ.name)
    out.append("- consumed by: " + (", ".join(f"`{c}`" for c in consumers) or "no transition"))
    out.append("- activated by: " + (", ".join(_activators(ix, occ.name)) or "nothing"))
    return _md(out)


def _hover_transition(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    decl = ix.node_decl(occ.name)
    if not isinstance(decl, ast.TransitionDecl):
        return None
    out = [f"**transition** `{occ.name}`", ""]
    consume = next((i for i in decl.items if isinstance(i, ast.ConsumeItem)), None)
    if consume is not None:
        names = ", ".join(f"`{n.value}`" for n in consume.agents)
        out.append(f"- consumes: {names} (its active set: one action of up to {len(consume.agents)} outputs)")
    checked = next((t for t in a.workflow.transitions if t.name == occ.name), None) if a.workflow else None
    if checked is not None:
        out.append("- active-set sizes (proved by `check`): " + ", ".join(str(k) for k in checked.set_sizes))
    else:
        out.append("- active-set sizes: known once the file checks without errors")
    for i in decl.items:
        if isinstance(i, ast.ToolItem):
            out.append(f"- tool `{i.name.value}` = `{fmt_call(i.call)}`")
        elif isinstance(i, ast.RewardItem):
            out.append(f"- reward: `{fmt_call(i.call)}`")
        elif isinstance(i, ast.ActivateItem):
            out.append(f"- activate: `{fmt_activation(i.activation)}`")
        elif isinstance(i, ast.MaxRoundsItem):
            out.append(f"- max_rounds: {i.value.value}")
    return _md(out)


def _hover_policy(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    decl = next((p for p in ix.module.items if isinstance(p, ast.PolicyDecl) and p.name.value == occ.name), None)
    if decl is None:
        return None
    users = sorted({o.owner for o in ix.uses("policy", occ.name) if o.role == "policy"})
    return _md([f"**policy** `{occ.name}` = {fmt_policy_model(decl.model)}", "",
                "- agents: " + (", ".join(f"`{u}`" for u in users) or "none")])


def _hover_field(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    fields = [f for it in ix.module.items if isinstance(it, ast.TaskBlock) for f in it.fields]
    f = next((f for f in fields if f.name.value == occ.name), None)
    return _md([f"**task field** `task.{occ.name}`: `{fmt_type(f.type)}`"]) if f else None


def _hover_record_field(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    agent, name = occ.name.split(".", 1)
    decl = ix.node_decl(agent)
    out = next((i for i in getattr(decl, "items", ()) if isinstance(i, ast.OutputItem)), None)
    if out is None or not isinstance(out.type, ast.RecordTypeExpr):
        return None
    f = next((f for f in out.type.fields if f.name.value == name), None)
    return _md([f"**output field** `{occ.name}`: `{fmt_type(f.type)}`"]) if f else None


def _hover_tool(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    for it in ix.module.items:
        if isinstance(it, ast.TransitionDecl):
            for i in it.items:
                if isinstance(i, ast.ToolItem) and i.name.value == occ.name:
                    t = a.result.workflow if a.result else None
                    tt = next((tc.type for tr in t.transitions for tc in tr.tools if tc.name == occ.name), None) \
                        if t else None
                    if occ.name in a.tool_types:  # the check with imports knows the function's annotation
                        typed = f": `{a.tool_types[occ.name]}`"
                    elif a.result is not None and occ.name in a.result.untyped_tools:
                        typed = (" (type unknown: the editor checks without importing the module; setting "
                                 "`imports`)")
                    else:
                        typed = f": `{type_str(tt)}`" if tt is not None else ""
                    return _md([f"**tool result** `{occ.name}`{typed}", "",
                                f"- `{fmt_call(i.call)}`, called by transition `{it.name.value}`"])
    return None


def _hover_function(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    alias, name = occ.name.split(".", 1)
    imp = import_of(ix, alias)
    if imp is None:
        return None
    if imp.dotted == "std":
        fn = getattr(std, name, None)
        if fn is None or not callable(fn) or name.startswith("_"):
            return None
        kind, sig, doc = std_entry(name, fn)
        return _md([f"**std.{name}** ({kind})", "", f"```python\n{sig}\n```", "", doc])
    path = module_file(imp.dotted, _base_dir(a))
    f = functions(path).get(name) if path is not None else None
    if path is None or f is None:
        return None
    return _md([f"**{alias}.{name}** (`{path.name}`:{f.line})", "", f"```python\n{f.signature}\n```", "", f.doc])


def _hover_module(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    imp = import_of(ix, occ.name)
    if imp is None:
        return None
    path = module_file(imp.dotted, _base_dir(a))
    where = f"`{path}`" if path else "not found next to the file or on sys.path"
    return _md([f"**import** `{imp.dotted}`" + (f" as `{occ.name}`" if imp.alias else ""), "", f"- file: {where}"])


def _hover_workflow(a: Analysis, ix: Index, occ: Occurrence) -> lsp.Hover | None:
    h = ix.module.header
    out = [f"**workflow** `{occ.name}`" + (f": {h.description.value}" if h.description else "")]
    if a.result is not None:
        w = a.result.workflow
        out += ["", f"- {len(w.agents)} agents, {len(w.transitions)} transitions, {len(w.policies)} policies",
                f"- at most {a.result.max_firings} transition firings per episode ({a.result.bound_reason})"]
    return _md(out)


# --------------------------------------------------------------------------- definition and references


def definition(a: Analysis, line: int, col: int, lines: Lines) -> list[lsp.Location]:
    ix = a.index
    occ = ix.at(line, col) if ix is not None else None
    if ix is None or occ is None:
        return []
    if occ.kind in ("function", "module"):
        alias = occ.name.split(".", 1)[0]
        imp = import_of(ix, alias)
        path = module_file(imp.dotted, _base_dir(a)) if imp is not None else None
        if path is None:
            return []
        if occ.kind == "module":
            return [lsp.Location(uri=uri_of(path), range=lsp.Range(start=lsp.Position(line=0, character=0),
                                                                    end=lsp.Position(line=0, character=0)))]
        f = functions(path).get(occ.name.split(".", 1)[1])
        if f is None:
            return []
        text = path.read_text(encoding="utf-8").split("\n")[f.line - 1]
        py = Lines(text)
        start = py.to_lsp(1, f.col)
        end = py.to_lsp(1, f.col + len(f.name))
        return [
            lsp.Location(
                uri=uri_of(path),
                range=lsp.Range(
                    start=lsp.Position(line=f.line - 1, character=start.character),
                    end=lsp.Position(line=f.line - 1, character=end.character),
                ),
            )
        ]
    decl = ix.decl(occ.kind, occ.name)
    return [lsp.Location(uri=uri_of(a.path), range=lines.span_range(decl.span))] if decl is not None else []


def references(a: Analysis, line: int, col: int, lines: Lines, include_declaration: bool) -> list[lsp.Location]:
    ix = a.index
    occ = ix.at(line, col) if ix is not None else None
    if ix is None or occ is None:
        return []
    return [
        lsp.Location(uri=uri_of(a.path), range=lines.span_range(o.span))
        for o in ix.uses(occ.kind, occ.name)
        if include_declaration or not o.is_decl
    ]


# --------------------------------------------------------------------------- rename


class RenameError(ValueError):
    """A rename that cannot be done (the server answers it as an error)."""


def prepare_rename(a: Analysis, line: int, col: int, lines: Lines) -> lsp.Range | None:
    ix = a.index
    occ = ix.at(line, col) if ix is not None else None
    if occ is None or occ.kind not in RENAMEABLE or ix is None or ix.decl(occ.kind, occ.name) is None:
        return None
    return lines.span_range(occ.span)


def rename(a: Analysis, line: int, col: int, new_name: str, lines: Lines) -> lsp.WorkspaceEdit | None:
    """Every occurrence of the agent, transition, policy, tool or task field under the cursor,
    renamed ``new_name``.

    Raises:
        RenameError: ``new_name`` is not a name, is reserved, or is taken in the same namespace.
    """
    ix = a.index
    occ = ix.at(line, col) if ix is not None else None
    if ix is None or occ is None or occ.kind not in RENAMEABLE or ix.decl(occ.kind, occ.name) is None:
        return None
    if not _IDENT.fullmatch(new_name):
        raise RenameError(f"'{new_name}' is not a name (letters, digits and _, not starting with a digit)")
    if new_name in RESERVED and occ.kind != "policy":
        raise RenameError(f"'{new_name}' is reserved")
    space = _NAMESPACE[occ.kind]
    taken = [k for k, s in _NAMESPACE.items() if s == space and new_name in ix.names(k)]
    if taken and new_name != occ.name:
        raise RenameError(f"'{new_name}' already names {'an' if taken[0][0] in 'aeiou' else 'a'} {taken[0]}")
    edits = [lsp.TextEdit(range=lines.span_range(o.span), new_text=new_name) for o in ix.uses(occ.kind, occ.name)]
    return lsp.WorkspaceEdit(changes={uri_of(a.path): edits})


# --------------------------------------------------------------------------- outline and formatting

_SYMBOL_KIND = {
    ast.ImportStmt: lsp.SymbolKind.Module,
    ast.PolicyDecl: lsp.SymbolKind.Class,
    ast.AgentDecl: lsp.SymbolKind.Function,
    ast.TransitionDecl: lsp.SymbolKind.Event,
    ast.TaskBlock: lsp.SymbolKind.Struct,
    ast.StartStmt: lsp.SymbolKind.Key,
    ast.RewardStmt: lsp.SymbolKind.Key,
    ast.MaxStepsStmt: lsp.SymbolKind.Constant,
}


def document_symbols(a: Analysis, lines: Lines) -> list[lsp.DocumentSymbol]:
    """The outline: imports, the task block (its fields), policies, agents (their output fields),
    transitions (their tools), start, reward and max_steps. On a syntax error, the items that parse
    (issue 39, item 5: the outline was empty)."""
    ix = a.index if a.index is not None else a.partial
    if ix is None:
        return []

    def sym(name: str, detail: str, kind: lsp.SymbolKind, span: Span, sel: Span, children=None):
        return lsp.DocumentSymbol(
            name=name,
            detail=detail,
            kind=kind,
            range=lines.span_range(span),
            selection_range=lines.span_range(sel),
            children=children or None,
        )

    out = []
    for it in ix.module.items:
        kind = _SYMBOL_KIND[type(it)]
        if isinstance(it, ast.ImportStmt):
            out.append(sym(it.dotted, "import", kind, it.span, it.module[0].span))
        elif isinstance(it, ast.TaskBlock):
            fields = [sym(f.name.value, fmt_type(f.type), lsp.SymbolKind.Field, f.span, f.name.span) for f in it.fields]
            out.append(sym("task", "task fields", kind, it.span, it.span, fields))
        elif isinstance(it, ast.PolicyDecl):
            out.append(sym(it.name.value, fmt_policy_model(it.model), kind, it.span, it.name.span))
        elif isinstance(it, ast.AgentDecl):
            outp = next((i for i in it.items if isinstance(i, ast.OutputItem)), None)
            kids = [
                sym(f.name.value, fmt_type(f.type), lsp.SymbolKind.Field, f.span, f.name.span)
                for f in (outp.type.fields if outp and isinstance(outp.type, ast.RecordTypeExpr) else ())
            ]
            out.append(
                sym(
                    it.name.value,
                    "agent: " + (fmt_type(outp.type) if outp else "text"),
                    kind,
                    it.span,
                    it.name.span,
                    kids,
                )
            )
        elif isinstance(it, ast.TransitionDecl):
            consume = next((i for i in it.items if isinstance(i, ast.ConsumeItem)), None)
            kids = [
                sym(i.name.value, fmt_call(i.call), lsp.SymbolKind.Variable, i.span, i.name.span)
                for i in it.items
                if isinstance(i, ast.ToolItem)
            ]
            detail = "transition: consumes " + (", ".join(n.value for n in consume.agents) if consume else "nothing")
            out.append(sym(it.name.value, detail, kind, it.span, it.name.span, kids))
        else:
            word = {ast.StartStmt: "start", ast.RewardStmt: "reward", ast.MaxStepsStmt: "max_steps"}[type(it)]
            out.append(sym(word, "", kind, it.span, it.span))
    return out


def formatting(a: Analysis, lines: Lines) -> list[lsp.TextEdit] | None:
    """``srpo-graph fmt`` as one edit of the whole text ([] when already formatted; None when the
    text does not parse)."""
    try:
        formatted = format_source(a.text, a.path)
    except WorkflowSyntaxError:
        return None
    if formatted == a.text:
        return []
    whole = lsp.Range(start=lsp.Position(line=0, character=0), end=lines.end())
    return [lsp.TextEdit(range=whole, new_text=formatted)]
