"""What `check` proves holds at run time (issue 22, item 1): a property over generated workflows.

Hypothesis writes random ``.wf`` sources from the grammar's constructs -- agents with int,
choice and choices outputs, transitions consuming one or several agents (joins), fixed
activations, routers on a consumed agent (single and multi choice), loops bounded by
``max_rounds``, several start agents, a ``max_steps`` -- parses and checks them (a source the
checker rejects is skipped), then runs each on the real tiny model (the real transformers
backend, in process; one-token completions from ``allow`` lists, so routers take real,
varied labels). Every fired active set must:

* have a size the checker proved for its transition (``Transition.set_sizes``);
* and no episode fails: every unmarked reference a prompt or the terminal reward reads was
  proved produced before it (item 2's data-flow rule; the terminal reward at an ``ok`` end,
  so a truncated episode's terminal reward may still miss a value);
* hold at most one output per consumed agent (the latest: Note [Firing semantics]);
* and an output the runtime superseded must be one `check` warned about (code ``superseded``,
  naming the agent).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from srpo_graph.errors import WorkflowCheckError
from srpo_graph.lang import parse
from srpo_graph.lang.checker import check_module
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task

HEAD = 'workflow g\nimport std\ntask { target: int }\npolicy tiny = "tiny"\n'
LABELS = ("x", "y", "z")


@st.composite
def workflows(draw) -> str:
    n = draw(st.integers(2, 5))
    agents = [f"a{i}" for i in range(n)]
    kinds = {a: draw(st.sampled_from(["int", "choice", "choices"])) for a in agents}
    m = draw(st.integers(1, n))
    # each agent consumed by one transition, in order (t0 consumes a0), so paths mostly run forward
    owner = {a: (i if i < m else draw(st.integers(0, m - 1))) for i, a in enumerate(agents)}
    lines = [HEAD]
    for a in agents:
        out, allow, k = {
            "int": ("int via std.digit", '["0", "1"]', 1),
            "choice": ("choice[x, y] via std.digit_choice", '["0", "1", "2"]', 1),  # "2": unreadable -> end
            "choices": ("choices[x, y, z] via std.digit_choices", '["0", "1", "2"]', 2),
        }[kinds[a]]
        # sometimes the prompt reads another agent, unmarked: `check` must prove it is there
        read = f"{{{draw(st.sampled_from(agents))}}}" if draw(st.integers(0, 3)) == 0 else ""
        lines.append(f'agent {a} {{\n  policy: tiny\n  prompt: "<{a}>{{task.target}}{read}"\n'
                     f'  sample {{ temperature: 1.0, max_tokens: {k}, allow: {allow} }}\n  output: {out}\n}}\n')
    def some_agents(j: int):  # mostly forward (agents of later transitions), sometimes back: a loop
        later = [a for a in agents if owner[a] > j]
        pool = later if later and draw(st.integers(0, 3)) else agents
        return st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True)

    for j in range(m):
        consume = [a for a in agents if owner[a] == j]
        routers = [a for a in consume if kinds[a] != "int"]
        how = draw(st.sampled_from(["fixed", "end", "route"] if routers else ["fixed", "end"]))
        back = False
        if how == "end":
            act = "end"
        elif how == "fixed":
            picked = draw(some_agents(j))
            back = any(owner[a] <= j for a in picked)
            act = ", ".join(picked)
        else:
            on = draw(st.sampled_from(routers))
            labels = LABELS if kinds[on] == "choices" else LABELS[:2]
            cases = []
            for lab in labels:
                if lab != "x" and not draw(st.booleans()):
                    continue  # a label without a case activates `end`
                picked = ["end"] if draw(st.booleans()) else draw(some_agents(j))
                back = back or any(a != "end" and owner[a] <= j for a in picked)
                cases.append(f"{lab} -> {', '.join(picked)}")
            act = f"route {on} {{ {', '.join(cases)} }}"
        # a back edge needs a bound on its cycle; other transitions get one sometimes
        rounds = f"  max_rounds: {draw(st.integers(1, 3))}\n" if back or draw(st.booleans()) else ""
        lines.append(f"transition t{j} {{\n  consume: {', '.join(consume)}\n{rounds}  activate: {act}\n}}\n")
    start = ["a0", *draw(st.lists(st.sampled_from(agents[1:]), max_size=2, unique=True))]
    lines.append(f"start: {', '.join(start)}\nmax_steps: {draw(st.integers(2, 12))}\n")
    ints = [a for a in agents if kinds[a] == "int"]
    if ints and draw(st.booleans()):  # a terminal reward reading an agent, checked at an `ok` end
        lines.append(f"reward: std.equals({draw(st.sampled_from(ints))}, task.target)\n")
    return "".join(lines)


@pytest.fixture(scope="module")
def tasks():
    return [Task(id=f"t{i}", fields={"target": i}) for i in range(2)]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much,
                                                                   HealthCheck.too_slow])
@given(source=workflows(), seed=st.integers(0, 2**16))
def test_every_fired_set_has_a_size_check_proved(tiny_backend, tasks, source, seed):
    try:
        result = check_module(parse(source))
    except WorkflowCheckError:
        assume(False)
        return
    w = result.workflow
    warned = {m.split("activate agent '")[1].split("'")[0] for m in
              (d.message for d in result.warnings if d.code == "superseded")}
    episodes = run(w, tasks, {"tiny": tiny_backend}, samples=4, seed=seed).episodes
    for ep in episodes:
        if ep.status == "failed":
            # the one failure allowed: a truncated episode whose terminal reward reads what only an
            # `ok` end guarantees (the terminal reward also runs on truncation; `check` proves `ok` ends)
            fired = {r.name: sum(x.name == r.name for x in ep.transitions) for r in ep.transitions}
            truncated = len(ep.transitions) >= w.max_steps or any(
                t.max_rounds is not None and fired.get(t.name, 0) >= t.max_rounds for t in w.transitions)
            assert truncated and "terminal reward" in (ep.error or ""), (ep.error, source)
        agent_of = {o.id: o.agent for o in ep.outputs}
        for rec in ep.transitions:
            t = w.transition_by_name[rec.name]
            agents = [agent_of[c] for c in rec.consumed]
            assert len(agents) == len(set(agents)), (rec, source)  # one output per consumed agent
            assert len(rec.consumed) in t.set_sizes, (rec.name, len(rec.consumed), t.set_sizes, source)
            for old in rec.superseded or ():
                assert agent_of[old] in warned, (old, rec, source)


def test_an_agent_activated_twice_before_its_consumer_fires_is_superseded_not_joined(tiny_backend, tasks):
    """t0 activates b and x; t1 (declared before tx) fires on b first and activates x again while
    x's first output is unconsumed. tx then takes the latest x only (a set of 1, as `check` proves),
    and the trace lists the first one as superseded; `check` warned at t1."""
    body = "".join(f'agent {a} {{ policy: tiny  prompt: "<{a}>"  sample {{ max_tokens: 1, allow: ["0", "1"] }}'
                   f"  output: int via std.digit }}\n" for a in "abcx")
    body += ("transition t0 { consume: a  activate: b, x }\ntransition t1 { consume: b  activate: c, x }\n"
             "transition t2 { consume: c  activate: end }\ntransition tx { consume: x  activate: end }\nstart: a\n")
    result = check_module(parse(HEAD + body))
    assert [(d.code, d.span.line) for d in result.warnings] == [("superseded", 10)]
    w = result.workflow
    assert w.transition_by_name["tx"].set_sizes == (1,)
    for ep in run(w, tasks, {"tiny": tiny_backend}, samples=2, seed=1).episodes:
        assert ep.status == "ok"
        tx = next(r for r in ep.transitions if r.name == "tx")
        xs = [o.id for o in ep.outputs if o.agent == "x"]
        assert len(xs) == 2 and tx.consumed == [xs[1]] and tx.superseded == [xs[0]]
