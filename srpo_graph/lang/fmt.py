"""The canonical ``.wf`` formatter: ``srpo-graph fmt``.

Stage: lang. Consumes source text (parsed to an AST), produces text in one canonical layout:
two-space indentation, one item per line, a blank line between declarations, items kept in
source order and comments kept (own-line comments above the item that follows them, end-of-line
comments after the line they ended). ``format_source`` is idempotent and the result parses to
the same workflow. Knows nothing of names or types.
"""

from __future__ import annotations

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


def fmt_type(t: ast.TypeExpr) -> str:
    if isinstance(t, ast.SimpleType):
        return t.name
    if isinstance(t, ast.ChoiceTypeExpr):
        return f"{'choices' if t.multi else 'choice'}[{', '.join(o.value for o in t.options)}]"
    if isinstance(t, ast.ListTypeExpr):
        return f"list[{fmt_type(t.item)}]"
    return "{" + ", ".join(f"{f.name.value}: {fmt_type(f.type)}" for f in t.fields) + "}"


def fmt_value(v) -> str:
    if isinstance(v, ast.Ref):
        return ".".join(v.path) + ("?" if v.optional else "")
    if isinstance(v, ast.StringLit):
        return encode_string(v.value)
    if isinstance(v, ast.BoolLit):
        return "true" if v.value else "false"
    if isinstance(v, ast.NumberLit):
        return repr(v.value)
    return "[" + ", ".join(fmt_value(x) for x in v.items) + "]"


def fmt_call(c: ast.Call) -> str:
    head = f"{c.module.value}.{c.function.value}"
    if not c.has_parens:
        return head
    args = ", ".join((f"{a.name.value}=" if a.name else "") + fmt_value(a.value) for a in c.args)
    return f"{head}({args})"


def _names(ns) -> str:
    return ", ".join(n.value for n in ns)


def fmt_activation(a: ast.Activation) -> str:
    if isinstance(a, ast.ActivateEnd):
        return "end"
    if isinstance(a, ast.ActivateAgents):
        return _names(a.agents)
    head = "route " + fmt_value(a.on)
    if a.cases is None:
        return head
    cases = ", ".join(f"{c.label.value} -> {_names(c.targets)}" for c in a.cases)
    return head + " { " + cases + " }" if a.cases else head + " { }"


def _agent_item(i) -> str:
    if isinstance(i, ast.PolicyItem):
        return f"policy: {i.policy.value}"
    if isinstance(i, ast.PromptItem):
        return f"prompt: {encode_template(i.template)}"
    if isinstance(i, ast.SampleItem):
        entries = ", ".join(f"{e.key.value}: {fmt_value(e.value)}" for e in i.entries)
        return f"sample {{ {entries} }}" if entries else "sample { }"
    if isinstance(i, ast.OutputItem):
        return f"output: {fmt_type(i.type)}" + (f" via {fmt_call(i.via)}" if i.via else "")
    return f"unconsumed: {i.value.value}"


def _transition_item(i) -> str:
    if isinstance(i, ast.ConsumeItem):
        return f"consume: {_names(i.agents)}"
    if isinstance(i, ast.ToolItem):
        return f"tool {i.name.value} = {fmt_call(i.call)}"
    if isinstance(i, ast.RewardItem):
        return f"reward: {fmt_call(i.call)}"
    if isinstance(i, ast.ActivateItem):
        return f"activate: {fmt_activation(i.activation)}"
    return f"max_rounds: {i.value.value}"


def _top_line(i) -> str:
    if isinstance(i, ast.ImportStmt):
        return f"import {i.dotted}" + (f" as {i.alias.value}" if i.alias else "")
    if isinstance(i, ast.PolicyDecl):
        return f"policy {i.name.value} = {encode_string(i.model.value)}"
    if isinstance(i, ast.StartStmt):
        return f"start: {_names(i.agents)}"
    if isinstance(i, ast.RewardStmt):
        return f"reward: {fmt_call(i.call)}"
    return f"max_steps: {i.value.value}"


# Items of one group follow each other without a blank line.
_GROUP = {ast.ImportStmt: "import", ast.PolicyDecl: "policy", ast.StartStmt: "tail",
          ast.RewardStmt: "tail", ast.MaxStepsStmt: "tail"}


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
        self.unit(f"workflow {h.name.value}" + (f" {encode_string(h.description.value)}" if h.description else ""),
                  h.span, "")
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
                self.unit(_top_line(it), it.span, "")
        rest = [c.text for c in self.comments[self.k:]]
        if rest:
            self.out.append("")
            self.out.extend(rest)
        return "\n".join(self.out) + "\n"
