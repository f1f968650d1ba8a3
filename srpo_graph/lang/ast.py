"""The ``.wf`` syntax tree: one frozen dataclass per grammar rule, each with a :class:`Span`.

Stage: lang (parse). Produced by :mod:`srpo_graph.lang.parser`, consumed by the checker
(:mod:`srpo_graph.lang.checker`) and the formatter (:mod:`srpo_graph.lang.fmt`). The tree is
exactly what was written: no name is resolved, nothing is checked, defaults are not filled in.
Comments are kept on the :class:`Module` (for the formatter) and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from srpo_graph.errors import Span


@dataclass(frozen=True)
class Name:
    """An identifier as written, with where it was written."""

    value: str
    span: Span


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Ref:
    """``task.target``, ``solver``, ``searcher.query``, ``docs?``."""

    path: tuple[str, ...]
    optional: bool
    span: Span


@dataclass(frozen=True)
class StringLit:
    value: str  # escapes decoded
    span: Span


@dataclass(frozen=True)
class NumberLit:
    value: int | float
    span: Span


@dataclass(frozen=True)
class BoolLit:
    value: bool
    span: Span


Literal = Union[StringLit, NumberLit, BoolLit]
Expr = Union[Ref, StringLit, NumberLit, BoolLit]


@dataclass(frozen=True)
class ListLit:
    """``["0", "1"]``: only as a sampling value."""

    items: tuple[Literal, ...]
    span: Span


Value = Union[StringLit, NumberLit, BoolLit, ListLit]


@dataclass(frozen=True)
class Arg:
    """A call argument: positional (``name is None``) or ``name=value``."""

    name: Name | None
    value: Expr
    span: Span


@dataclass(frozen=True)
class Call:
    """``alias.function`` or ``alias.function(args)``; ``has_parens`` keeps ``f`` apart from ``f()``."""

    module: Name
    function: Name
    args: tuple[Arg, ...]
    has_parens: bool
    span: Span


@dataclass(frozen=True)
class TextPiece:
    text: str  # escapes decoded


@dataclass(frozen=True)
class Template:
    """A prompt string split into literal text and ``{ref}`` holes."""

    parts: tuple[Union[TextPiece, Ref], ...]
    triple_quoted: bool
    span: Span


# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class SimpleType:
    name: str  # text | int | float | bool
    span: Span


@dataclass(frozen=True)
class ChoiceTypeExpr:
    options: tuple[Name, ...]
    multi: bool  # choices[...]
    span: Span


@dataclass(frozen=True)
class ListTypeExpr:
    item: "TypeExpr"
    span: Span


@dataclass(frozen=True)
class RecordField:
    name: Name
    type: "TypeExpr"
    span: Span


@dataclass(frozen=True)
class RecordTypeExpr:
    fields: tuple[RecordField, ...]
    span: Span


TypeExpr = Union[SimpleType, ChoiceTypeExpr, ListTypeExpr, RecordTypeExpr]

# --------------------------------------------------------------------------- top-level items


@dataclass(frozen=True)
class Header:
    name: Name
    description: StringLit | None
    span: Span


@dataclass(frozen=True)
class ImportStmt:
    module: tuple[Name, ...]  # dotted
    alias: Name | None
    span: Span

    @property
    def dotted(self) -> str:
        return ".".join(n.value for n in self.module)


@dataclass(frozen=True)
class FieldDecl:
    name: Name
    type: TypeExpr
    span: Span


@dataclass(frozen=True)
class TaskBlock:
    fields: tuple[FieldDecl, ...]
    span: Span


@dataclass(frozen=True)
class ModuleList:
    """``[q_proj, v_proj]``: module names, as written."""

    names: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class LoraArg:
    """``r=16``, ``alpha=32``, ``targets=[q_proj, v_proj]`` (keys and values checked by the checker)."""

    key: Name
    value: NumberLit | ModuleList
    span: Span


@dataclass(frozen=True)
class LoraExpr:
    """``lora("base", r=16, ...)``: a LoRA adapter on the policy named ``base``."""

    base: StringLit
    args: tuple[LoraArg, ...]
    span: Span


@dataclass(frozen=True)
class OpenaiArg:
    """``model="name"``, ``api_key_env="VAR"``, ``timeout=60`` ... (keys and values checked by the checker)."""

    key: Name
    value: StringLit | NumberLit
    span: Span


@dataclass(frozen=True)
class OpenaiExpr:
    """``openai("http://host:port/v1", model="name", ...)``: a model behind an OpenAI-compatible endpoint."""

    url: StringLit
    args: tuple[OpenaiArg, ...]
    span: Span


@dataclass(frozen=True)
class PolicyDecl:
    """``policy p = "model"``, ``= lora(...)`` or ``= openai(...)``; ``frozen`` after it: never trained."""

    name: Name
    model: StringLit | LoraExpr | OpenaiExpr
    span: Span
    frozen: Span | None = None  # where the `frozen` keyword is, when written


# agent items


@dataclass(frozen=True)
class PolicyItem:
    policy: Name
    span: Span


@dataclass(frozen=True)
class PromptItem:
    template: Template
    span: Span


@dataclass(frozen=True)
class SampleEntry:
    key: Name
    value: Value
    span: Span


@dataclass(frozen=True)
class SampleItem:
    entries: tuple[SampleEntry, ...]
    span: Span


@dataclass(frozen=True)
class OutputItem:
    type: TypeExpr
    via: Call | None
    span: Span


@dataclass(frozen=True)
class UnconsumedItem:
    value: Name  # only ``allow`` is valid (checked)
    span: Span


@dataclass(frozen=True)
class SystemItem:
    template: Template  # the chat agent's system message (references allowed)
    span: Span


@dataclass(frozen=True)
class MemoryItem:
    value: Name  # ``chat`` or ``none`` (checked)
    span: Span


@dataclass(frozen=True)
class ThinkItem:
    value: Name  # ``keep`` or ``strip`` (checked)
    span: Span


AgentItem = Union[PolicyItem, PromptItem, SampleItem, OutputItem, UnconsumedItem, SystemItem, MemoryItem, ThinkItem]


@dataclass(frozen=True)
class AgentDecl:
    name: Name
    items: tuple[AgentItem, ...]
    span: Span


# transition items


@dataclass(frozen=True)
class ConsumeItem:
    agents: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class ToolItem:
    name: Name
    call: Call
    span: Span


@dataclass(frozen=True)
class RewardItem:
    call: Call
    span: Span


@dataclass(frozen=True)
class ActivateEnd:
    span: Span


@dataclass(frozen=True)
class ActivateAgents:
    agents: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class RouteCase:
    label: Name
    targets: tuple[Name, ...]  # ``end`` allowed
    span: Span


@dataclass(frozen=True)
class ActivateRoute:
    on: Ref
    cases: tuple[RouteCase, ...] | None  # None: the labels name the agents
    span: Span


Activation = Union[ActivateEnd, ActivateAgents, ActivateRoute]


@dataclass(frozen=True)
class ActivateItem:
    activation: Activation
    span: Span


@dataclass(frozen=True)
class MaxRoundsItem:
    value: NumberLit
    span: Span


TransitionItem = Union[ConsumeItem, ToolItem, RewardItem, ActivateItem, MaxRoundsItem]


@dataclass(frozen=True)
class TransitionDecl:
    name: Name
    items: tuple[TransitionItem, ...]
    span: Span


@dataclass(frozen=True)
class StartStmt:
    agents: tuple[Name, ...]
    span: Span


@dataclass(frozen=True)
class RewardStmt:
    call: Call
    span: Span


@dataclass(frozen=True)
class MaxStepsStmt:
    value: NumberLit
    span: Span


Item = Union[ImportStmt, TaskBlock, PolicyDecl, AgentDecl, TransitionDecl, StartStmt, RewardStmt, MaxStepsStmt]


@dataclass(frozen=True)
class Comment:
    text: str  # including the leading ``#``
    span: Span


@dataclass(frozen=True)
class Module:
    """A whole ``.wf`` file: its header, its items in source order, and its comments."""

    header: Header
    items: tuple[Item, ...]
    comments: tuple[Comment, ...]
    source: str
    span: Span

    @property
    def path(self) -> str:
        return self.span.path
