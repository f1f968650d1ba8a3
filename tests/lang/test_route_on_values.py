"""Routes on any choice-typed value the checker can type: a tool annotated ``-> Literal[...]``
(a Python check, or the helper a reward uses, called as a tool) or ``-> list[Literal[...]]``
(a ``choices`` router), with the same static rules as a route on an agent's ``choice`` output:
every label handled or warned, every case label a real label, every target an agent, every
cycle bounded, set sizes proved."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from srpo_graph.errors import WorkflowCheckError
from srpo_graph.lang import load_workflow
from srpo_graph.lang.checker import check_module
from srpo_graph.lang.parser import parse
from srpo_graph.workflow import ActivateRoute

CHECKS = '''from typing import Literal, Optional


def verdict(guess: Optional[int], target: int) -> Literal["stop", "again"]:
    return "stop" if guess == target else "again"


def pick(target: int) -> list[Literal["a", "b"]]:
    return ["a", "b"] if target % 2 else ["a"]


def spaced(target: int) -> Literal["no way", "ok"]:
    return "ok"
'''

LOOP = '''workflow retry
import std
import {mod} as checks
task {{ target: int }}
policy tiny = "tiny"
agent a {{
  policy: tiny
  prompt: "<a>{{task.target}}"
  sample {{ max_tokens: 1, allow: ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"] }}
  output: int via std.digit
}}
transition judge {{
  consume: a
  tool verdict = checks.verdict(a, task.target)
  reward: std.equals(a, task.target)
  activate: {activate}
{rounds}}}
start: a
'''

PICK = '''workflow pick
import std
import {mod} as checks
task {{ target: int }}
policy tiny = "tiny"
agent r {{ policy: tiny  prompt: "<r>"  sample {{ max_tokens: 1 }} }}
agent a {{ policy: tiny  prompt: "<a>{{task.target}}"  sample {{ max_tokens: 1 }} }}
agent b {{ policy: tiny  prompt: "<b>{{task.target}}"  sample {{ max_tokens: 1 }} }}
transition dispatch {{
  consume: r
  tool chosen = checks.pick(task.target)
  activate: route chosen
}}
transition both {{ consume: a, b  activate: end }}
start: r
'''


def _write(tmp_path: Path, template: str, **fields) -> tuple[Path, str]:
    mod = f"route_checks_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(CHECKS, encoding="utf-8")
    path = tmp_path / "w.wf"
    path.write_text(template.format(mod=mod, **fields), encoding="utf-8")
    return path, mod


def _loop(tmp_path, activate="route verdict { stop -> end, again -> a }", rounds="  max_rounds: 3\n"):
    return _write(tmp_path, LOOP, activate=activate, rounds=rounds)[0]


def test_a_loop_routed_by_a_python_check_checks(tmp_path):
    wf = load_workflow(_loop(tmp_path))
    judge = wf.transition_by_name["judge"]
    assert isinstance(judge.activate, ActivateRoute) and dict(judge.activate.cases) == {
        "stop": ("end",),
        "again": ("a",),
    }
    assert judge.tools[0].type.options == ("stop", "again") and judge.set_sizes == (1,)


@pytest.mark.parametrize(
    "activate, rounds, message",
    [
        ("route verdict { stop -> end, again -> a }", "", "unbounded cycle: a -> judge -> a"),
        (
            "route verdict { stopp -> end, again -> a }",
            "  max_rounds: 3\n",
            "'stopp' is not a label of choice[stop, again]",
        ),
        (
            "route verdict { stop -> end, again -> zz }",
            "  max_rounds: 3\n",
            "route case 'again' names 'zz', which is not an agent",
        ),
        ("route verdict", "  max_rounds: 3\n", "router choice 'stop' is not an agent"),
    ],
    ids=["unbounded", "bad-label", "bad-target", "labels-not-agents"],
)
def test_the_graph_rules_hold_for_a_tool_route(tmp_path, activate, rounds, message):
    with pytest.raises(WorkflowCheckError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        load_workflow(_loop(tmp_path, activate, rounds))


def test_an_unhandled_label_is_warned_and_ends_the_episode(tmp_path):
    path = _loop(tmp_path, "route verdict { again -> a }")
    result = check_module(parse(path.read_text(), str(path)))
    warns = [d for d in result.warnings if d.code != "tiny-greedy"]  # the tiny model's own advice
    assert [d.code for d in warns] == ["route-default"] and "no case for 'stop'" in warns[0].message
    assert dict(result.workflow.transition_by_name["judge"].activate.cases)["stop"] == ("end",)


def test_a_choices_router_on_a_list_of_literals_proves_its_set_sizes(tmp_path):
    wf = load_workflow(_write(tmp_path, PICK)[0])
    assert wf.transition_by_name["dispatch"].tools[0].type.multi
    assert wf.transition_by_name["both"].set_sizes == (1, 2)


def test_a_literal_whose_labels_are_not_names_is_refused(tmp_path):
    path, mod = _write(tmp_path, LOOP, activate="route verdict { stop -> end, again -> a }", rounds="  max_rounds: 3\n")
    path.write_text(path.read_text().replace("checks.verdict(a, task.target)", "checks.spaced(task.target)"))
    with pytest.raises(WorkflowCheckError, match="no usable return annotation") as err:
        load_workflow(path)
    assert "Literal" in str(err.value)
