"""The executor on the real tiny model: active sets, exact tokens, isolation, failures, bounds."""

from __future__ import annotations

import pytest
import torch

from srpo_graph.runtime.executor import run
from srpo_graph.runtime.render import State, render
from srpo_graph.runtime.trace import Episode
from tests.support import workflows as wfs


def by_id(ep: Episode):
    return {o.id: o for o in ep.outputs}


def test_fixed_pipeline_sets_of_one(tiny_backend, coord_tasks):
    res = run(wfs.coord_seq(), coord_tasks, {"tiny": tiny_backend}, samples=4, seed=3)
    assert res.stats.episodes == 24 and res.stats.failures == 0 and res.stats.truncated == 0
    assert res.stats.generate_calls == 2  # every episode's `a` in one batch, then every `b`
    for ep in res.episodes:
        outs = by_id(ep)
        assert [o.agent for o in ep.outputs] == ["a", "b"] and ep.status == "ok"
        assert [(t.name, [outs[c].agent for c in t.consumed], t.activated) for t in ep.transitions] == [
            ("hand_off", ["a"], ["b"]), ("score", ["b"], ["end"])]
        a, b = ep.outputs
        target = int(ep.task_id[1:])
        assert (a.step, b.step) == (0, 1)
        assert ep.transitions[1].reward == float(b.value == target)
        assert ep.reward == float((a.value + b.value) % 10 == target % 10) + ep.transitions[1].reward
        assert b.prompt_ids == tiny_backend.tokenizer(f"<b>{target}<sep>{a.value}")["input_ids"]


def test_mixed_workflow_set_of_three_then_one(tiny_backend, coord_tasks):
    res = run(wfs.coord_mixed(), coord_tasks[:3], {"tiny": tiny_backend}, samples=3, seed=0)
    for ep in res.episodes:
        outs = by_id(ep)
        gather, finish = ep.transitions
        assert sorted(outs[c].agent for c in gather.consumed) == ["a", "b", "c"] and gather.activated == ["d"]
        assert [outs[c].agent for c in finish.consumed] == ["d"] and finish.activated == ["end"]
        assert all(outs[c].step == 0 for c in gather.consumed) and outs[finish.consumed[0]].step == 1


def test_routed_workflow_follows_the_router_only(tiny_backend, coord_tasks):
    res = run(wfs.coord_routed(), coord_tasks, {"tiny": tiny_backend}, samples=4, seed=5)
    seen = set()
    for ep in res.episodes:
        outs = by_id(ep)
        for t in ep.transitions:
            assert len(t.consumed) == 1
            if t.name == "route":
                choice = outs[t.consumed[0]].value
                assert t.activated == [choice] if choice in ("a", "b") else t.activated == ["end"]
                seen.add(tuple(t.activated))
            else:
                assert t.activated == ["r"]
        if ep.status == "ok":
            assert ep.transitions[-1].activated == ["end"]
        else:  # only max_steps (12) can stop it
            assert ep.status == "truncated" and len(ep.transitions) == 12
    assert seen == {("a",), ("b",), ("end",)}  # all three routes exercised


def test_max_rounds_truncates_and_keeps_the_episode(tiny_backend, coord_tasks):
    res = run(wfs.coord_routed(max_rounds=1), coord_tasks, {"tiny": tiny_backend}, samples=4, seed=5)
    statuses = {ep.status for ep in res.episodes}
    assert statuses == {"ok", "truncated"}
    for ep in res.episodes:
        assert [t.name for t in ep.transitions].count("route") == 1
        if ep.status == "truncated":  # routed to a specialist, whose output r could never route again
            assert ep.transitions[-1].name == "back" and ep.transitions[-1].activated == ["r"]
            assert [o.agent for o in ep.outputs] == ["r", ep.transitions[0].activated[0]]
        else:
            assert ep.transitions[0].activated == ["end"]
    assert res.stats.truncated == sum(ep.status == "truncated" for ep in res.episodes)


def test_token_ids_and_logprobs_are_exact(tiny_backend, coord_tasks):
    wf = wfs.coord_seq()
    res = run(wf, coord_tasks[:2], {"tiny": tiny_backend}, samples=3, seed=11)
    tok = tiny_backend.tokenizer
    for ep in res.episodes:
        state = State(task={"target": int(ep.task_id[1:])})
        for out in ep.outputs:
            agent = wf.agent_by_name[out.agent]
            assert out.prompt_ids == tok(render(agent.template, state))["input_ids"]
            assert tok.decode(out.completion_ids, skip_special_tokens=True) == out.text
            allowed = out.allowed_token_ids
            assert allowed == tok.convert_tokens_to_ids(list("0123456789"))
            with torch.no_grad():
                logits = tiny_backend.model(torch.tensor([out.prompt_ids + out.completion_ids])).logits[0]
            row = logits[len(out.prompt_ids) - 1] / out.temperature
            ref = row[out.completion_ids[0]] - torch.logsumexp(row[allowed], 0)
            assert abs(ref.item() - out.logprobs[0]) < 1e-5
            state.values[out.agent] = out.value


def _key(ep: Episode):
    d = ep.model_dump()
    lps = [lp for o in d["outputs"] for lp in o.pop("logprobs")]
    return d, lps


@pytest.mark.parametrize("wf", [wfs.coord_mixed, wfs.coord_routed], ids=["mixed", "routed"])
def test_reproducible_whatever_the_concurrency(tiny_backend, coord_tasks, wf):
    w = wf()
    a = run(w, coord_tasks, {"tiny": tiny_backend}, samples=4, seed=7)
    b = run(w, coord_tasks, {"tiny": tiny_backend}, samples=4, seed=7, max_concurrent=5)
    assert b.stats.generate_calls > a.stats.generate_calls  # really batched differently
    for x, y in zip(a.episodes, b.episodes):
        (dx, lx), (dy, ly) = _key(x), _key(y)
        assert dx == dy and max((abs(p - q) for p, q in zip(lx, ly)), default=0) < 1e-5
    c = run(w, coord_tasks, {"tiny": tiny_backend}, samples=4, seed=8)
    assert [_key(e)[0]["outputs"] for e in c.episodes] != [_key(e)[0]["outputs"] for e in a.episodes]


def test_episodes_do_not_mix(tiny_backend):
    from srpo_graph.runtime.tasks import Task

    tasks = [Task(id=f"t{i}", fields={"target": i}) for i in range(10)]
    res = run(wfs.coord_seq(), tasks, {"tiny": tiny_backend}, samples=5, seed=2)
    tok = tiny_backend.tokenizer
    assert [(e.task_id, e.sample, e.group_id) for e in res.episodes] == [
        (f"t{i}", s, f"t{i}@2") for i in range(10) for s in range(5)]
    for ep in res.episodes:
        target = ep.task_id[1:]
        a, b = ep.outputs
        assert tok.decode(a.prompt_ids, skip_special_tokens=True) == f"<a>{target}"
        # b's prompt holds its own task's target and its own episode's `a` output
        want = f"<a>{target}".replace("<a>", "<b>") + f"<sep>{a.text}"
        assert tok.decode(b.prompt_ids, skip_special_tokens=True) == want


def test_tools_run_and_join_the_state(tiny_backend, coord_tasks):
    res = run(wfs.with_tool("failing_tools", "note"), coord_tasks, {"tiny": tiny_backend}, samples=3, seed=1)
    tok = tiny_backend.tokenizer
    for ep in res.episodes:
        a, b = ep.outputs
        note = f"{a.value}+{ep.task_id[1:]}"
        assert ep.status == "ok" and ep.transitions[0].tool_results == {"note": note}
        assert tok.decode(b.prompt_ids, skip_special_tokens=True).endswith("<sep>" + note)


def test_a_failing_tool_fails_only_its_episodes(tiny_backend, coord_tasks):
    res = run(wfs.with_tool("failing_tools", "explode_on_3"), coord_tasks, {"tiny": tiny_backend}, samples=2, seed=1)
    for ep in res.episodes:
        if ep.task_id == "t3":
            assert ep.status == "failed" and "tool broke on purpose" in ep.error and ep.reward == 0.0
            assert [t.name for t in ep.transitions] == []
        else:
            assert ep.status == "ok" and ep.error is None and len(ep.outputs) == 2
    assert res.stats.failures == 2
    Episode.model_validate_json(res.episodes[6].to_json())  # failed episodes still validate


def test_an_unimportable_module_fails_episodes_not_the_run(tiny_backend, coord_tasks):
    res = run(wfs.with_tool("no_such_module_xyz", "note"), coord_tasks[:2], {"tiny": tiny_backend}, samples=2)
    assert {e.status for e in res.episodes} == {"failed"}
    assert all("no_such_module_xyz" in e.error for e in res.episodes)


def test_missing_backend_and_bad_allow_are_errors(tiny_backend, coord_tasks):
    from srpo_graph.errors import RuntimeFailure
    from srpo_graph.workflow import Sampling

    with pytest.raises(RuntimeFailure, match="no backend for policies"):
        run(wfs.coord_seq(), coord_tasks, {}, samples=1)
    wf = wfs.coord_seq()
    bad = wf.model_copy(
        update={"agents": (wf.agents[0].model_copy(update={"sampling": Sampling(allow=("10",))}), wf.agents[1])}
    )
    with pytest.raises(RuntimeFailure, match="not single tokens"):
        run(bad, coord_tasks, {"tiny": tiny_backend}, samples=1)


def test_parallel_agents_sample_independently(tiny_backend):
    # Agents pending in the same round must draw from independent generators. With one shared
    # uniform draw (a bug once) a, b and c take the same quantile of near-identical
    # distributions and agree far more often than the ~1/10 of independent digits.
    from srpo_graph.runtime.tasks import Task

    tasks = [Task(id=f"t{i}", fields={"target": i % 10}) for i in range(40)]
    res = run(wfs.coord_mixed(), tasks, {"tiny": tiny_backend}, samples=8, seed=3)
    pairs = same = 0
    for ep in res.episodes:
        values = {o.agent: o.value for o in ep.outputs if o.agent in ("a", "b", "c")}
        for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
            pairs += 1
            same += values[x] == values[y]
    assert pairs == 960
    assert same / pairs < 0.2, f"{same}/{pairs} equal pairs: parallel draws are correlated"
