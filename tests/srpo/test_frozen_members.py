"""Frozen and external agents in active sets (issue 28): what they contribute to the objective.

The rule (docs/algorithm.md, "Frozen members"): a frozen member stays part of its set (the set is
still complete or not with it, and provenance passes through its transitions) but is not packed:
no tokens, no log-ratio, no gradient. K of the K^(-alpha) scale counts trainable members only by
default, every member with ``LossConfig.frozen_in_k``. A firing with no trainable member is not an
event. Checked against a plain loop over the episodes' transitions, written from the rule alone.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from srpo_graph.compiler.compile import compile
from srpo_graph.compiler.options import CompileConfig
from srpo_graph.runtime.trace import Episode, Output, TransitionRecord, WorkflowRef
from srpo_graph.srpo.loss import srpo_loss
from srpo_graph.srpo.options import LossConfig

FROZEN = ("judge",)


def _output(oid: str, agent: str, policy: str, step: int, rng: random.Random, activated_by=None) -> Output:
    n = rng.randint(1, 4)
    return Output(id=oid, agent=agent, policy=policy, policy_version=0, step=step, prompt_ids=[1, 2],
                  completion_ids=[rng.randint(3, 30) for _ in range(n)],
                  logprobs=[-rng.uniform(0.1, 3.0) for _ in range(n)], temperature=1.0, allowed_token_ids=None,
                  text="", value=None, activated_by=activated_by)


def _episode(task: str, sample: int, seed: int) -> Episode:
    """solver_a, solver_b (trained) and judge (frozen): t1 consumes {solver_a, judge_0} (mixed set),
    t2 consumes {judge_1} (frozen only, rewarded), t3 consumes {solver_b} (trained only)."""
    rng = random.Random(seed)
    outs = [_output("o0", "solver_a", "solver", 0, rng), _output("o1", "judge0", "judge", 0, rng),
            _output("o2", "judge1", "judge", 1, rng, activated_by="t1"),
            _output("o3", "solver_b", "solver", 2, rng, activated_by="t2")]
    trans = [TransitionRecord(id="t1", name="t1", step=0, consumed=["o0", "o1"], activated=["judge1"], reward=None),
             TransitionRecord(id="t2", name="t2", step=1, consumed=["o2"], activated=["solver_b"],
                              reward=rng.choice([0.0, 1.0])),
             TransitionRecord(id="t3", name="t3", step=2, consumed=["o3"], activated=["end"],
                              reward=rng.choice([0.0, 0.5]))]
    return Episode(workflow=WorkflowRef(name="w", hash="0" * 64), task_id=task, group_id=task, sample=sample,
                   seed=seed, outputs=outs, transitions=trans, reward=sum(t.reward or 0.0 for t in trans), status="ok")


def _episodes(n_tasks: int = 3, G: int = 4) -> list[Episode]:
    return [_episode(f"task{t}", g, 100 * t + g) for t in range(n_tasks) for g in range(G)]


def _reference_loss(episodes, new_lp: dict[str, list[float]], advantage: dict[tuple[str, str], float],
                    cfg: LossConfig) -> float:
    """The plain loop: each firing with a trainable member is an event; its log-ratio is the sum
    over trainable members and tokens of (new - old), scaled by K^-alpha (K = trainable members, or
    every member with frozen_in_k); one PPO clip; mean over events."""
    terms = []
    for ep in episodes:
        by_id = {o.id: o for o in ep.outputs}
        for t in ep.transitions:
            members = [by_id[c] for c in t.consumed]
            trained = [m for m in members if m.policy not in FROZEN]
            if not trained:
                continue
            total = 0.0
            for m in trained:
                for new, old in zip(new_lp[f"{ep.group_id}/{ep.sample}/{m.id}"], m.logprobs):
                    total += new - old
            K = len(members) if cfg.frozen_in_k else len(trained)
            L = total * K ** (-cfg.alpha)
            rho = math.exp(L)
            A = advantage[(f"{ep.group_id}/{ep.sample}", t.id)]
            clipped = min(max(rho, 1 - cfg.eps_low), 1 + cfg.eps_high)
            terms.append(min(rho * A, clipped * A))
    return -sum(terms) / len(terms)


@pytest.mark.parametrize("frozen_in_k", [False, True])
def test_loss_matches_the_plain_loop_with_frozen_members(frozen_in_k):
    eps = _episodes()
    b = compile(eps, CompileConfig(frozen_policies=FROZEN, micro_batch_tokens=0))
    # t2 (judge only) is not an event; t1 keeps solver_a, with one frozen member beside it
    assert b.num_sets == 2 * len(eps) and b.stats.frozen_only_events == len(eps)
    assert b.stats.frozen_members == len(eps)
    assert sorted(set(b.set_size.tolist())) == [1] and sorted(set(b.set_frozen_size.tolist())) == [0, 1]
    assert "judge" not in b.policies and set(b.agents) == {"solver_a", "solver_b"}
    gen = torch.Generator().manual_seed(0)
    new = (b.old_logprobs.double() + 0.3 * torch.randn(b.num_tokens, generator=gen, dtype=torch.float64)
           * b.loss_mask).requires_grad_(True)
    cfg = LossConfig(frozen_in_k=frozen_in_k)
    loss, _ = srpo_loss(new, b, cfg)
    # the same new log-probs, keyed by (episode, output id), for the loop
    new_lp: dict[str, list[float]] = {}
    for j, oid in enumerate(b.member_ids):
        ep = b.episode_ids[int(b.set_episode[int(b.member_set[j])])]
        lo, hi = int(b.member_offsets[j]), int(b.member_offsets[j + 1])
        new_lp[f"{ep}/{oid}"] = [float(x) for x, m in zip(new.detach()[lo:hi], b.loss_mask[lo:hi]) if m]
    adv = {(b.episode_ids[int(b.set_episode[s])], b.set_ids[s]): float(b.set_advantage[s]) for s in range(b.num_sets)}
    ref = _reference_loss(eps, new_lp, adv, cfg)
    assert loss.item() == pytest.approx(ref, abs=1e-6)  # old log-probs are float32 in the batch
    other = _reference_loss(eps, new_lp, adv, LossConfig(frozen_in_k=not frozen_in_k))
    assert abs(other - ref) > 1e-4  # the two rules differ on this batch: the check can fail
    loss.backward()
    assert torch.isfinite(new.grad).all()


def test_provenance_passes_through_a_frozen_transition():
    """t2 consumes only the frozen judge (not an event), yet its reward reaches t1, the firing that
    activated the judge: the solver that caused the verdict is credited with it."""
    eps = _episodes(1, 4)
    b = compile(eps, CompileConfig(frozen_policies=FROZEN, micro_batch_tokens=0))
    for s in range(b.num_sets):
        ep = eps[int(b.set_episode[s])]
        rewards = {t.id: t.reward or 0.0 for t in ep.transitions}
        if b.set_ids[s] == "t1":  # own 0 + t2 (its child) + t3 (t2's child); terminal 0
            assert float(b.set_reward[s]) == pytest.approx(rewards["t2"] + rewards["t3"])
        else:
            assert b.set_ids[s] == "t3" and float(b.set_reward[s]) == pytest.approx(rewards["t3"])


def test_without_frozen_policies_every_member_is_packed():
    """The default compile (no frozen policy named) is unchanged: the judge's outputs are members."""
    b = compile(_episodes(1, 2), CompileConfig(micro_batch_tokens=0))
    assert b.stats.frozen_only_events == 0 and int(b.set_frozen_size.sum()) == 0
    assert "judge" in b.policies and b.num_sets == 6


def test_a_missing_frozen_member_still_drops_its_event():
    """A frozen member belongs to the action: an event that lost it is incomplete, dropped whole."""
    ep = _episode("task0", 0, 1)
    ep = ep.model_copy(update={"outputs": [o for o in ep.outputs if o.id != "o1"]})
    b = compile([ep], CompileConfig(frozen_policies=FROZEN, micro_batch_tokens=0))
    assert b.stats.dropped_incomplete_events == 1 and b.set_ids == ["t3"]
