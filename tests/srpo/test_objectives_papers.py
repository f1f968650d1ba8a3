"""Each named objective against its paper's formula, written out here from raw episodes.

Nothing below reads ``OBJECTIVES`` or a config to form its expectation: advantages come from
the episode rewards (the provenance returns of tests/compiler for the event-level ones), the
loss from each paper's equation over the outputs' tokens (shared/reference/objectives.md).
The row under test is compiled and evaluated through the public path
(``OBJECTIVES[name].compile_config()`` -> ``compile`` -> ``srpo_loss``). A wrong preset, a
wrong advantage rule or a wrong return rule makes one of these fail; test_mutation_check.py
shows that for each such change.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from srpo_graph.compiler.compile import compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo import objectives
from srpo_graph.srpo.loss import srpo_loss
from tests.compiler.test_advantages import ref_returns  # the independent provenance reference

KL_SHIFT = 0.1  # ref log-probs = old - KL_SHIFT


def episodes():
    eps = synthetic_episodes(5, 6, seed=21, max_set=3, completion_len=(1, 8), policies=("p0",))
    # agents with different generation budgets (Dr. GRPO's denominator takes the largest)
    budget = {"agent0": 8, "agent1": 12, "agent2": 20}
    eps = [e.model_copy(update={"outputs": [o.model_copy(update={"max_tokens": budget.get(o.agent, 8)})
                                            for o in e.outputs]}) for e in eps]
    # task0: every episode the same reward (a zero-variance group: DAPO drops it)
    return [e.model_copy(update={"reward": 1.0}) if e.group_id == "task0" else e for e in eps]


def delta(key: str, oid: str, t: int) -> float:
    """The current policy's log-ratio on token t of output oid: fixed, pseudo-random in [-0.9, 0.9]."""
    return random.Random(f"{key}|{oid}|{t}").uniform(-0.9, 0.9)  # wide enough for GMPO's 0.4 log clip


def new_logprobs(b):
    new = b.old_logprobs.double().clone()
    mask = b.loss_mask
    for m in range(b.num_members):
        key = b.episode_ids[int(b.set_episode[int(b.member_set[m])])]
        pos = [t for t in range(int(b.member_offsets[m]), int(b.member_offsets[m + 1])) if mask[t]]
        for i, t in enumerate(pos):
            new[t] += delta(key, b.member_ids[m], i)
    return new


def normalize(values: list[float]) -> list[float]:
    """(R - mean) / (sample std + 1e-6); 0 for a group without variance (or of one)."""
    if len(values) < 2 or statistics.stdev(values) <= 1e-8:
        return [0.0] * len(values)
    mu, sd = statistics.mean(values), statistics.stdev(values)
    return [(v - mu) / (sd + 1e-6) for v in values]


def outputs_with_episode_advantage(eps, use_std=True, drop_zero=False):
    """GRPO's view: every output is a response; A = its episode's reward normalized over the task's G."""
    by_task: dict[str, list] = {}
    for e in eps:
        by_task.setdefault(e.group_id, []).append(e)
    rows = []  # (advantage, [token log-ratios], max_tokens)
    for group in by_task.values():
        rewards = [e.reward for e in group]
        if drop_zero and statistics.pstdev(rewards) <= 1e-8:
            continue
        adv = normalize(rewards) if use_std else [r - statistics.mean(rewards) for r in rewards]
        for e, a in zip(group, adv):
            key = f"{e.group_id}/{e.sample}"
            for t in e.transitions:
                for c in t.consumed:
                    o = next(o for o in e.outputs if o.id == c)
                    rows.append((a, [delta(key, o.id, i) for i in range(len(o.completion_ids))], o.max_tokens))
    return rows


def clip_obj(r: float, a: float, lo: float, hi: float) -> float:
    return min(r * a, min(max(r, 1 - lo), 1 + hi) * a)


# ---------------------------------------------------------------------------- the papers' J


def j_srpo(eps, alpha):
    """SRPO: events grouped by (task, transition); rho_e = exp(K^-alpha sum_j sum_u d); mean over events."""
    groups: dict[tuple, list] = {}
    for e in eps:
        ret = ref_returns(e)
        for t in e.transitions:
            groups.setdefault((e.group_id, t.name), []).append((e, t, ret[t.id]))
    total, n = 0.0, 0
    for rows in groups.values():
        for (e, t, _), a in zip(rows, normalize([r for _, _, r in rows])):
            key = f"{e.group_id}/{e.sample}"
            ell = [sum(delta(key, c, i) for i in range(len(next(o for o in e.outputs if o.id == c).completion_ids)))
                   for c in t.consumed]
            L = len(ell) ** (-alpha) * sum(ell)
            total += clip_obj(math.exp(L), a, 0.2, 0.2)
            n += 1
    return total / n


def j_independent(eps):
    """Each output its own ratio exp(sum_u d) and clip, with its set's advantage; mean over outputs."""
    groups: dict[tuple, list] = {}
    for e in eps:
        ret = ref_returns(e)
        for t in e.transitions:
            groups.setdefault((e.group_id, t.name), []).append((e, t, ret[t.id]))
    vals = []
    for rows in groups.values():
        for (e, t, _), a in zip(rows, normalize([r for _, _, r in rows])):
            key = f"{e.group_id}/{e.sample}"
            for c in t.consumed:
                n_tok = len(next(o for o in e.outputs if o.id == c).completion_ids)
                vals.append(clip_obj(math.exp(sum(delta(key, c, i) for i in range(n_tok))), a, 0.2, 0.2))
    return sum(vals) / len(vals)


def j_grpo(eps, kl_beta=0.0):
    """GRPO (arXiv 2402.03300): (1/G) sum_i (1/|o_i|) sum_t {min(r A, clip(r, 0.8, 1.2) A) - beta k3}."""
    rows = outputs_with_episode_advantage(eps)
    total = 0.0
    for a, d, _ in rows:
        per = [clip_obj(math.exp(x), a, 0.2, 0.2) for x in d]
        kl = [math.exp(-KL_SHIFT - x) - (-KL_SHIFT - x) - 1 for x in d]  # k3 with log(ref/pi) = -shift - d
        total += (sum(per) - kl_beta * sum(kl)) / max(len(d), 1)
    return total / len(rows)


def j_dr_grpo(eps):
    """Dr. GRPO (arXiv 2503.20783): no std, no 1/|o_i|; / (outputs x MAX_TOKENS, the largest budget)."""
    rows = outputs_with_episode_advantage(eps, use_std=False)
    total = sum(clip_obj(math.exp(x), a, 0.2, 0.2) for a, d, _ in rows for x in d)
    return total / (len(rows) * max(m for _, _, m in rows))


def j_dapo(eps):
    """DAPO (arXiv 2503.14476): token mean over the batch, clip 0.2 / 0.28, groups with 0 < #correct < G."""
    rows = outputs_with_episode_advantage(eps, drop_zero=True)
    return sum(clip_obj(math.exp(x), a, 0.2, 0.28) for a, d, _ in rows for x in d) / sum(len(d) for _, d, _ in rows)


def j_gspo(eps):
    """GSPO (arXiv 2507.18071): s_i = exp(mean_t d); (1/G) sum_i min(s A, clip(s, 1-3e-4, 1+4e-4) A)."""
    rows = outputs_with_episode_advantage(eps)
    return sum(clip_obj(math.exp(sum(d) / len(d)), a, 3e-4, 4e-4) for a, d, _ in rows) / len(rows)


def j_gmpo(eps):
    """GMPO (arXiv 2507.20673): (1/G) sum_i A exp(mean_t sgn(A) min(sgn(A) d, sgn(A) clip(d, -0.4, 0.4)))."""
    rows = outputs_with_episode_advantage(eps)
    total = 0.0
    for a, d, _ in rows:
        s = -1.0 if a < 0 else 1.0
        total += a * math.exp(sum(s * min(s * x, s * min(max(x, -0.4), 0.4)) for x in d) / len(d))
    return total / len(rows)


def j_cispo(eps):
    """CISPO (arXiv 2506.13585): sum_t sg(clip(r, 0, 1 + 4)) A log pi / tokens (value up to the log pi_old constant)."""
    rows = outputs_with_episode_advantage(eps)
    return sum(min(max(math.exp(x), 0.0), 5.0) * a * x for a, d, _ in rows for x in d) / sum(len(d) for _, d, _ in rows)


def j_dr_mas(eps):
    """Dr. MAS (arXiv 2602.08847, agent-wise normalization): A_{i,k} = (R_i - mu_k) / sigma_k, R_i the
    trajectory's reward, mu_k and sigma_k over agent k's outputs in the task's G trajectories; then
    GRPO's per-output token mean. (Transition rewards are in R_i, not credited per output.)"""
    groups: dict[tuple, list] = {}
    for e in eps:
        key = f"{e.group_id}/{e.sample}"
        for t in e.transitions:
            for c in t.consumed:
                o = next(o for o in e.outputs if o.id == c)
                d = [delta(key, c, i) for i in range(len(o.completion_ids))]
                groups.setdefault((e.group_id, o.agent), []).append((e.reward, d))
    total, n = 0.0, 0
    for rows in groups.values():
        for (_, d), a in zip(rows, normalize([r for r, _ in rows])):
            total += sum(clip_obj(math.exp(x), a, 0.2, 0.2) for x in d) / len(d)
            n += 1
    return total / n


PAPERS = {
    "srpo": lambda eps: j_srpo(eps, 0.5),
    "srpo_sum": lambda eps: j_srpo(eps, 0.0),
    "srpo_mean": lambda eps: j_srpo(eps, 1.0),
    "independent": j_independent,
    "grpo": j_grpo,
    "grpo_kl": lambda eps: j_grpo(eps, kl_beta=0.04),
    "dr_grpo": j_dr_grpo,
    "dapo": j_dapo,
    "gspo": j_gspo,
    "gmpo": j_gmpo,
    "cispo": j_cispo,
    "dr_mas": j_dr_mas,
}


def test_every_objective_has_a_paper_reference():
    assert set(PAPERS) == set(objectives.OBJECTIVES)
    for o in objectives.OBJECTIVES.values():
        assert o.paper.startswith("https://arxiv.org/abs/")


@pytest.mark.parametrize("name", list(PAPERS))
def test_objective_matches_its_paper(name):
    row = objectives.OBJECTIVES[name]  # looked up now: a mutated table is what gets tested
    eps = episodes()
    b = compile(eps, row.compile_config(micro_batch_tokens=0))
    cfg = row.loss_config()
    new = new_logprobs(b)
    ref = (b.old_logprobs.double() - KL_SHIFT) if cfg.kl_coef > 0 else None
    loss, _ = srpo_loss(new, b, cfg, ref_logprobs=ref)
    assert -loss.item() == pytest.approx(PAPERS[name](eps), rel=1e-6, abs=1e-9)
