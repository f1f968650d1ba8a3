"""The terminal reward's data-flow check (issue 12, item 14): a start agent joined with a later
agent is produced by the time the episode ends; an agent only one route produces is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from srpo_graph.errors import WorkflowCheckError
from srpo_graph.lang import load_workflow

AGENT = """agent {name} {{
  policy: tiny
  prompt: "<{name}>{{task.target}}"
  sample {{ temperature: 1.0, max_tokens: 1, allow: ["0", "1"] }}
  output: {out}
}}
"""
HEAD = 'workflow w "t"\nimport std\ntask { target: int }\npolicy tiny = "tiny"\n'


def _wf(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "w.wf"
    p.write_text(HEAD + body)
    return p


def test_a_start_agent_joined_with_a_later_one_is_there_at_the_end(tmp_path):
    body = (AGENT.format(name="a", out="int via std.digit") + AGENT.format(name="b", out="int via std.digit")
            + AGENT.format(name="c", out="int via std.digit")
            + "transition tb {\n  consume: b\n  activate: c\n}\n"
            + "transition join {\n  consume: a, c\n  activate: end\n}\n"
            + "start: a, b\nreward: std.digits_sum_to(task.target, a, c)\nmax_steps: 3\n")
    wf = load_workflow(_wf(tmp_path, body))
    assert [t.name for t in wf.transitions] == ["tb", "join"]


@pytest.mark.parametrize("cases", ["x -> c, y -> end", "x -> c"])  # one route, or a label without a case
def test_an_agent_only_one_route_produces_is_not(tmp_path, cases):
    body = (
        AGENT.format(name="a", out="choice[x, y] via std.digit_choice")
        + AGENT.format(name="c", out="int via std.digit")
        + f"transition ta {{\n  consume: a\n  activate: route a {{ {cases} }}\n}}\n"
        + "transition tc {\n  consume: c\n  activate: end\n}\n"
        + "start: a\nreward: std.equals(c, task.target)\nmax_steps: 3\n"
    )
    with pytest.raises(WorkflowCheckError, match="'c' is not produced on every path before the episode ends"):
        load_workflow(_wf(tmp_path, body))


def test_an_agent_every_route_case_activates_is_there(tmp_path):
    body = (
        AGENT.format(name="a", out="choice[x, y] via std.digit_choice")
        + AGENT.format(name="c", out="int via std.digit")
        + "transition ta {\n  consume: a\n  activate: route a { x -> c, y -> c }\n}\n"
        + "transition tc {\n  consume: c\n  activate: end\n}\n"
        + "start: a\nreward: std.equals(c, task.target)\nmax_steps: 3\n"
    )
    load_workflow(_wf(tmp_path, body))


@pytest.mark.parametrize(
    "call, col, code",
    [
        ("std.numeric_match(task.answer, task.answer, tol=task.answer)", 53, "type-mismatch"),  # the keyword argument
        ("std.numeric_match(task.answer, task.target)", 40, "type-mismatch"),  # the positional argument
        ("std.numeric_match(task.answer, task.answer, tolerance=0.1)", 53, "bad-signature"),  # the unknown keyword
    ],
)
def test_call_errors_point_at_the_argument(tmp_path, call, col, code):
    body = (
        AGENT.format(name="a", out="int via std.digit")
        + "transition t {\n  consume: a\n  activate: end\n}\n"
        + f"start: a\nreward: {call}\nmax_steps: 2\n"
    )
    p = tmp_path / "w.wf"
    p.write_text(HEAD.replace("task { target: int }", "task { target: int, answer: text }") + body)
    with pytest.raises(WorkflowCheckError) as info:
        load_workflow(p)
    (d,) = info.value.diagnostics
    assert (d.span.col, d.code) == (col, code), str(info.value)
