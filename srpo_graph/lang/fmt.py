"""The canonical ``.wf`` formatter: ``srpo-graph fmt``.

Stage: lang. Consumes source text (parsed to an AST), produces text in one canonical layout:
two-space indentation, one item per line, a blank line between declarations, items kept in
source order and comments kept (own-line comments above the item that follows them, end-of-line
comments after the line they ended). ``format_source`` is idempotent and the result parses to
the same workflow. Knows nothing of names or types.
"""

from __future__ import annotations

from typing import Any, Callable

from srpo_graph.lang import ast
from srpo_graph.lang.parser import parse
from srpo_graph.lang.templates import encode_string, encode_template

INDENT = "  "


def format_source(text: str, path: str = "<string>") -> str:
    """Format ``.wf`` text canonically (comments kept, blocks indented, one item a line).

    Args:
        text: the source.
        path: the file name used in error messages.

    Returns:
        The canonical text; ``format_source(format_source(x)) == format_source(x)``.

    Raises:
        WorkflowSyntaxError: the text does not parse.

    >>> print(format_source('workflow w   policy p="tiny"  start:a,b'), end="")
    workflow w
    <BLANKLINE>
    policy p = "tiny"
    <BLANKLINE>
    start: a, b
    """
    return format_module(parse(text, path))


def format_module(m: ast.Module) -> str:
    """Format a parsed module (see :func:`format_source`).

    Args:
        m: the module, with its comments.

    Returns:
        The canonical text.

    >>> from srpo_graph.lang.parser import parse
    >>> format_module(parse("workflow w # hi"))
    'workflow w  # hi\\n'
    """
    return _Emitter(m).run()


# --------------------------------------------------------------------------- pieces
#
# One rule per AST class, in tables keyed by the class: a node no table knows (a construct added
# to the grammar and the AST but not here) raises instead of being printed as something else.
# tests/lang/test_properties_lang.py checks that every member of the AST's unions has a rule.


def _rule(table: dict[type, Callable[[Any], str]], node: Any, what: str) -> str:
    rule = table.get(type(node))
    if rule is None:
        line = getattr(getattr(node, "span", None), "line", "?")
        raise TypeError(f"fmt: no rule prints the {what} {type(node).__name__} (line {line}); add one to lang/fmt.py")
    return rule(node)


def fmt_type(t: ast.TypeExpr) -> str:
    return _rule(TYPES, t, "type")


def fmt_value(v: Any) -> str:
    return _rule(VALUES, v, "value")


def fmt_activation(a: ast.Activation) -> str:
    return _rule(ACTIVATIONS, a, "activation")


def fmt_call(c: ast.Call) -> str:
    head = f"{c.module.value}.{c.function.value}"
    if not c.has_parens:
        return head
    args = ", ".join((f"{a.name.value}=" if a.name else "") + fmt_value(a.value) for a in c.args)
    return f"{head}({args})"


def _names(ns: Any) -> str:
    return ", ".join(n.value for n in ns)


def _route(a: ast.ActivateRoute) -> str:
    head = "route " + fmt_value(a.on)
    if a.cases is None:
        return head
    cases = ", ".join(f"{c.label.value} -> {_names(c.targets)}" for c in a.cases)
    return head + " { " + cases + " }" if a.cases else head + " { }"


TYPES: dict[type, Callable[[Any], str]] = {
    ast.SimpleType: lambda t: t.name,
    ast.ChoiceTypeExpr: lambda t: f"{'choices' if t.multi else 'choice'}[{', '.join(o.value for o in t.options)}]",
    ast.ListTypeExpr: lambda t: f"list[{fmt_type(t.item)}]",
    ast.RecordTypeExpr: lambda t: "{" + ", ".join(f"{f.name.value}: {fmt_type(f.type)}" for f in t.fields) + "}",
}
VALUES: dict[type, Callable[[Any], str]] = {
    ast.Ref: lambda v: ".".join(v.path) + ("?" if v.optional else ""),
    ast.StringLit: lambda v: encode_string(v.value),
    ast.BoolLit: lambda v: "true" if v.value else "false",
    ast.NumberLit: lambda v: repr(v.value),
    ast.ListLit: lambda v: "[" + ", ".join(fmt_value(x) for x in v.items) + "]",
}
ACTIVATIONS: dict[type, Callable[[Any], str]] = {
    ast.ActivateEnd: lambda a: "end",
    ast.ActivateAgents: lambda a: _names(a.agents),
    ast.ActivateRoute: _route,
}


def fmt_policy_model(m: ast.StringLit | ast.LoraExpr | ast.OpenaiExpr) -> str:
    """``"tiny"``, ``lora("base", r=16, alpha=32, targets=[q_proj, v_proj])`` or ``openai("url", model="m")``,
    as written."""
    if isinstance(m, ast.StringLit):
        return encode_string(m.value)
    if isinstance(m, ast.OpenaiExpr):
        parts = [encode_string(m.url.value)] + [
            f"{a.key.value}="
            f"{fmt_value(a.value) if isinstance(a.value, ast.NumberLit) else encode_string(a.value.value)}"
            for a in m.args
        ]
        return f"openai({', '.join(parts)})"
    args = [encode_string(m.base.value)]
    for a in m.args:
        v = a.value
        shown = fmt_value(v) if isinstance(v, ast.NumberLit) else "[" + ", ".join(n.value for n in v.names) + "]"
        args.append(f"{a.key.value}={shown}")
    return f"lora({', '.join(args)})"


def _sample(i: ast.SampleItem) -> str:
    entries = ", ".join(f"{e.key.value}: {fmt_value(e.value)}" for e in i.entries)
    return f"sample {{ {entries} }}" if entries else "sample { }"


AGENT_ITEMS: dict[type, Callable[[Any], str]] = {
    ast.PolicyItem: lambda i: f"policy: {i.policy.value}",
    ast.PromptItem: lambda i: f"prompt: {encode_template(i.template)}",
    ast.SampleItem: _sample,
    ast.OutputItem: lambda i: f"output: {fmt_type(i.type)}" + (f" via {fmt_call(i.via)}" if i.via else ""),
    ast.UnconsumedItem: lambda i: f"unconsumed: {i.value.value}",
    ast.SystemItem: lambda i: f"system: {encode_template(i.template)}",
    ast.MemoryItem: lambda i: f"memory: {i.value.value}",
    ast.ThinkItem: lambda i: f"think: {i.value.value}",
}
TRANSITION_ITEMS: dict[type, Callable[[Any], str]] = {
    ast.ConsumeItem: lambda i: f"consume: {_names(i.agents)}",
    ast.ToolItem: lambda i: f"tool {i.name.value} = {fmt_call(i.call)}",
    ast.RewardItem: lambda i: f"reward: {fmt_call(i.call)}",
    ast.ActivateItem: lambda i: f"activate: {fmt_activation(i.activation)}",
    ast.MaxRoundsItem: lambda i: f"max_rounds: {i.value.value}",
}
TOP_LINES: dict[type, Callable[[Any], str]] = {  # one-line top-level items (the three blocks: _Emitter.run)
    ast.ImportStmt: lambda i: f"import {i.dotted}" + (f" as {i.alias.value}" if i.alias else ""),
    ast.PolicyDecl: lambda i: f"policy {i.name.value} = {fmt_policy_model(i.model)}" + (" frozen" if i.frozen else ""),
    ast.StartStmt: lambda i: f"start: {_names(i.agents)}",
    ast.RewardStmt: lambda i: f"reward: {fmt_call(i.call)}",
    ast.MaxStepsStmt: lambda i: f"max_steps: {i.value.value}",
}


def _agent_item(i: Any) -> str:
    return _rule(AGENT_ITEMS, i, "agent item")


def _transition_item(i: Any) -> str:
    return _rule(TRANSITION_ITEMS, i, "transition item")


# Items of one group follow each other without a blank line.
_GROUP = {
    ast.ImportStmt: "import",
    ast.PolicyDecl: "policy",
    ast.StartStmt: "tail",
    ast.RewardStmt: "tail",
    ast.MaxStepsStmt: "tail",
}


class _Emitter:
    def __init__(self, m: ast.Module):
        self.m = m
        self.out: list[str] = []
        self.comments = sorted(m.comments, key=lambda c: (c.span.line, c.span.col))
        self.k = 0  # next comment to place

    def own_line_comments(self, before_line: int, indent: str) -> None:
        while self.k < len(self.comments) and self.comments[self.k].span.line < before_line:
            self.out.append(indent + self.comments[self.k].text)
            self.k += 1

    def trailing_comment(self, line: int) -> None:
        if self.k < len(self.comments) and self.comments[self.k].span.line == line and self.out:
            self.out[-1] += "  " + self.comments[self.k].text
            self.k += 1

    def unit(self, text: str, span, indent: str) -> None:
        self.own_line_comments(span.line, indent)
        self.out.append(indent + text)
        self.trailing_comment(span.end_line)

    def block(self, head: str, span, items, render, indent: str = "") -> None:
        self.own_line_comments(span.line, indent)
        self.out.append(f"{indent}{head} {{")
        self.trailing_comment(span.line)
        for it in items:
            self.unit(render(it), it.span, indent + INDENT)
        self.own_line_comments(span.end_line, indent + INDENT)
        self.out.append(indent + "}")
        self.trailing_comment(span.end_line)

    def run(self) -> str:
        h = self.m.header
        self.unit(
            f"workflow {h.name.value}" + (f" {encode_string(h.description.value)}" if h.description else ""), h.span, ""
        )
        prev_group = None
        for it in self.m.items:
            group = _GROUP.get(type(it))
            if group is None or group != prev_group:
                self.out.append("")
            prev_group = group
            if isinstance(it, ast.TaskBlock):
                self.block("task", it.span, it.fields, lambda f: f"{f.name.value}: {fmt_type(f.type)}")
            elif isinstance(it, ast.AgentDecl):
                self.block(f"agent {it.name.value}", it.span, it.items, _agent_item)
            elif isinstance(it, ast.TransitionDecl):
                self.block(f"transition {it.name.value}", it.span, it.items, _transition_item)
            else:
                self.unit(_rule(TOP_LINES, it, "item"), it.span, "")
        rest = [c.text for c in self.comments[self.k :]]
        if rest:
            self.out.append("")
            self.out.extend(rest)
        return "\n".join(self.out) + "\n"
