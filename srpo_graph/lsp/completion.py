"""Completion: what may be written at the cursor of a ``.wf`` document.

Stage: lsp. The text before the cursor says where it is (mid-edit text rarely parses, so the
names come from the last version of the document that parsed): inside a prompt's ``{...}`` hole
(agents, tools, ``task.FIELD``, an agent's record fields), after ``consume:`` / ``activate:`` /
``start:`` (agents), after ``policy:`` (policies), after ``output:`` (types), after an import's
alias and a dot (its functions: ``std``'s from :mod:`srpo_graph.std`, a user module's read from
its file without importing it), inside ``sample { }`` (the sampling keys the checker accepts,
:data:`srpo_graph.lang.agents.SAMPLING_KEYS`), and item keywords by block.
"""

from __future__ import annotations

import re
from pathlib import Path

from lsprotocol import types as lsp

from srpo_graph.lang import ast
from srpo_graph.lang.agents import SAMPLING_EXAMPLES, SAMPLING_KEYS
from srpo_graph.lang.fmt import fmt_type
from srpo_graph.lang.stdref import std_entry, std_functions
from srpo_graph.lsp.pyfiles import functions, module_file
from srpo_graph.lsp.symbols import Index

K = lsp.CompletionItemKind
TYPES = ("text", "int", "float", "bool", "choice[", "choices[", "list[", "{")
TOP_KEYWORDS = ("import", "task", "policy", "agent", "transition", "start:", "reward:", "max_steps:")
AGENT_KEYWORDS = ("policy:", "prompt:", "sample", "output:", "unconsumed:", "system:", "memory:", "think:")
TRANSITION_KEYWORDS = ("consume:", "tool", "reward:", "activate:", "max_rounds:")

# a string's opening and body, without backtracking (Note [Strings without backtracking], lang/parser.py)
_LONG = r'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*'
_SHORT = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*'
_STRINGS_COMMENTS = re.compile(_LONG + r'(?:"""|\Z)|' + _SHORT + r'(?:"|\Z)|#[^\n]*', re.S)
_BRACES = re.compile(_LONG + '"""|' + _SHORT + r'"|#[^\n]*|[{}]', re.S)


def _open_string(prefix: str) -> str | None:
    """The text of the string the cursor is in (after its opening quotes), or None; a comment the
    cursor is in counts as a string without holes ("#")."""
    last = None
    for m in _STRINGS_COMMENTS.finditer(prefix):
        last = m
    if last is None or last.end() != len(prefix):
        return None
    s = last.group()
    if s.startswith("#"):
        return "#"
    if s.startswith('"""'):
        return s[3:] if not (len(s) >= 6 and s.endswith('"""')) else None
    return s[1:] if not (len(s) >= 2 and s.endswith('"') and not s.endswith('\\"')) else None


def _block(prefix: str) -> str:
    """The keyword of the innermost unclosed ``{`` before the cursor: agent, transition, sample,
    task, route, output ({record}) or "" at the top level."""
    stack: list[int] = []
    for m in _BRACES.finditer(prefix):
        if m.group() == "{":
            stack.append(m.start())
        elif m.group() == "}" and stack:
            stack.pop()
    if not stack:
        return ""
    before = prefix[: stack[-1]].rstrip()
    head = re.search(r"(agent|transition)\s+[A-Za-z_]\w*$|(sample|task)$|route\s+[\w.?]+$|(output):[^{}]*$|([:,])\Z",
                     before)
    if head is None:
        return "?"
    if head.group(1):
        return head.group(1)
    if head.group(2):
        return head.group(2)
    if head.group(0).startswith("route"):
        return "route"
    return "type"


def _items(labels, kind, detail: str = "") -> list[lsp.CompletionItem]:
    return [lsp.CompletionItem(label=x, kind=kind, detail=detail or None) for x in labels]


def _agent_fields(ix: Index, agent: str) -> list[lsp.CompletionItem]:
    decl = ix.node_decl(agent)
    out = next((i for i in getattr(decl, "items", ()) if isinstance(i, ast.OutputItem)), None)
    if out is None or not isinstance(out.type, ast.RecordTypeExpr):
        return []
    return [lsp.CompletionItem(label=f.name.value, kind=K.Field, detail=fmt_type(f.type)) for f in out.type.fields]


def _task_fields(ix: Index) -> list[lsp.CompletionItem]:
    return [lsp.CompletionItem(label=f.name.value, kind=K.Field, detail=fmt_type(f.type))
            for it in ix.module.items if isinstance(it, ast.TaskBlock) for f in it.fields]


def _functions(ix: Index, alias: str, base_dir: Path | None) -> list[lsp.CompletionItem] | None:
    imp = next((it for it in ix.module.items if isinstance(it, ast.ImportStmt)
                and (it.alias.value if it.alias else it.module[-1].value) == alias), None)
    if imp is None:
        return None
    if imp.dotted == "std":
        out = []
        for name, fn in std_functions():
            kind, sig, doc = std_entry(name, fn)
            out.append(lsp.CompletionItem(label=name, kind=K.Function, detail=f"{kind}: {sig}",
                                          documentation=doc or None))
        return out
    path = module_file(imp.dotted, base_dir)
    fns = functions(path) if path is not None else {}
    return [lsp.CompletionItem(label=f.name, kind=K.Function, detail=f.signature, documentation=f.doc or None)
            for f in fns.values()]


def complete(text: str, offset: int, ix: Index | None, base_dir: Path | None) -> list[lsp.CompletionItem]:
    """The completion items at ``offset`` of ``text``, names from ``ix`` (the last parse).

    >>> from srpo_graph.lang.parser import parse
    >>> from srpo_graph.lsp.symbols import build_index
    >>> src = 'workflow w import std policy p = "tiny" agent solver { policy: p prompt: "x" } start: '
    >>> [i.label for i in complete(src, len(src), build_index(parse(src + "solver")), None)]
    ['solver']
    """
    prefix = text[:offset]
    agents = ix.names("agent") if ix else []
    tools = ix.names("tool") if ix else []
    string = _open_string(prefix)
    if string is not None:
        if string == "#":
            return []
        hole = re.search(r"(?<!\\)\{\s*([A-Za-z_][\w.]*)?\Z", string)
        if hole is None or ix is None:
            return []
        path = (hole.group(1) or "").split(".")
        if len(path) == 2 and path[0] == "task":
            return _task_fields(ix)
        if len(path) == 2 and path[0] in agents:
            return _agent_fields(ix, path[0])
        if len(path) > 1:
            return []
        return (_items(agents, K.Variable, "agent output") + _items(tools, K.Variable, "tool result")
                + _items(["task"], K.Module, "the task record"))
    dotted = re.search(r"([A-Za-z_]\w*)\.(\w*)\Z", prefix)
    if dotted is not None and ix is not None:
        head = dotted.group(1)
        if head == "task":
            return _task_fields(ix)
        fns = _functions(ix, head, base_dir)
        if fns is not None:
            return fns
        if head in agents:
            return _agent_fields(ix, head)
        return []
    block = _block(prefix)
    if ix is not None and re.search(r"(\breward\s*:|\bvia|\btool\s+\w+\s*=)\s*\w*\Z", prefix):
        return _items(ix.names("module"), K.Module, "imported module")  # then `alias.` lists its functions
    # the item the cursor is in: its keyword, then names (a list may go on after a comma and a newline)
    item = re.search(r"\b(consume|activate|start|policy|output|unconsumed|memory|think|max_rounds|max_steps)[ \t]*:"
                     r"[^:{}\"#\n]*(?:,\s*\n[^:{}\"#\n]*)*\Z", prefix)
    arrow = re.search(r"->\s*[\w\s,]*\Z", prefix) if block == "route" else None
    if arrow is not None:
        return _items(agents, K.Variable, "agent") + _items(["end"], K.Keyword)
    if block == "sample":
        if re.search(r"\w+\s*:\s*[^,\n}]*\Z", prefix):
            return []
        return [lsp.CompletionItem(label=k, kind=K.Property, detail=SAMPLING_EXAMPLES[k],
                                   insert_text=f"{k}: ") for k in SAMPLING_KEYS]
    if block in ("task", "type"):
        return _items(TYPES, K.TypeParameter, "type") if re.search(r":\s*\w*\Z", prefix) else []
    if item is not None:
        word = item.group(1)
        if word in ("consume", "start"):
            return _items(agents, K.Variable, "agent")
        if word == "activate":
            if re.search(r"route\s+\w*\Z", prefix):
                return _items(agents, K.Variable, "agent (its output is a choice)")
            return _items(agents, K.Variable, "agent") + _items(["end", "route"], K.Keyword)
        if word == "policy" and block == "agent":
            return _items(ix.names("policy") if ix else [], K.Class, "policy")
        if word == "output":
            return [] if re.search(r"\bvia\s", prefix[item.start():]) else _items(TYPES, K.TypeParameter, "type")
        if word == "unconsumed":
            return _items(["allow"], K.Keyword)
        if word in ("memory", "think"):  # a chat agent's options (lang/chat.py)
            return _items(["chat", "none"] if word == "memory" else ["keep", "strip"], K.Keyword)
        return []
    if re.search(r"(^|[\s{}])\w*\Z", prefix) is None:
        return []
    words = {"": TOP_KEYWORDS, "agent": AGENT_KEYWORDS, "transition": TRANSITION_KEYWORDS}.get(block, ())
    return _items(words, K.Keyword)
