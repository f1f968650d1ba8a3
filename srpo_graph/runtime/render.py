"""Resolve references and render prompt templates against an episode's state.

Runtime stage. Consumes a :class:`~srpo_graph.workflow.Template` (or call arguments) and the
episode :class:`State`; produces prompt text (or argument values). It knows nothing about
tokens.

Rendering rules: strings as they are, ``None`` as the empty string, booleans as ``true`` /
``false``, lists one item per line, records (dicts) as compact JSON. An optional reference
(``{docs?}``) renders as ``""`` while absent; an unmarked reference that is absent raises
:class:`~srpo_graph.errors.RuntimeFailure` (the checker proves that cannot happen on a valid
workflow, so it marks the episode failed rather than guessing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from srpo_graph.errors import RuntimeFailure
from srpo_graph.workflow import Call, Literal_, Ref, Template, TextPart

_ABSENT = object()


@dataclass
class State:
    """What references read: task fields, each agent's latest output value, tool results."""

    task: dict[str, Any]
    values: dict[str, Any] = field(default_factory=dict)  # agent name -> latest value
    vars: dict[str, Any] = field(default_factory=dict)  # tool result name -> value

    def lookup(self, ref: Ref) -> Any:
        """The value of ``ref``, or the module's ``_ABSENT`` sentinel when it has none yet."""
        head, rest = ref.path[0], ref.path[1:]
        if head == "task":
            if not rest:
                return dict(self.task)
            value = self.task.get(rest[0], _ABSENT)
            rest = rest[1:]
        elif head in self.values:
            value = self.values[head]
        elif head in self.vars:
            value = self.vars[head]
        else:
            return _ABSENT
        for name in rest:
            if isinstance(value, dict):
                value = value.get(name)
            elif value is not None and value is not _ABSENT:
                return _ABSENT
        return value

    def get(self, ref: Ref) -> Any:
        """Like :meth:`lookup` but ``None`` when absent."""
        value = self.lookup(ref)
        return None if value is _ABSENT else value

    def resolve(self, ref: Ref) -> Any:
        """Like :meth:`lookup` but an absent value is ``None`` if optional, else an error."""
        value = self.lookup(ref)
        if value is _ABSENT:
            if ref.optional:
                return None
            raise RuntimeFailure(f"reference {{{ref}}} has no value yet")
        return value


def format_value(value: Any) -> str:
    """How a value appears inside a prompt.

    >>> format_value([1, "b"])
    '1\\nb'
    >>> format_value({"action": "search", "query": "x"})
    '{"action": "search", "query": "x"}'
    >>> format_value(None), format_value(True)
    ('', 'true')
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def render(template: Template, state: State) -> str:
    """Render ``template`` with ``state``.

    >>> t = Template(parts=(TextPart(text="<a>"), Ref(path=("task", "target")), Ref(path=("docs",), optional=True)))
    >>> render(t, State(task={"target": 7}))
    '<a>7'
    """
    out = []
    for part in template.parts:
        if isinstance(part, TextPart):
            out.append(part.text)
        else:
            out.append(format_value(state.resolve(part)))
    return "".join(out)


def call_args(call: Call, state: State) -> tuple[list[Any], dict[str, Any]]:
    """Evaluate a call's arguments; a reference with no value (yet) is passed as ``None``.

    Rewards score ``None`` as 0, so a truncated episode whose last agent never ran still gets
    its terminal reward evaluated.
    """

    args = [_arg(a, state) for a in call.args]
    return args, ({k: _arg(v, state) for k, v in call.kwargs} if call.kwargs else {})


def _arg(e: Ref | Literal_, state: State) -> Any:
    if isinstance(e, Literal_):
        return e.value
    value = state.lookup(e)
    return None if value is _ABSENT else value


def choice_problem(t: Any, value: Any) -> str | None:
    """Why ``value`` is not a value of ``t`` when ``t`` is a choice type (a tool annotated
    ``-> Literal[...]`` or ``-> list[Literal[...]]``), else None. ``None`` is allowed: a route
    on a missing value activates ``end``.

    >>> from srpo_graph.workflow import ChoiceType
    >>> choice_problem(ChoiceType(options=("stop", "again")), "again") is None
    True
    >>> choice_problem(ChoiceType(options=("stop", "again")), "halt")
    "returned 'halt', not one of its labels ['stop', 'again']"
    """
    from srpo_graph.workflow import ChoiceType

    if not isinstance(t, ChoiceType) or value is None:
        return None
    labels = value if t.multi and isinstance(value, (list, tuple)) else [value]
    if (t.multi and not isinstance(value, (list, tuple))) or any(v not in t.options for v in labels):
        return f"returned {value!r}, not {'a list of' if t.multi else 'one of'} its labels {list(t.options)}"
    return None
