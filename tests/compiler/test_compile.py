"""compile(): packing, event atomicity, drops, validation errors, and save/load round trips."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.errors import CompileError


def _with_output(ep, j, **update):
    outs = list(ep.outputs)
    outs[j] = outs[j].model_copy(update=update)
    return ep.model_copy(update={"outputs": outs})


def _with_transition(ep, k, **update):
    trs = list(ep.transitions)
    trs[k] = trs[k].model_copy(update=update)
    return ep.model_copy(update={"transitions": trs})


def check_round_trip(episodes, batch: SetBatch) -> None:
    """Every consumed output of every kept episode is in the batch, token for token, once."""
    by_episode = {f"{ep.group_id}/{ep.sample}": ep for ep in episodes if ep.status != "failed"}
    seen = set()
    for m in range(batch.num_members):
        s = int(batch.member_set[m])
        ep = by_episode[batch.episode_ids[int(batch.set_episode[s])]]
        out = next(o for o in ep.outputs if o.id == batch.member_ids[m])
        a, b = int(batch.member_offsets[m]), int(batch.member_offsets[m + 1])
        assert batch.input_ids[a:b].tolist() == out.prompt_ids + out.completion_ids
        assert batch.position_ids[a:b].tolist() == list(range(b - a))
        assert batch.loss_mask[a:b].tolist() == [False] * len(out.prompt_ids) + [True] * len(out.completion_ids)
        got = batch.sampler_logprobs[a:b][batch.loss_mask[a:b]].tolist()
        assert got == pytest.approx(out.logprobs, abs=1e-6)
        tr = next(t for t in ep.transitions if t.id == batch.set_ids[s])
        assert tr.consumed[int(batch.member_index[m])] == out.id
        assert batch.policies[int(batch.member_policy[m])] == out.policy
        assert batch.agents[int(batch.member_agent[m])] == out.agent
        seen.add((ep.group_id, ep.sample, out.id))
    consumed = {(ep.group_id, ep.sample, c) for ep in by_episode.values() for t in ep.transitions for c in t.consumed}
    assert seen == consumed


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tasks=st.integers(1, 3), samples=st.integers(1, 4),
       max_set=st.integers(1, 5), budget=st.integers(0, 120))
def test_compile_save_load_loses_no_token_or_id(tmp_path_factory, seed, tasks, samples, max_set, budget):
    eps = synthetic_episodes(tasks, samples, seed=seed, max_set=max_set)
    b = compile(eps, CompileConfig(micro_batch_tokens=budget))
    path = tmp_path_factory.mktemp("rt") / "b.safetensors"
    b.save(path)
    c = SetBatch.load(path)
    for name, t in b.tensors().items():
        assert torch.equal(t, getattr(c, name)), name
    assert c.header() == b.header()
    check_round_trip(eps, c)
    # structure: members of a set adjacent, micro-batches non-decreasing, sizes agree
    assert torch.all(b.member_set[1:] >= b.member_set[:-1])
    assert torch.all(b.micro_batch[1:] >= b.micro_batch[:-1])
    assert torch.equal(b.set_size, torch.bincount(b.member_set, minlength=b.num_sets))
    assert torch.equal(b.set_size, b.set_expected_size)


def test_prestate_and_expected_size():
    eps = synthetic_episodes(2, 2, seed=4, max_events=3)
    # two transitions whose members were generated from the same state share a pre-state
    ep0 = eps[0]
    if len(ep0.transitions) >= 2:
        outs = [o.model_copy(update={"step": 0}) for o in ep0.outputs]
        eps[0] = ep0.model_copy(update={"outputs": outs})
    b = compile(eps)
    want = {}
    for s in range(b.num_sets):
        e = int(b.set_episode[s])
        ep = eps[e]
        tr = next(t for t in ep.transitions if t.id == b.set_ids[s])
        step = min(o.step for o in ep.outputs if o.id in tr.consumed)
        want.setdefault((e, step), set()).add(int(b.set_prestate[s]))
    assert all(len(v) == 1 for v in want.values())
    assert len({p for v in want.values() for p in v}) == len(want)  # one id per (episode, step)
    assert b.set_expected_size.tolist() == [len(t.consumed) for ep in eps for t in ep.transitions]


def test_missing_or_aborted_member_drops_the_whole_event():
    eps = synthetic_episodes(1, 3, seed=5, max_events=2)
    full = compile(eps)
    bad = _with_transition(eps[0], 0, consumed=eps[0].transitions[0].consumed + ["ghost"])
    b = compile([bad] + eps[1:])
    assert b.stats.dropped_incomplete_events == 1
    assert b.num_sets == full.num_sets - 1
    ab = _with_output(eps[1], 0, finish_reason="abort")
    assert compile([eps[0], ab, eps[2]]).stats.dropped_incomplete_events == 1
    with pytest.raises(CompileError, match=r"transitions\[0\]\.consumed"):
        compile([bad], CompileConfig(missing_member="error"))


def test_failed_episodes_are_excluded_and_counted():
    eps = synthetic_episodes(1, 3, seed=6)
    failed = eps[0].model_copy(update={"status": "failed", "error": "tool crashed"})
    b = compile([failed] + eps[1:])
    assert b.stats.failed_episodes == 1 and len(b.episode_ids) == 2
    check_round_trip([failed] + eps[1:], b)


BAD = [
    (
        "logprobs length",
        lambda ep: _with_output(ep, 0, logprobs=ep.outputs[0].logprobs + [-1.0]),
        r"outputs\[0\]\.logprobs",
    ),
    (
        "nan logprob",
        lambda ep: _with_output(ep, 1, logprobs=[math.nan] * len(ep.outputs[1].logprobs)),
        r"outputs\[1\]\.logprobs\[0\]",
    ),
    (
        "positive logprob",
        lambda ep: _with_output(ep, 0, logprobs=[0.5] * len(ep.outputs[0].logprobs)),
        r"outputs\[0\]\.logprobs\[0\]",
    ),
    ("schema", lambda ep: ep.model_copy(update={"schema_": "srpo-graph.trace/0"}), r"field schema"),
    ("reward", lambda ep: ep.model_copy(update={"reward": math.inf}), r"field reward"),
    ("negative id", lambda ep: _with_output(ep, 0, prompt_ids=[-3, 1]), r"outputs\[0\]\.prompt_ids"),
    ("temperature", lambda ep: _with_output(ep, 0, temperature=-1.0), r"outputs\[0\]\.temperature"),
    ("empty prompt", lambda ep: _with_output(ep, 0, prompt_ids=[]), r"outputs\[0\]\.prompt_ids"),
    ("outside allowed", lambda ep: _with_output(ep, 0, allowed_token_ids=[999]), r"outputs\[0\]\.completion_ids"),
    ("duplicate id", lambda ep: _with_output(ep, 1, id=ep.outputs[0].id), r"outputs\[1\]\.id"),
    (
        "consumed twice",
        lambda ep: _with_transition(ep, 1, consumed=[ep.transitions[0].consumed[0]]),
        r"transitions\[1\]\.consumed",
    ),
]


@pytest.mark.parametrize("name,corrupt,field", BAD, ids=[b[0] for b in BAD])
def test_bad_traces_are_rejected_naming_the_episode_and_field(name, corrupt, field):
    eps = synthetic_episodes(1, 2, seed=9, max_events=2, max_set=3)
    eps = [
        e
        for e in synthetic_episodes(3, 2, seed=9, max_events=3, max_set=3)
        if len(e.outputs) >= 2 and len(e.transitions) >= 2
    ][:1] or eps
    ep = eps[0]
    with pytest.raises(CompileError, match=field) as info:
        compile([ep, corrupt(ep)], where=["t.jsonl:1", "t.jsonl:2"])
    assert str(info.value).startswith("t.jsonl:2: error: field ")
    with pytest.raises(CompileError, match="episode 0"):
        compile([corrupt(ep)])


def test_greedy_temperature_zero_is_recorded_as_one():
    ep = synthetic_episodes(1, 1, seed=1)[0]
    b = compile([_with_output(ep, 0, temperature=0.0)])
    assert float(b.member_temperature[0]) == 1.0


def test_policy_order_is_fixed_by_config():
    eps = synthetic_episodes(1, 2, seed=1, policies=("p0", "p1"))
    b = compile(eps, CompileConfig(policies=("p1", "p0", "unused")))
    assert b.policies[:2] == ["p1", "p0"]
    check_round_trip(eps, b)
