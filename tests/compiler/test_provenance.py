"""Credit by provenance on real runtime traces, and the episode-status rules.

The runtime records which firing activated each output (``Output.activated_by``); the
compiler credits an event with its own reward, its causal descendants' rewards and the
terminal reward. Two independent branches never share credit (the old reward-to-go credited
the branch declared first with the other branch's later reward).
"""

from __future__ import annotations

import json

import pytest

from srpo_graph.compiler.compile import CompileConfig, activators, compile
from srpo_graph.lang import load_workflow
from srpo_graph.runtime.executor import run
from srpo_graph.runtime.tasks import Task
from srpo_graph.runtime.trace import Episode, Output, TransitionRecord, WorkflowRef

DIGITS = '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]'

BRANCHES = f"""
workflow branches "two independent branches, each rewarded on its own, then a closer"
import std
task {{ target: int }}
policy tiny = "tiny"
agent a {{
  policy: tiny
  prompt: "<a>{{task.target}}"
  sample {{ temperature: 1.0, max_tokens: 1, allow: {DIGITS} }}
  output: int via std.digit
}}
agent b {{
  policy: tiny
  prompt: "<b>{{task.target}}"
  sample {{ temperature: 1.0, max_tokens: 1, allow: {DIGITS} }}
  output: int via std.digit
}}
agent c {{
  policy: tiny
  prompt: "<c>{{task.target}}{{b}}"
  sample {{ temperature: 1.0, max_tokens: 1, allow: {DIGITS} }}
  output: int via std.digit
}}
transition ta {{
  consume: a
  reward: std.equals(a, task.target)
  activate: end
}}
transition tb {{
  consume: b
  reward: std.equals(b, task.target)
  activate: c
}}
transition tc {{
  consume: c
  reward: std.equals(c, task.target)
  activate: end
}}
start: a, b
max_steps: 4
"""


@pytest.fixture(scope="module")
def branch_episodes(tmp_path_factory, tiny_backend):
    path = tmp_path_factory.mktemp("wf") / "branches.wf"
    path.write_text(BRANCHES)
    wf = load_workflow(path)
    tasks = [Task(id=f"t{i}", fields={"target": i}) for i in range(4)]
    return run(wf, tasks, {"tiny": tiny_backend}, samples=16, seed=3).episodes


def test_parallel_branches_do_not_share_credit(branch_episodes):
    b = compile(branch_episodes, CompileConfig(micro_batch_tokens=0))
    by_id = {}
    for ep in branch_episodes:
        r = {t.name: t.reward for t in ep.transitions}
        by_id[f"{ep.group_id}/{ep.sample}"] = r
    checked = {"ta": 0, "tb": 0, "tc": 0}
    for s in range(b.num_sets):
        name = b.transitions[int(b.set_transition[s])]
        r = by_id[b.episode_ids[int(b.set_episode[s])]]
        want = {"ta": r["ta"], "tb": r["tb"] + r.get("tc", 0.0), "tc": r.get("tc", 0.0)}[name]
        assert float(b.set_reward[s]) == pytest.approx(want), (name, r)
        checked[name] += 1
    assert min(checked.values()) > 10
    # the class of the old bug: some episode where b's branch scored and a's did not
    assert any(r["ta"] == 0 and r["tb"] + r.get("tc", 0) > 0 for r in by_id.values())


def test_recorded_provenance_equals_the_inferred_one(branch_episodes):
    """Traces without ``activated_by`` (older files) get the same arcs by inference."""
    for ep in branch_episodes:
        data = json.loads(ep.to_json())
        for o in data["outputs"]:
            o.pop("activated_by")
        bare = Episode.model_validate(data)
        assert activators(bare) == activators(ep)
        assert any(v is not None for v in activators(ep).values())  # tb activated c


def _ep(status="ok", reward=1.0, sample=0, transitions=None, outputs=None):
    outputs = outputs or [Output(id="o0", agent="s", policy="p", step=0, prompt_ids=[1], completion_ids=[2],
                                 logprobs=[-0.5], text="", activated_by=None)]
    transitions = transitions if transitions is not None else [
        TransitionRecord(id="t0", name="t", step=0, consumed=["o0"], activated=["end"], reward=None)]
    return Episode(workflow=WorkflowRef(name="w", hash="0" * 64), task_id="q", group_id="q", sample=sample, seed=0,
                   outputs=outputs, transitions=transitions, reward=reward, status=status)


def _loop(sample: int, rewards: list[float], terminal: float) -> Episode:
    """A multi-turn loop: turn k's output is activated by turn k-1's firing."""
    outs, trs = [], []
    for k, r in enumerate(rewards):
        outs.append(Output(id=f"o{k}", agent="s", policy="p", step=k, prompt_ids=[1], completion_ids=[2],
                           logprobs=[-0.5], text="", activated_by=None if k == 0 else f"t{k - 1}"))
        trs.append(TransitionRecord(id=f"t{k}", name="search", step=k, consumed=[f"o{k}"],
                                    activated=["end"] if k == len(rewards) - 1 else ["s"], reward=r))
    return _ep(reward=terminal + sum(rewards), sample=sample, transitions=trs, outputs=outs)


def test_loop_returns_are_discounted_per_hop():
    ep = _loop(0, [1.0, 0.0, 2.0], terminal=4.0)
    b = compile([ep], CompileConfig(gamma=0.5))
    assert b.set_reward.tolist() == pytest.approx([1 + 0.25 * 2 + 0.25 * 4, 0.5 * 2 + 0.5 * 4, 2 + 4])
    b1 = compile([ep])
    assert b1.set_reward.tolist() == pytest.approx([7.0, 6.0, 6.0])


def test_turn_grouping_counts_singletons_on_loops():
    eps = [_loop(0, [1.0, 0.0, 2.0], 0.0), _loop(1, [0.0, 1.0], 0.0), _loop(2, [1.0], 1.0)]
    pooled = compile(eps)
    turn = compile(eps, CompileConfig(grouping="turn"))
    assert pooled.stats.singleton_groups == 0
    assert turn.stats.advantage_groups == 3 and turn.stats.singleton_groups == 1  # turn 2: one rollout
    late = [s for s in range(turn.num_sets) if turn.set_ids[s] == "t2"]
    assert [float(turn.set_advantage[s]) for s in late] == [0.0]
    based = compile(eps, CompileConfig(grouping="turn", singleton_baseline="episode"))
    assert float(based.set_advantage[late[0]]) != 0.0  # the episode-level group's advantage instead
    assert based.stats.singleton_events == 1


def test_truncated_and_failed_episodes_are_explicit():
    eps = [_ep("ok", 1.0, 0), _ep("truncated", 1.0, 1), _ep("failed", 0.0, 2), _ep("ok", 0.0, 3)]
    keep = compile(eps)
    assert keep.stats.truncated_episodes == 1 and keep.stats.failed_episodes == 1
    assert keep.stats.dropped_failed_episodes == 1 and keep.num_sets == 3
    assert keep.set_truncated.tolist() == [False, True, False]
    assert keep.episode_status.tolist() == [0, 1, 0]
    drop = compile(eps, CompileConfig(truncated="drop"))
    assert drop.num_sets == 2 and drop.stats.dropped_truncated_episodes == 1
    pen = compile(eps, CompileConfig(truncated="penalize", truncated_penalty=2.0))
    assert pen.stats.penalized_truncated_episodes == 1
    assert pen.set_reward.tolist() == pytest.approx([1.0, -1.0, 0.0])
    zero = compile(eps, CompileConfig(failed="zero"))
    assert zero.num_sets == 4 and zero.stats.zeroed_failed_episodes == 1
    assert zero.set_reward.tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert zero.episode_status.tolist() == [0, 1, 2, 0]
    # the zeroed failure now counts in its group: the group mean moves
    assert float(zero.set_advantage[0]) != pytest.approx(float(keep.set_advantage[0]))
    # saved and loaded with the batch
    assert zero.select_sets([2]).set_truncated.tolist() == [False]
