"""The symbol index of one parsed ``.wf`` file: every declaration and every use of a name.

Stage: lsp. Consumes an :class:`~srpo_graph.lang.ast.Module` (the parser's tree; no rule of the
checker is repeated here: a name that resolves to nothing is simply not linked, the checker
reports it) and produces :class:`Occurrence` items, each with the exact span of the name, for
definition, references, rename, hover and the outline. A reference inside a prompt
(``{searcher.query}``) or an argument (``task.answer``) gets one occurrence per dotted part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from srpo_graph.errors import Span
from srpo_graph.lang import ast
from srpo_graph.lsp.positions import Lines, contains

# What an occurrence names. Agents and transitions share one namespace (node names); tools are
# the state variables a `tool NAME = ...` declares; a `function` is `alias.function`.
KINDS = ("workflow", "module", "field", "policy", "agent", "transition", "tool", "function", "record field")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Occurrence:
    """One written name: a declaration (``is_decl``) or a use."""

    kind: str  # one of KINDS
    name: str  # the declared name; `alias.function` for a function; `agent.field` for a record field
    span: Span  # the name alone
    is_decl: bool = False
    role: str = ""  # where a use stands: consume, activate, start, template, policy, call, ...
    owner: str = ""  # the agent or transition it is written in


@dataclass
class Index:
    """Every occurrence of a module, in source order, with lookups."""

    module: ast.Module
    items: list[Occurrence] = field(default_factory=list)

    def decl(self, kind: str, name: str) -> Occurrence | None:
        return next((o for o in self.items if o.is_decl and o.kind == kind and o.name == name), None)

    def names(self, kind: str) -> list[str]:
        """Declared names of a kind, first declaration first, each once."""
        out: list[str] = []
        for o in self.items:
            if o.is_decl and o.kind == kind and o.name not in out:
                out.append(o.name)
        return out

    def at(self, line: int, col: int) -> Occurrence | None:
        """The occurrence under a 1-based (line, column), the innermost one."""
        hits = [o for o in self.items if contains(o.span, line, col)]
        return min(hits, key=lambda o: (o.span.end_line - o.span.line, o.span.end_col - o.span.col)) if hits else None

    def uses(self, kind: str, name: str) -> list[Occurrence]:
        """The declaration(s) and every use of one symbol, in source order."""
        return [o for o in self.items if o.kind == kind and o.name == name]

    def node_decl(self, name: str) -> ast.AgentDecl | ast.TransitionDecl | None:
        return next((it for it in self.module.items
                     if isinstance(it, (ast.AgentDecl, ast.TransitionDecl)) and it.name.value == name), None)


def build_index(module: ast.Module) -> Index:
    """The :class:`Index` of a parsed module.

    >>> from srpo_graph.lang.parser import parse
    >>> ix = build_index(parse('workflow w import std task { q: text } policy p = "tiny"'
    ...                        ' agent a { policy: p prompt: "{task.q}" } start: a'))
    >>> [(o.kind, o.name, o.is_decl) for o in ix.uses("agent", "a")]
    [('agent', 'a', True), ('agent', 'a', False)]
    >>> [(o.kind, o.name, o.span.col) for o in ix.items if o.role == "template"]
    [('field', 'q', 93)]
    """
    return _Indexer(module).run()


class _Indexer:
    def __init__(self, m: ast.Module):
        self.m = m
        self.lines = Lines(m.source.replace("\r\n", "\n").replace("\r", "\n"))
        self.out: list[Occurrence] = []
        items = m.items
        self.agents = {it.name.value for it in items if isinstance(it, ast.AgentDecl)}
        self.transitions = {it.name.value for it in items if isinstance(it, ast.TransitionDecl)}
        self.tools = {i.name.value for it in items if isinstance(it, ast.TransitionDecl)
                      for i in it.items if isinstance(i, ast.ToolItem)}
        self.outputs = {it.name.value: next((i.type for i in it.items if isinstance(i, ast.OutputItem)), None)
                        for it in items if isinstance(it, ast.AgentDecl)}

    def add(self, kind: str, name: ast.Name | str, span: Span | None = None, decl: bool = False, role: str = "",
            owner: str = "") -> None:
        value = name if isinstance(name, str) else name.value
        where = span if span is not None else name.span  # type: ignore[union-attr]
        self.out.append(Occurrence(kind, value, where, decl, role, owner))

    def node_kind(self, name: str) -> str | None:
        return "agent" if name in self.agents else "transition" if name in self.transitions else None

    def run(self) -> Index:
        m = self.m
        self.add("workflow", m.header.name, decl=True)
        for it in m.items:
            if isinstance(it, ast.ImportStmt):
                name = it.alias or (it.module[0] if len(it.module) == 1 else None)
                if name is not None:
                    self.add("module", name, decl=True)
            elif isinstance(it, ast.TaskBlock):
                for f in it.fields:
                    self.add("field", f.name, decl=True)
            elif isinstance(it, ast.PolicyDecl):
                self.add("policy", it.name, decl=True)
                if isinstance(it.model, ast.LoraExpr):
                    s = it.model.base.span  # the base policy's name, inside its quotes
                    if s.line == s.end_line:
                        inner = Span(path=s.path, line=s.line, col=s.col + 1, end_line=s.line, end_col=s.end_col - 1)
                        self.add("policy", it.model.base.value, inner, role="lora base", owner=it.name.value)
            elif isinstance(it, ast.AgentDecl):
                self.agent(it)
            elif isinstance(it, ast.TransitionDecl):
                self.transition(it)
            elif isinstance(it, ast.StartStmt):
                for n in it.agents:
                    self.node_use(n, "start", "")
            elif isinstance(it, ast.RewardStmt):
                self.call(it.call, "reward", "")
        self.routed_labels()
        self.out.sort(key=lambda o: (o.span.line, o.span.col))
        return Index(m, self.out)

    def node_use(self, n: ast.Name, role: str, owner: str) -> None:
        kind = self.node_kind(n.value)
        if kind is not None:
            self.add(kind, n, role=role, owner=owner)

    def agent(self, a: ast.AgentDecl) -> None:
        owner = a.name.value
        self.add("agent", a.name, decl=True)
        for i in a.items:
            if isinstance(i, ast.PolicyItem):
                self.add("policy", i.policy, role="policy", owner=owner)
            elif isinstance(i, ast.PromptItem):
                for p in i.template.parts:
                    if isinstance(p, ast.Ref):
                        self.ref(p, "template", owner)
            elif isinstance(i, ast.OutputItem):
                self.record_fields(owner, i.type)
                if i.via is not None:
                    self.call(i.via, "extractor", owner)

    def record_fields(self, agent: str, t: ast.TypeExpr) -> None:
        if isinstance(t, ast.RecordTypeExpr):
            for f in t.fields:
                self.add("record field", f"{agent}.{f.name.value}", f.name.span, decl=True, owner=agent)

    def transition(self, t: ast.TransitionDecl) -> None:
        owner = t.name.value
        self.add("transition", t.name, decl=True)
        for i in t.items:
            if isinstance(i, ast.ConsumeItem):
                for n in i.agents:
                    self.node_use(n, "consume", owner)
            elif isinstance(i, ast.ToolItem):
                self.add("tool", i.name, decl=True, owner=owner)
                self.call(i.call, "tool", owner)
            elif isinstance(i, ast.RewardItem):
                self.call(i.call, "reward", owner)
            elif isinstance(i, ast.ActivateItem):
                act = i.activation
                if isinstance(act, ast.ActivateAgents):
                    for n in act.agents:
                        self.node_use(n, "activate", owner)
                elif isinstance(act, ast.ActivateRoute):
                    self.ref(act.on, "route", owner)
                    for case in act.cases or ():
                        for n in case.targets:
                            self.node_use(n, "activate", owner)

    def routed_labels(self) -> None:
        """`activate: route r` without cases: the labels of r's `choice[...]` name the agents."""
        for it in self.m.items:
            if not isinstance(it, ast.TransitionDecl):
                continue
            for i in it.items:
                if isinstance(i, ast.ActivateItem) and isinstance(i.activation, ast.ActivateRoute) \
                        and i.activation.cases is None:
                    t = self.outputs.get(i.activation.on.path[0])
                    if isinstance(t, ast.ChoiceTypeExpr):
                        for label in t.options:
                            self.node_use(label, "route label", i.activation.on.path[0])

    def call(self, c: ast.Call, role: str, owner: str) -> None:
        self.add("module", c.module, role=role, owner=owner)
        self.add("function", f"{c.module.value}.{c.function.value}", c.function.span, role=role, owner=owner)
        for a in c.args:
            if isinstance(a.value, ast.Ref):
                self.ref(a.value, "argument", owner)

    def ref(self, r: ast.Ref, role: str, owner: str) -> None:
        """One occurrence per part of ``task.field``, ``agent``, ``agent.field``, ``tool``."""
        parts = self.part_spans(r)
        if len(parts) != len(r.path):
            return
        head = r.path[0]
        if head == "task":
            if len(parts) > 1:
                self.add("field", r.path[1], parts[1], role=role, owner=owner)
            return
        kind = "agent" if head in self.agents else "tool" if head in self.tools else None
        if kind is None:
            return
        self.add(kind, head, parts[0], role=role, owner=owner)
        if kind == "agent" and len(parts) > 1:
            self.add("record field", f"{head}.{r.path[1]}", parts[1], role=role, owner=owner)

    def part_spans(self, r: ast.Ref) -> list[Span]:
        s = r.span
        start, end = self.lines.offset_of(s.line, s.col), self.lines.offset_of(s.end_line, s.end_col)
        out = []
        for m in _NAME.finditer(self.lines.text, start, end):
            line, col = self.lines.line_col(m.start())
            out.append(Span(path=s.path, line=line, col=col, end_line=line, end_col=col + len(m.group())))
        return out
