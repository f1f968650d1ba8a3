"""One data-flow rule for every reader (issue 22, item 2): templates, tools,
transition rewards, route subjects and the terminal reward are all checked against what every run
of the runtime's own firing rule has produced before them (lang/explore.py).

The case that used to be rejected: a closer reads a start agent that a join already consumed --
the join cannot fire without it, so it is always there."""

from __future__ import annotations

import pytest

from srpo_graph.errors import WorkflowCheckError
from srpo_graph.lang import check, parse
from srpo_graph.lang.checker import check_module

HEAD = 'workflow w\nimport std\ntask { q: text }\npolicy p = "tiny"\n'


def agent(name: str, out: str = "text via std.text", prompt: str = "x") -> str:
    return f'agent {name} {{ policy: p  prompt: "{prompt}"  output: {out} }}\n'


# s and b start; tb turns b into c; the join takes s and c; the closer f runs after the join
JOIN = (agent("b") + agent("c")
        + "transition tb { consume: b  activate: c }\n"
        + "transition join { consume: s, c  activate: f }\n")

READERS = {
    "template": (agent("s") + agent("f", prompt="{s}") + JOIN + "transition tf { consume: f  activate: end }\n"),
    "tool": (agent("s") + agent("f") + JOIN
             + "transition tf { consume: f  tool d = std.retrieve(s)  activate: end }\n"),
    "transition reward": (agent("s") + agent("f") + JOIN
                          + "transition tf { consume: f  reward: std.exact_match(s, task.q)  activate: end }\n"),
    "route subject": (agent("s", out="choice[x, y] via std.choice") + agent("f") + JOIN
                      + "transition tf { consume: f  activate: route s { x -> end, y -> end } }\n"),
    "terminal reward": (agent("s") + agent("f") + JOIN + "transition tf { consume: f  activate: end }\n"
                        + "reward: std.exact_match(s, task.q)\n"),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_start_agent_consumed_by_a_join_is_there_for_every_later_reader(reader):
    w = check(parse(HEAD + READERS[reader] + "start: s, b\n"))
    # tb is declared first, so it fires first, c is pending, and the join waits for it: one set of 2
    assert w.transition_by_name["join"].set_sizes == (2,)


ONE_ROUTE = (agent("r", out="choice[x, y] via std.choice") + agent("c") + agent("f")
             + "transition tr { consume: r  activate: route r { x -> c, y -> f } }\n"
             + "transition tc { consume: c  activate: f }\n")
ROUTED_READERS = {
    "template": (agent("f", prompt="{c}"), "transition tf { consume: f  activate: end }\n", "agent 'f' runs"),
    "tool": ("", "transition tf { consume: f  tool d = std.retrieve(c)  activate: end }\n", "tool 'd' runs"),
    "transition reward": ("", "transition tf { consume: f  reward: std.exact_match(c, task.q)  activate: end }\n",
                          "transition 'tf' gives its reward"),
    "terminal reward": ("", "transition tf { consume: f  activate: end }\nreward: std.exact_match(c, task.q)\n",
                        "the episode ends"),
}


@pytest.mark.parametrize("reader", list(ROUTED_READERS))
def test_an_agent_only_one_route_produces_is_an_error_for_every_reader(reader):
    extra_agent, tail, where = ROUTED_READERS[reader]
    body = ONE_ROUTE.replace(agent("f"), extra_agent or agent("f")) + tail + "start: r\n"
    with pytest.raises(WorkflowCheckError, match=f"'c' is not produced on every path before {where}"):
        check(parse(HEAD + body))
    # marked optional, it is read only when present
    if reader == "template":
        check(parse(HEAD + body.replace("{c}", "{c?}")))


def test_a_loop_that_reactivates_an_agent_before_its_consumer_fires_is_warned():
    """w loops: tw re-activates a and x every round; x's consumer tx waits on y, which only the
    last round produces, so x's earlier outputs are superseded: a located warning."""
    body = (agent("a") + agent("x") + agent("y")
            + "transition tw { consume: a  max_rounds: 3  activate: route a { more -> a, x, done -> y } }\n"
            + "transition tx { consume: x, y  activate: end }\n"
            + "start: a\n").replace('agent a { policy: p  prompt: "x"  output: text via std.text }',
                                    'agent a { policy: p  prompt: "x"  output: choice[more, done] via std.choice }')
    r = check_module(parse(HEAD + body))
    (warn,) = [d for d in r.warnings if d.code == "superseded"]
    assert "transition 'tw' can activate agent 'x' again before 'tx'" in warn.message
    assert warn.span is not None and warn.span.line == 8  # the transition tw
    assert r.workflow.transition_by_name["tx"].set_sizes == (1, 2)
    assert "let 'tx' fire first" in (warn.hint or "")


def test_declaring_the_consumer_first_removes_the_superseded_warning():
    """The warning's fix works: of two ready transitions the first declared fires, so a consumer
    declared before the transition that re-activates its agent takes each output in time."""
    agents = "".join(agent(a) for a in "abcx")
    late = ("transition t0 { consume: a  activate: b, x }\ntransition t1 { consume: b  activate: c, x }\n"
            "transition t2 { consume: c  activate: end }\ntransition tx { consume: x  activate: end }\nstart: a\n")
    early = late.replace("transition tx { consume: x  activate: end }\n", "").replace(
        "transition t1", "transition tx { consume: x  activate: end }\ntransition t1")
    assert [d.code for d in check_module(parse(HEAD + agents + late)).warnings] == ["superseded"]
    assert [d.code for d in check_module(parse(HEAD + agents + early)).warnings] == []
