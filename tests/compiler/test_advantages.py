"""Vectorized advantages against a plain Python loop; zero mean within each group."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from srpo_graph.compiler.advantages import AdvantageMode, EventTable, compute_advantages, normalize
from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes


def loop_normalize(values, groups, use_std=True, eps=1e-6, unbiased=True):
    out = []
    for v, g in zip(values, groups):
        members = [x for x, h in zip(values, groups) if h == g]
        mean = sum(members) / len(members)
        if len(members) < 2:
            out.append(0.0)
            continue
        std = statistics.stdev(members) if unbiased else statistics.pstdev(members)
        if std <= 1e-8:
            out.append(0.0)
        else:
            out.append((v - mean) / (std + eps) if use_std else v - mean)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 1.0, 0.5, 2.0, -1.0])), min_size=1, max_size=40),
       st.booleans(), st.booleans())
def test_normalize_matches_loop_and_has_zero_group_mean(pairs, use_std, unbiased):
    groups = [g for g, _ in pairs]
    values = [v for _, v in pairs]
    remap = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    gi = torch.tensor([remap[g] for g in groups])
    adv, zero = normalize(torch.tensor(values, dtype=torch.float64), gi, len(remap), use_std=use_std, unbiased=unbiased)
    want = loop_normalize(values, groups, use_std, unbiased=unbiased)
    assert adv.tolist() == pytest.approx(want, abs=1e-9)
    for g in set(groups):
        in_g = [a for a, h in zip(adv.tolist(), groups) if h == g]
        assert abs(sum(in_g) / len(in_g)) < 1e-9
    assert int(zero.sum()) == sum(1 for g in set(groups) if len({v for v, h in zip(values, groups) if h == g}) == 1)


def _table(batch_seed=0):
    eps = synthetic_episodes(4, 5, seed=batch_seed)
    return eps


@pytest.mark.parametrize("mode", list(AdvantageMode))
def test_compiled_advantages_match_a_loop_over_episodes(mode):
    eps = _table(1)
    b = compile(eps, CompileConfig(advantage=mode, micro_batch_tokens=0))
    # recompute plainly from the episodes
    rows = []  # (key, value, unit) per event
    for e_i, ep in enumerate(eps):
        terminal = ep.reward - sum(t.reward or 0.0 for t in ep.transitions)
        agents = {o.id: o.agent for o in ep.outputs}
        for t in ep.transitions:
            rtg = terminal + sum(u.reward or 0.0 for u in ep.transitions if u.step >= t.step)
            if mode is AdvantageMode.TRANSITION:
                rows.append(((ep.group_id, t.name), rtg, None))
            elif mode is AdvantageMode.AGENT:
                rows.append(((ep.group_id, "+".join(sorted(agents[c] for c in t.consumed))), rtg, None))
            else:
                rows.append(((ep.group_id,), ep.reward, e_i))
    if mode is AdvantageMode.EPISODE:
        per_ep = {}
        for key, v, e in rows:
            per_ep[e] = (key, v)
        keys = [per_ep[e][0] for e in sorted(per_ep)]
        adv_ep = loop_normalize([per_ep[e][1] for e in sorted(per_ep)], keys)
        want = [adv_ep[sorted(per_ep).index(e)] for _, _, e in rows]
    else:
        want = loop_normalize([v for _, v, _ in rows], [k for k, _, _ in rows])
    assert b.set_advantage.tolist() == pytest.approx(want, abs=1e-5)
    # zero mean within each group the compiler reports
    for g in set(b.set_group.tolist()):
        if mode is not AdvantageMode.EPISODE:
            assert abs(float(b.set_advantage[b.set_group == g].double().mean())) < 1e-5


def test_episode_return_mode_ignores_transition_rewards_split():
    eps = _table(2)
    b = compile(eps, CompileConfig(returns="episode"))
    for s in range(b.num_sets):
        assert float(b.set_reward[s]) == pytest.approx(float(b.episode_reward[int(b.set_episode[s])]))


def test_zero_variance_groups_are_counted_and_can_be_dropped():
    ev = EventTable(returns=[1.0, 1.0, 0.0, 2.0], episode=[0, 1, 0, 1], group=["g"] * 4,
                    transition=["t", "t", "u", "u"], agents=["a"] * 4, episode_reward=[1.0, 3.0])
    a = compute_advantages(ev)
    assert a.num_zero_variance_groups == 1 and a.zero_variance_set.tolist() == [True, True, False, False]
    assert a.advantage[:2].tolist() == [0.0, 0.0]
    eps = _table(3)
    kept = compile(eps, CompileConfig(drop_zero_variance=True))
    full = compile(eps)
    assert kept.stats["dropped_zero_variance_events"] == full.stats["zero_variance_events"]
    assert kept.num_sets == full.num_sets - full.stats["zero_variance_events"]
    assert not (kept.set_advantage == 0).any() or full.stats["zero_variance_events"] == 0


def test_without_std_is_dr_grpo_centering():
    ev = EventTable(returns=[1.0, 0.0, 0.0, 0.0], episode=[0, 1, 2, 3], group=["g"] * 4,
                    transition=["t"] * 4, agents=["a"] * 4, episode_reward=[1.0, 0.0, 0.0, 0.0])
    a = compute_advantages(ev, use_std=False)
    assert a.advantage.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert math.isclose(float(compute_advantages(ev).advantage[0]), 0.75 / 0.5, rel_tol=1e-5)
