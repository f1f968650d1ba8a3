"""``choices`` routers: what ``check`` proves (set sizes, the firing bound) agrees with what the
runtime does, over many real episodes of the tiny model.

``std.digit_choices`` reads index digits; with an ``allow`` list of digits each token is one
digit, so ``max_tokens`` bounds how many labels one router output picks. The proved sizes must
contain every observed size (soundness) and, with enough samples of a random model, equal them
(no size proved that cannot happen); the proved bound on firings must hold for every episode
and not exceed the number of transitions of this acyclic two-transition graph.
"""

from __future__ import annotations

import pytest

from srpo_graph.lang import parse
from srpo_graph.lang.checker import check_module
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task

WF = '''workflow sel
import std
task {{ target: int }}
policy tiny = "tiny"
agent r {{
  policy: tiny
  prompt: "<r>{{task.target}}"
  sample {{ max_tokens: {max_tokens}, allow: ["0", "1", "2"] }}
  output: choices[a, b, c] via std.digit_choices
}}
agent a {{ policy: tiny  prompt: "<a>{{task.target}}"  sample {{ max_tokens: 1 }} }}
agent b {{ policy: tiny  prompt: "<b>{{task.target}}"  sample {{ max_tokens: 1 }} }}
agent c {{ policy: tiny  prompt: "<c>{{task.target}}"  sample {{ max_tokens: 1 }} }}
transition dispatch {{ consume: r  activate: route r }}
transition gather {{ consume: a, b, c  activate: end }}
start: r
'''


@pytest.mark.parametrize("max_tokens, sizes", [(1, (1,)), (2, (1, 2)), (3, (1, 2, 3))])
def test_proved_sizes_and_bound_match_the_runtime(tiny_backend, max_tokens, sizes):
    result = check_module(parse(WF.format(max_tokens=max_tokens)))
    wf = result.workflow
    assert wf.transition_by_name["gather"].set_sizes == sizes
    assert result.max_firings == 2 and result.bound_reason == "the graph is acyclic"
    tasks = [Task(id=f"t{i}", fields={"target": i}) for i in range(8)]
    eps = run(wf, tasks, {"tiny": tiny_backend}, samples=8, seed=max_tokens).episodes
    observed = set()
    for ep in eps:
        assert ep.status == "ok", ep.error
        assert len(ep.transitions) <= result.max_firings
        observed |= {len(t.consumed) for t in ep.transitions if t.name == "gather"}
    assert observed == set(sizes)
