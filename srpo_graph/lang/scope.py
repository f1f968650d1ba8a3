"""The checker's scope: names, types, references and calls of one ``.wf`` module.

Stage: lang (check). :class:`Scope` holds what the checker has declared so far (imports, task
fields, policies, agent output types, tool result types) and answers the questions every
declaration asks: what type does this reference have, does this call resolve and fit its
function's signature. Problems go to its :class:`~srpo_graph.errors.DiagnosticSink`; nothing is
raised here. Knows nothing of the graph rules (:mod:`srpo_graph.lang.analysis`).
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

from srpo_graph.errors import DiagnosticSink, Span
from srpo_graph.lang import ast
from srpo_graph.lang.callables import _ann_str, _hints, check_call, return_annotation, returns_fit
from srpo_graph.workflow import (
    BoolType,
    Call,
    ChoiceType,
    FloatType,
    IntType,
    ListType,
    Literal_,
    Policy,
    RecordType,
    Ref,
    TextType,
    WfType,
    type_str,
)

_SIMPLE: dict[str, WfType] = {"text": TextType(), "int": IntType(), "float": FloatType(), "bool": BoolType()}


def close_names(name: str, known: Iterable[str], none: str = "nothing of that kind is declared") -> str:
    """A "did you mean" hint, or the list of known names when short.

    Args:
        name: the unknown name.
        known: the names that exist.
        none: the hint when there are none.

    Returns:
        The hint: a close name, else the known names (the first 8 of a long list).

    >>> close_names("polcy", ["policy", "prompt"])
    "did you mean 'policy'?"
    >>> close_names("zzz", ["a", "b"])
    'known names: a, b'
    """
    known = sorted(set(known))
    match = difflib.get_close_matches(name, known, n=1)
    if match:
        return f"did you mean '{match[0]}'?"
    if known and len(known) <= 8:
        return "known names: " + ", ".join(known)
    if known:
        return f"known names include {', '.join(known[:8])} ({len(known)} in all)"
    return none


MAX_COUNT = 1_000_000  # bound of `max_rounds` and `max_steps` (an episode of more firings is a mistake)


@dataclass
class Uses:
    """References whose availability depends on paths (checked by the analysis)."""

    agent_refs: dict[str, list[Ref]] = field(default_factory=dict)  # agent -> template refs
    tool_refs: dict[str, list[tuple[int, Ref]]] = field(default_factory=dict)  # transition -> (tool index, ref)
    reward_refs: dict[str, list[Ref]] = field(default_factory=dict)  # transition -> reward refs
    route_refs: dict[str, Ref] = field(default_factory=dict)
    terminal_refs: list[Ref] = field(default_factory=list)
    unconsumed_ok: set[str] = field(default_factory=set)
    consume_spans: dict[tuple[str, str], Span] = field(default_factory=dict)  # (transition, agent) -> span
    incomplete: bool = False  # a transition without `activate`: graph rules on `end` are skipped


# The word a block item is written with, for "sets `x` twice" messages.
ITEM_WORD = {
    ast.PolicyItem: "policy", ast.PromptItem: "prompt", ast.SampleItem: "sample", ast.OutputItem: "output",
    ast.UnconsumedItem: "unconsumed", ast.ConsumeItem: "consume", ast.RewardItem: "reward",
    ast.ActivateItem: "activate", ast.MaxRoundsItem: "max_rounds", ast.ToolItem: "tool",
    ast.SystemItem: "system", ast.MemoryItem: "memory", ast.ThinkItem: "think",
}


class Scope:
    """The declarations seen so far, and the type and call rules that read them."""

    def __init__(self, base_dir: Path | None):
        self.base_dir = base_dir
        self.sink = DiagnosticSink()
        self.uses = Uses()
        self.decl_spans: dict[str, Span] = {}
        self.modules: dict[str, tuple[str, ModuleType | None, Span]] = {}  # alias -> (module, object, span)
        self.task_fields: dict[str, WfType] = {}
        self.policies: dict[str, Policy] = {}
        self.agent_types: dict[str, WfType] = {}
        self.tool_types: dict[str, WfType] = {}
        self.tool_owner: dict[str, str] = {}  # tool name -> the first transition that declares it
        self.tool_seen: set[tuple[str, str]] = set()  # (transition, tool name) declared so far
        # tools whose function was not imported (`check --no-import`, the editor, a failed import):
        # their values' types are unknown, so what reads them is not judged on a guess
        self.untyped_tools: set[str] = set()

    def err(self, message: str, span: Span | None, hint: str, code: str = "E", related: Any = ()) -> None:
        """Report an error: what (``message``), where (``span``), how to fix it (``hint``, required:
        every located error has a `fix:` line; tests/lang/test_fix_lines.py checks every call),
        and ``related`` locations (e.g. the first declaration of a duplicate)."""
        self.sink.error(message, span, hint, code, related)

    def node(self, cls: Any, errors_before: int, **fields: Any) -> Any:
        """A workflow node: validated (``cls(**fields)``) when no error was reported since
        ``errors_before``; else an unvalidated draft (``model_construct``) that lets the graph rules
        still run -- a draft never reaches a :class:`Workflow`, ``check`` stops at the errors."""
        if len(self.sink.errors) == errors_before:
            return cls(**fields)
        return cls.model_construct(**fields)

    def unique(self, name: ast.Name, seen: dict[str, Span], what: str) -> bool:
        if name.value in seen:
            prev = seen[name.value]
            self.err(f"duplicate {what} '{name.value}'", name.span,
                     f"'{name.value}' is already declared at line {prev.line}", "duplicate-name",
                     related=((prev, f"'{name.value}' first declared here"),))
            return False
        seen[name.value] = name.span
        return True

    def type_of(self, t: ast.TypeExpr) -> WfType:
        if isinstance(t, ast.SimpleType):
            return _SIMPLE[t.name]
        if isinstance(t, ast.ChoiceTypeExpr):
            seen: dict[str, Span] = {}
            for o in t.options:
                self.unique(o, seen, "choice label")
            return ChoiceType(options=tuple(seen), multi=t.multi)
        if isinstance(t, ast.ListTypeExpr):
            return ListType(item=self.type_of(t.item))
        seen_f: dict[str, Span] = {}
        fields = []
        for f in t.fields:
            if self.unique(f.name, seen_f, "record field"):
                fields.append((f.name.value, self.type_of(f.type)))
        return RecordType(fields=tuple(fields))

    def ref_type(self, ref: ast.Ref, *, allow_agents: bool = True) -> WfType | None:
        """Type of a reference, or None (reported) when it names nothing."""
        head, rest = ref.path[0], list(ref.path[1:])
        span = ref.span
        if head == "task":
            if not rest:
                self.err("`task` alone is not a value", span, "refer to a field: task.FIELD", "unknown-name")
                return None
            fname = rest.pop(0)
            if fname not in self.task_fields:
                self.err(f"unknown task field '{fname}'", span,
                         close_names(fname, self.task_fields, "declare it in the `task { }` block")
                         .replace("known names", "task fields"), "unknown-field")
                return None
            t = self.task_fields[fname]
            where = f"task.{fname}"
        elif head in self.agent_types and allow_agents:
            t, where = self.agent_types[head], head
        elif head in self.tool_types:
            if head in self.untyped_tools:
                return None
            t, where = self.tool_types[head], head
        else:
            names = list(self.agent_types) + list(self.tool_types) + ["task"]
            self.err(f"unknown name '{head}' in a reference", span, close_names(head, names), "unknown-name")
            return None
        for fname in rest:
            if not isinstance(t, RecordType):
                self.err(f"'{where}' is {type_str(t)}, not a record: it has no field '{fname}'", span,
                         f"refer to the whole value, {{{where}}}, or declare a record output "
                         f"(e.g. `output: {{ {fname}: text }} via std.json_record`)", "unknown-field")
                return None
            ft = t.field_type(fname)
            if ft is None:
                if not t.fields:  # a dict from a tool: fields unknown statically
                    return None
                self.err(f"'{where}' has no field '{fname}'", span,
                         close_names(fname, [n for n, _ in t.fields]), "unknown-field")
                return None
            t, where = ft, f"{where}.{fname}"
        return t

    def expr(self, e: ast.Expr, refs: list[Ref]) -> tuple[Ref | Literal_, WfType | None]:
        if isinstance(e, ast.Ref):
            r = Ref(path=e.path, optional=e.optional, span=e.span)
            refs.append(r)
            return r, self.ref_type(e)
        lit_types: dict[type, WfType] = {ast.StringLit: TextType(), ast.BoolLit: BoolType()}
        lit_type = lit_types.get(type(e))
        if isinstance(e, ast.NumberLit):
            lit_type = IntType() if isinstance(e.value, int) else FloatType()
        return Literal_(value=e.value, span=e.span), lit_type

    def resolve_call(self, c: ast.Call, role: str):
        """(python module name, function or None) or None when the module is not imported."""
        alias = c.module.value
        if alias not in self.modules:
            add = f"add `import {alias}`"
            hint = add if alias == "std" else close_names(alias, self.modules, add)
            self.err(f"'{alias}' is not an imported module", c.module.span, hint, "unknown-module")
            return None
        modname, mod, _ = self.modules[alias]
        if mod is None:
            return modname, None
        fn = getattr(mod, c.function.value, None)
        if fn is None or not callable(fn):
            public = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))]
            self.err(
                f"module '{alias}' has no function '{c.function.value}'",
                c.function.span,
                close_names(c.function.value, public),
                "unknown-callable",
            )
            return modname, None
        return modname, fn

    def call(self, c: ast.Call, role: str, refs: list[Ref], leading=(), extra_args=()) -> Call | None:
        """Resolve and type-check a call; ``leading`` types are passed first by the runtime."""
        resolved = self.resolve_call(c, role)
        args: list[Ref | Literal_] = []
        kwargs: list[tuple[str, Ref | Literal_]] = []
        arg_types: list[WfType | None] = []
        kw_types: dict[str, WfType | None] = {}
        for a in c.args:
            value, t = self.expr(a.value, refs)
            if a.name is None:
                if kwargs:
                    self.err(
                        "a positional argument after a keyword argument",
                        a.span,
                        "write the positional arguments first, then `name=value` ones (or name this one too)",
                        "bad-call",
                    )
                args.append(value)
                arg_types.append(t)
            else:
                if a.name.value in kw_types:
                    self.err(
                        f"keyword argument '{a.name.value}' given twice",
                        a.name.span,
                        f"give `{a.name.value}=` once: delete one of them",
                        "bad-call",
                    )
                kwargs.append((a.name.value, value))
                kw_types[a.name.value] = t
        args.extend(extra_args)
        arg_types.extend(TextType() for _ in extra_args)
        if resolved is None:
            return None
        modname, fn = resolved
        if fn is not None:
            positional = [a for a in c.args if a.name is None]
            for p in check_call(fn, arg_types, kw_types, leading=leading):
                # point at the argument the problem is about, else at the call
                named = [
                    a for a in c.args if p.keyword is not None and a.name is not None and a.name.value == p.keyword
                ]
                span = (
                    positional[p.index].span
                    if p.index is not None and p.index < len(positional)
                    else named[0].span
                    if named
                    else c.span
                )
                about_arg = "takes" in p.message and (p.index is not None or bool(named))
                self.err(
                    f"{role} {c.module.value}.{c.function.value}: {p.message}",
                    span,
                    signature_hint(fn),
                    "type-mismatch" if about_arg else "bad-signature",
                )
        return Call(
            module=modname,
            alias=c.module.value,
            function=c.function.value,
            args=tuple(args),
            kwargs=tuple(kwargs),
            span=c.span,
        )

    def reward(self, c: ast.Call, refs: list[Ref]) -> Call | None:
        call = self.call(c, "reward", refs)
        mod = self.modules.get(c.module.value, (None, None, None))[1]
        fn = getattr(mod, c.function.value, None) if mod is not None else None
        if call is not None and fn is not None and callable(fn) and not returns_fit(FloatType(), return_annotation(fn)):
            self.err(
                f"reward {call.qualname} returns {ret_str(fn)}, not a number",
                c.span,
                "a reward function returns a float",
                "type-mismatch",
            )
        return call


def signature_hint(fn: Callable) -> str:
    """``its signature is f(x: int) -> float``: the hint under a bad call.

    >>> from srpo_graph import std
    >>> signature_hint(std.equals)
    'its signature is equals(a: int, b: int) -> float'
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "its signature cannot be read: check the function's parameters in its module"
    hints = _hints(fn)

    def ann(a):
        return getattr(a, "__name__", None) or str(a).replace("typing.", "")

    def param(p: inspect.Parameter) -> str:
        stars = (
            "*"
            if p.kind is inspect.Parameter.VAR_POSITIONAL
            else "**"
            if p.kind is inspect.Parameter.VAR_KEYWORD
            else ""
        )
        a = hints.get(p.name, p.annotation)
        text = stars + p.name + ("" if a is inspect.Parameter.empty else f": {ann(a)}")
        return text + ("" if p.default is inspect.Parameter.empty else f" = {p.default!r}")

    ret = hints.get("return", sig.return_annotation)
    arrow = "" if ret is inspect.Signature.empty else f" -> {ann(ret)}"
    text = ", ".join(param(p) for p in sig.parameters.values())
    return f"its signature is {getattr(fn, '__name__', 'fn')}({text}){arrow}"


def ret_str(fn: Callable) -> str:
    """What ``fn`` is annotated to return, in ``.wf`` words (``int``, ``text``, ``a record``)."""
    return _ann_str(return_annotation(fn))
