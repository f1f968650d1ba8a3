"""Workflows for the runtime tests, built directly with the ``srpo_graph.workflow`` model.

No parser involved, so the executor tests exercise the executor alone. (Imported as
``from tests.support import workflows as wfs``.)
"""

from __future__ import annotations

from srpo_graph.workflow import (
    ActivateAgents,
    ActivateEnd,
    ActivateRoute,
    Agent,
    Call,
    ChoiceType,
    IntType,
    Literal_,
    Policy,
    Ref,
    Sampling,
    Template,
    TextPart,
    TextType,
    ToolCall,
    Transition,
    Workflow,
)

DIGITS = tuple("0123456789")
STD = "srpo_graph.std"


def call(fn: str, *args, module: str = STD, alias: str = "std") -> Call:
    conv = tuple(Ref(path=tuple(a.split("."))) if isinstance(a, str) else Literal_(value=a.value) for a in args)
    return Call(module=module, alias=alias, function=fn, args=conv)


class Lit:
    def __init__(self, value):
        self.value = value


def tmpl(*parts: str) -> Template:
    """``"{task.target}"``-style parts become refs, the rest text."""
    out = []
    for p in parts:
        if p.startswith("{") and p.endswith("}"):
            inner = p[1:-1]
            out.append(Ref(path=tuple(inner.rstrip("?").split(".")), optional=inner.endswith("?")))
        else:
            out.append(TextPart(text=p))
    return Template(parts=tuple(out))


def digit_agent(name: str, *prompt: str, temperature: float = 1.0, max_tokens: int = 1) -> Agent:
    return Agent(
        name=name, policy="tiny", template=tmpl(*prompt),
        sampling=Sampling(temperature=temperature, max_tokens=max_tokens, allow=DIGITS),
        output=IntType(), extractor=call("digit"),
    )


def make_workflow(name, agents, transitions, start, reward=None, max_steps=8, imports=()) -> Workflow:
    return Workflow(
        name=name, source_hash="0" * 64, task_fields=(("target", IntType()),),
        policies=(Policy(name="tiny", model="tiny"),), agents=tuple(agents), transitions=tuple(transitions),
        start=tuple(start), reward=reward, max_steps=max_steps,
    )


def coord_seq() -> Workflow:
    """a writes a digit; b sees it; both must sum to the target (sets of size 1, 1)."""
    return make_workflow(
        "coord_seq",
        [digit_agent("a", "<a>", "{task.target}"), digit_agent("b", "<b>", "{task.target}", "<sep>", "{a}")],
        [
            Transition(name="hand_off", consume=("a",), activate=ActivateAgents(agents=("b",)), set_sizes=(1,)),
            Transition(name="score", consume=("b",), reward=call("equals", "b", "task.target"),
                       activate=ActivateEnd(), set_sizes=(1,)),
        ],
        ["a"], reward=call("digits_sum_to", "task.target", "a", "b"),
    )


def coord_mixed() -> Workflow:
    """a, b, c in parallel (one set of 3), then d sees their digits (a set of 1)."""
    return make_workflow(
        "coord_mixed",
        [digit_agent(n, f"<{n}>", "{task.target}") for n in "abc"]
        + [digit_agent("d", "<d>", "{task.target}", "<sep>", "{a}", "{b}", "{c}")],
        [
            Transition(name="gather", consume=("a", "b", "c"), activate=ActivateAgents(agents=("d",)), set_sizes=(3,)),
            Transition(name="finish", consume=("d",), activate=ActivateEnd(), set_sizes=(1,)),
        ],
        ["a", "b", "c"], reward=call("digits_sum_to", "task.target", "a", "b", "c", "d"),
    )


def coord_routed(max_rounds: int | None = None) -> Workflow:
    """r picks a specialist (choice[a, b, end] written as a digit); the specialist loops back to r."""
    router = Agent(
        name="r", policy="tiny", template=tmpl("<r>", "{task.target}", "{a?}", "{b?}"),
        sampling=Sampling(max_tokens=1, allow=("0", "1", "2")),
        output=ChoiceType(options=("a", "b", "end")),
        extractor=Call(module=STD, alias="std", function="digit_choice",
                       args=(Literal_(value="a"), Literal_(value="b"), Literal_(value="end"))),
    )
    return make_workflow(
        "coord_routed",
        [router, digit_agent("a", "<a>", "{task.target}"), digit_agent("b", "<b>", "{task.target}")],
        [
            Transition(
                name="route",
                consume=("r",),
                max_rounds=max_rounds,
                activate=ActivateRoute(on=Ref(path=("r",)), cases=(("a", ("a",)), ("b", ("b",)), ("end", ("end",)))),
                set_sizes=(1,),
            ),
            Transition(name="back", consume=("a", "b"), activate=ActivateAgents(agents=("r",)), set_sizes=(1,)),
        ],
        ["r"],
        max_steps=12,
    )


def with_tool(module: str, fn: str) -> Workflow:
    """a writes a digit; a tool ``module.fn(a, task.target)`` runs; b sees its result."""
    return make_workflow(
        "with_tool",
        [digit_agent("a", "<a>", "{task.target}"), digit_agent("b", "<b>", "{task.target}", "<sep>", "{note}")],
        [
            Transition(
                name="look",
                consume=("a",),
                tools=(
                    ToolCall(
                        name="note", call=call(fn, "a", "task.target", module=module, alias="tools"), type=TextType()
                    ),
                ),
                activate=ActivateAgents(agents=("b",)),
                set_sizes=(1,),
            ),
            Transition(name="done", consume=("b",), activate=ActivateEnd(), set_sizes=(1,)),
        ],
        ["a"],
        reward=call("digits_sum_to", "task.target", "a", "b"),
    )
