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


def ref_returns(ep, gamma=1.0):
    """Independent reference: provenance arcs, Floyd-Warshall hop counts, then the sum."""
    parent = {o.id: o.activated_by for o in ep.outputs}
    ids = [t.id for t in ep.transitions]
    inf = float("inf")
    dist = {(a, b): 0 if a == b else inf for a in ids for b in ids}
    for t in ep.transitions:
        for c in t.consumed:
            if parent.get(c) is not None:
                dist[(parent[c], t.id)] = min(dist[(parent[c], t.id)], 1)
    for k in ids:
        for a in ids:
            for b in ids:
                dist[(a, b)] = min(dist[(a, b)], dist[(a, k)] + dist[(k, b)])
    r = {t.id: t.reward or 0.0 for t in ep.transitions}
    terminal = ep.reward - sum(r.values())
    out = {}
    for a in ids:
        reach = [b for b in ids if dist[(a, b)] < inf]
        out[a] = sum(gamma ** dist[(a, b)] * r[b] for b in reach) + gamma ** max(dist[(a, b)] for b in reach) * terminal
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.5])
@pytest.mark.parametrize("mode", list(AdvantageMode))
def test_compiled_advantages_match_a_loop_over_episodes(mode, gamma):
    eps = _table(1)
    b = compile(eps, CompileConfig(advantage=mode, gamma=gamma, micro_batch_tokens=0))
    rows = []  # (key, value, episode, event) per unit
    n_event = 0
    for e_i, ep in enumerate(eps):
        agents = {o.id: o.agent for o in ep.outputs}
        ret = ref_returns(ep, gamma)
        for t in ep.transitions:
            if mode is AdvantageMode.TRANSITION:
                rows.append(((ep.group_id, t.name), ret[t.id], e_i, n_event))
            elif mode is AdvantageMode.AGENT:  # Dr. MAS: one unit per member, group (task, agent)
                rows += [((ep.group_id, agents[c]), ret[t.id], e_i, n_event) for c in t.consumed]
            else:
                rows.append(((ep.group_id,), ep.reward, e_i, n_event))
            n_event += 1
    if mode is AdvantageMode.EPISODE:
        per_ep = {e: (k, v) for k, v, e, _ in rows}
        order = sorted(per_ep)
        adv_ep = loop_normalize([per_ep[e][1] for e in order], [per_ep[e][0] for e in order])
        want_member = None
        want = [adv_ep[order.index(e)] for _, _, e, _ in rows]
    else:
        unit_adv = loop_normalize([v for _, v, _, _ in rows], [k for k, _, _, _ in rows])
        want_member = unit_adv
        by_event: dict[int, list[float]] = {}
        for (_, _, _, ev), a in zip(rows, unit_adv):
            by_event.setdefault(ev, []).append(a)
        want = [sum(v) / len(v) for _, v in sorted(by_event.items())]
    assert b.set_advantage.tolist() == pytest.approx(want, abs=1e-5)
    if want_member is not None and mode is AdvantageMode.AGENT:
        assert b.member_advantage.tolist() == pytest.approx(want_member, abs=1e-5)
    else:  # one advantage per set, carried by every member
        assert torch.equal(b.member_advantage, b.set_advantage[b.member_set])
    if mode is AdvantageMode.TRANSITION:  # zero mean within each group the compiler reports
        for g in set(b.set_group.tolist()):
            assert abs(float(b.set_advantage[b.set_group == g].double().mean())) < 1e-5


def test_dr_mas_members_of_one_set_get_their_own_agents_statistics():
    # 3 episodes of one task; each event is the set {a, b}; a's outputs and b's outputs are
    # normalized separately, so within a set the two advantages differ
    ev = EventTable(returns=[1.0, 0.0, 2.0], episode=[0, 1, 2], group=["g"] * 3, transition=["t"] * 3,
                    members=[["a", "b"], ["a", "b"], ["a", "b"]], episode_reward=[1.0, 0.0, 2.0])
    a = compute_advantages(ev, AdvantageMode.AGENT)
    same = compute_advantages(ev, AdvantageMode.TRANSITION)
    assert a.member_advantage.tolist() == pytest.approx([0.0, 0.0, -1.0, -1.0, 1.0, 1.0], abs=1e-5)
    assert a.advantage.tolist() == pytest.approx(same.advantage.tolist(), abs=1e-6)
    # agents with different rows: a appears in every event, b only in two
    ev2 = EventTable(returns=[1.0, 0.0, 2.0], episode=[0, 1, 2], group=["g"] * 3, transition=["t"] * 3,
                     members=[["a", "b"], ["a"], ["a", "b"]], episode_reward=[1.0, 0.0, 2.0])
    a2 = compute_advantages(ev2, AdvantageMode.AGENT)
    b_rows = loop_normalize([1.0, 2.0], ["b", "b"])
    assert a2.member_advantage.tolist() == pytest.approx([0.0, b_rows[0], -1.0, 1.0, b_rows[1]], abs=1e-5)
    assert a2.advantage[0].item() == pytest.approx((0.0 + b_rows[0]) / 2, abs=1e-6)


def test_turn_grouping_and_singleton_baseline():
    # a loop: episode 0 fires t twice, episode 1 once; pooled puts 3 firings in one group,
    # turn grouping puts turn 1 of episode 0 alone (a singleton)
    ev = EventTable(returns=[1.0, 0.5, 0.0], episode=[0, 0, 1], group=["g"] * 3, transition=["t"] * 3,
                    members=[["s"], ["s"], ["s"]], episode_reward=[1.0, 0.0], turn=[0, 1, 0],
                    member_turn=[[0], [1], [0]])
    pooled = compute_advantages(ev)
    assert pooled.num_singleton_groups == 0
    assert pooled.advantage.tolist() == pytest.approx(loop_normalize([1.0, 0.5, 0.0], ["g"] * 3), abs=1e-5)
    turn = compute_advantages(ev, grouping="turn")
    assert turn.num_singleton_groups == 1 and turn.singleton_set.tolist() == [False, True, False]
    assert turn.advantage[1].item() == 0.0
    assert turn.advantage[0].item() == pytest.approx(loop_normalize([1.0, 0.0], ["g", "g"])[0], abs=1e-5)
    base = compute_advantages(ev, grouping="turn", singleton_baseline="episode")
    episode_adv = loop_normalize([1.0, 0.0], ["g", "g"])
    assert base.advantage[1].item() == pytest.approx(episode_adv[0], abs=1e-5)  # its episode's advantage
    assert base.advantage[0].item() == turn.advantage[0].item()  # non-singletons unchanged
    # agent mode by turn too: the agent's k-th output
    agent_turn = compute_advantages(ev, AdvantageMode.AGENT, grouping="turn")
    assert agent_turn.num_singleton_groups == 1


def test_episode_return_mode_ignores_transition_rewards_split():
    eps = _table(2)
    b = compile(eps, CompileConfig(returns="episode"))
    for s in range(b.num_sets):
        assert float(b.set_reward[s]) == pytest.approx(float(b.episode_reward[int(b.set_episode[s])]))


def test_zero_variance_groups_are_counted_and_can_be_dropped():
    ev = EventTable(returns=[1.0, 1.0, 0.0, 2.0], episode=[0, 1, 0, 1], group=["g"] * 4,
                    transition=["t", "t", "u", "u"], members=[["a"]] * 4, episode_reward=[1.0, 3.0])
    a = compute_advantages(ev)
    assert a.num_zero_variance_groups == 1 and a.zero_variance_set.tolist() == [True, True, False, False]
    assert a.advantage[:2].tolist() == [0.0, 0.0]
    eps = _table(3)
    kept = compile(eps, CompileConfig(drop_zero_variance=True))
    full = compile(eps)
    assert kept.stats.dropped_zero_variance_events == full.stats.zero_variance_events
    assert kept.num_sets == full.num_sets - full.stats.zero_variance_events
    assert not (kept.set_advantage == 0).any() or full.stats.zero_variance_events == 0


def test_without_std_is_dr_grpo_centering():
    ev = EventTable(returns=[1.0, 0.0, 0.0, 0.0], episode=[0, 1, 2, 3], group=["g"] * 4,
                    transition=["t"] * 4, members=[["a"]] * 4, episode_reward=[1.0, 0.0, 0.0, 0.0])
    a = compute_advantages(ev, use_std=False)
    assert a.advantage.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert math.isclose(float(compute_advantages(ev).advantage[0]), 0.75 / 0.5, rel_tol=1e-5)
