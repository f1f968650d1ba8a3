"""``compile``: episode traces -> :class:`SetBatch` (compiler stage).

Consumes :class:`~srpo_graph.runtime.trace.Episode` objects (read from JSONL or straight from
the executor) and produces the packed active-set tensors of DESIGN.md. Knows nothing about
models or the loss.

What it does, in order:

1. **Validate** every episode (the trace reader checks a file's lines, but in-memory
   episodes never went through it): schema version, finite rewards, unique ids, token ids
   >= 0, one log-prob per completion token, finite log-probs, temperatures >= 0 (0 = greedy,
   whose log-probs of record are T = 1's), sampled
   tokens inside the allowed set, an output consumed by at most one transition; and across
   episodes, one workflow (name and hash) and each (group, sample) once. A problem
   raises :class:`CompileError` naming the episode (or ``file:line``) and the field.
2. **Select episodes and events**: a failed episode is dropped or scored 0
   (``CompileConfig.failed``), a truncated one kept, dropped or penalized
   (``CompileConfig.truncated``), each counted and marked in ``episode_status``; a transition
   whose consumed output is missing or aborted is dropped whole, never shrunk (counted);
   outputs of frozen policies (``CompileConfig.frozen_policies``) stay members but are not
   packed, and a firing with only frozen members is not an event (counted).
3. **Returns and advantages**: returns follow provenance (``RETURNS``, :func:`provenance_children`:
   an event is credited with its own reward, its causal descendants' rewards and the terminal
   reward, never a parallel branch's); advantages in ``advantages.py``.
4. **Pack**: members of a set adjacent, each member prompt + completion with positions
   restarting at 0; micro-batches filled greedily up to ``micro_batch_tokens`` without ever
   splitting a set. Tensors are built from flat lists with numpy (no per-token Python).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from srpo_graph.compiler.advantages import EventTable, compute_advantages
from srpo_graph.compiler.options import CompileConfig, FailedPolicy, ReturnMode, TruncatedPolicy
from srpo_graph.compiler.setbatch import EPISODE_STATUS, CompileStats, SetBatch, assign_micro_batches
from srpo_graph.errors import CompileError
from srpo_graph.runtime.trace import Episode, Output, TransitionRecord, episode_problems

__all__ = ["CompileConfig", "RETURNS", "activators", "compile", "provenance_children"]


# --------------------------------------------------------------------------- validation


def _fail(where: str, field: str, message: str) -> CompileError:
    return CompileError.at(where, f"field {field}: {message}")


def _validate(ep: Episode, where: str) -> None:
    """The trace rules (``runtime.trace.episode_problems``, Note [One copy of the trace rules]) on an
    episode that may never have been validated: the runtime builds them without validation."""
    for field_, message in episode_problems(ep, outputs=True, resolve_ids=False):
        raise _fail(where, field_, message)


def _check_batch_consistency(ep: Episode, where: str, first_seen: dict[tuple[str, int], str],
                             first_workflow: tuple[str, str, str] | None) -> None:
    """One workflow per batch, and each (group, sample) once: both would corrupt the advantages."""
    if first_workflow is not None:
        name, digest, at = first_workflow
        if ep.workflow.name != name:
            raise _fail(where, "workflow.name", f"{ep.workflow.name!r}, but {at} is from workflow {name!r}; "
                        "compile one workflow's traces at a time")
        if ep.workflow.hash != digest:
            raise _fail(where, "workflow.hash", f"workflow {name!r} changed since {at} (hash {ep.workflow.hash[:12]} "
                        f"vs {digest[:12]}); traces of different versions cannot share advantage groups")
    key = (ep.group_id, ep.sample)
    if key in first_seen:
        raise _fail(where, "sample", f"group {ep.group_id!r} sample {ep.sample} appears twice (also {first_seen[key]})")
    first_seen[key] = where


# --------------------------------------------------------------------------- returns


def activators(ep: Episode) -> dict[str, str | None]:
    """Output id -> the id of the transition record whose firing activated it (None = start).

    The runtime records it (``Output.activated_by``, null for the start); for a trace that
    does not have the field at all, it is the latest firing before the output's step that
    activated the output's agent (the runtime's rule: an agent is activated, then generates
    before its consumer fires).
    """
    by_agent: dict[str, list[tuple[int, str]]] = {}
    for t in ep.transitions:
        for a in t.activated:
            by_agent.setdefault(a, []).append((t.step, t.id))
    out: dict[str, str | None] = {}
    for o in ep.outputs:
        if o.activated_by is not None or "activated_by" in o.model_fields_set:
            out[o.id] = o.activated_by
            continue
        earlier = [tid for step, tid in by_agent.get(o.agent, ()) if step < o.step]
        out[o.id] = earlier[-1] if earlier else None
    return out


def provenance_children(ep: Episode) -> dict[str, list[str]]:
    """Transition id -> the ids of the firings that consumed an output it activated (the DAG's arcs)."""
    parent = activators(ep)
    children: dict[str, list[str]] = {t.id: [] for t in ep.transitions}
    for t in ep.transitions:
        for c in t.consumed:
            p = parent.get(c)
            if p is not None and p in children and t.id not in children[p]:
                children[p].append(t.id)
    return children


def _provenance(ep: Episode, gamma: float, terminal: float) -> dict[str, float]:
    """R_e = r_e + sum over descendants j of gamma^d(e,j) r_j + gamma^h(e) * terminal.

    d(e, j) is the number of hops on the shortest provenance path from e to j (a breadth-first
    search); h(e) is the largest d(e, j) over e's descendants (0 when it has none): the terminal
    reward arrives after the last firing e caused. Two independent branches never share credit.
    """
    children = provenance_children(ep)
    reward = {t.id: t.reward or 0.0 for t in ep.transitions}
    out: dict[str, float] = {}
    for t in ep.transitions:
        hops = {t.id: 0}
        queue = deque([t.id])
        while queue:
            u = queue.popleft()
            for v in children[u]:
                if v not in hops:
                    hops[v] = hops[u] + 1
                    queue.append(v)
        height = max(hops.values())
        out[t.id] = sum(gamma ** d * reward[j] for j, d in hops.items()) + gamma ** height * terminal
    return out


def _provenance_returns(ep: Episode, config: CompileConfig, reward: float) -> dict[str, float]:
    terminal = reward - sum(t.reward or 0.0 for t in ep.transitions)
    return _provenance(ep, config.gamma, terminal)


def _episode_return(ep: Episode, config: CompileConfig, reward: float) -> dict[str, float]:
    return {t.id: reward for t in ep.transitions}


# (episode, config, the episode reward after its status rule) -> return of each transition id
RETURNS: dict[ReturnMode, Callable[[Episode, CompileConfig, float], dict[str, float]]] = {
    ReturnMode.PROVENANCE: _provenance_returns,
    ReturnMode.EPISODE: _episode_return,
}


def _zero_returns(ep: Episode) -> dict[str, float]:
    return {t.id: 0.0 for t in ep.transitions}


# --------------------------------------------------------------------------- compile


@dataclass
class _Event:
    episode: int
    transition: TransitionRecord
    members: list[Output]
    ret: float
    turn: int  # earlier firings of this transition in its episode
    member_turn: list[int]  # per member: earlier outputs of its agent in its episode
    frozen: int = 0  # members of frozen policies, not in ``members`` (not packed)


def _index(table: dict[str, int], key: str) -> int:
    return table.setdefault(key, len(table))


def compile(episodes: Sequence[Episode], config: CompileConfig = CompileConfig(), *,
            where: Sequence[str] | None = None) -> SetBatch:  # noqa: A001 - the stage's verb
    """Compile episodes into a packed :class:`SetBatch`.

    Args:
        episodes: the traces (any order; grouped by ``group_id``).
        config: see :class:`CompileConfig`.
        where: optional location of each episode for error messages (e.g. ``"t.jsonl:3"``).
    Returns:
        SetBatch with ``stats`` counting episodes, failed and truncated episodes (kept, dropped,
        penalized, zeroed), dropped incomplete events, zero-variance and singleton groups, and
        dropped zero-variance events.
    Raises:
        CompileError: a bad episode (naming it and the field), or ``missing_member="error"``
            and an event with a missing member.

    >>> from srpo_graph.compiler.synthetic import synthetic_episodes
    >>> b = compile(synthetic_episodes(2, 2, seed=0), CompileConfig(micro_batch_tokens=0))
    >>> b.num_sets == b.stats.events, b.num_micro_batches, int(b.position_ids[0])
    (True, 1, 0)
    """
    stats = CompileStats(episodes=len(episodes))
    ep_ids: list[str] = []
    ep_reward: list[float] = []
    ep_group: list[int] = []
    ep_status: list[int] = []
    groups: dict[str, int] = {}
    task_of_group: dict[str, str] = {}
    events: list[_Event] = []
    workflow = ""
    first_seen: dict[tuple[str, int], str] = {}
    first_workflow: tuple[str, str, str] | None = None
    frozen = frozenset(config.frozen_policies)
    for i, ep in enumerate(episodes):
        loc = where[i] if where is not None else f"episode {i} (task {ep.task_id!r}, sample {ep.sample})"
        _validate(ep, loc)
        _check_batch_consistency(ep, loc, first_seen, first_workflow)
        first_workflow = first_workflow or (ep.workflow.name, ep.workflow.hash, loc)
        reward = float(ep.reward)
        if ep.status == "failed":
            stats.failed_episodes += 1
            if config.failed is FailedPolicy.DROP:
                stats.dropped_failed_episodes += 1
                continue
            stats.zeroed_failed_episodes += 1
            reward = 0.0
        elif ep.status == "truncated":
            stats.truncated_episodes += 1
            if config.truncated is TruncatedPolicy.DROP:
                stats.dropped_truncated_episodes += 1
                continue
            if config.truncated is TruncatedPolicy.PENALIZE:
                stats.penalized_truncated_episodes += 1
                reward -= config.truncated_penalty
        workflow = workflow or ep.workflow.name
        e = len(ep_ids)
        ep_ids.append(f"{ep.group_id}/{ep.sample}")
        ep_reward.append(reward)
        ep_group.append(_index(groups, ep.group_id))
        ep_status.append(EPISODE_STATUS[ep.status])
        task_of_group.setdefault(ep.group_id, ep.task_id)
        by_id = {o.id: o for o in ep.outputs}
        returns = _zero_returns(ep) if ep.status == "failed" else RETURNS[config.returns](ep, config, reward)
        fired: dict[str, int] = {}
        agent_outputs: dict[str, int] = {}
        output_turn: dict[str, int] = {}
        for o in sorted(ep.outputs, key=lambda o: o.step):  # stable: generation order within a step
            output_turn[o.id] = agent_outputs.get(o.agent, 0)
            agent_outputs[o.agent] = output_turn[o.id] + 1
        for k, t in enumerate(ep.transitions):
            turn = fired.get(t.name, 0)
            fired[t.name] = turn + 1
            found = [by_id.get(c) for c in t.consumed]
            if not found:
                stats.empty_events += 1
                continue
            members = [m for m in found if m is not None and m.finish_reason != "abort"]
            if len(members) < len(found):
                if config.missing_member == "error":
                    raise _fail(loc, f"transitions[{k}].consumed",
                                f"transition {t.id!r} consumes a missing or aborted output")
                stats.dropped_incomplete_events += 1
                continue
            # frozen members are part of the action (completeness above, provenance) but carry no
            # log-ratio: they are not packed. A firing with no trainable member is not an event.
            trained = [m for m in members if m.policy not in frozen and m.source != "text"]
            if not trained:
                stats.frozen_only_events += 1
                continue
            stats.frozen_members += len(members) - len(trained)
            events.append(
                _Event(
                    e,
                    t,
                    trained,
                    returns[t.id],
                    turn,
                    [output_turn[m.id] for m in trained],
                    len(members) - len(trained),
                )
            )

    group_names = list(groups)
    table = EventTable(
        returns=[ev.ret for ev in events],
        episode=[ev.episode for ev in events],
        group=[group_names[ep_group[ev.episode]] for ev in events],
        transition=[ev.transition.name for ev in events],
        members=[[m.agent for m in ev.members] for ev in events],
        episode_reward=ep_reward,
        turn=[ev.turn for ev in events],
        member_turn=[ev.member_turn for ev in events],
    )
    adv = compute_advantages(
        table,
        config.advantage,
        grouping=config.grouping,
        singleton_baseline=config.singleton_baseline,
        use_std=config.use_std,
        eps=config.eps,
        unbiased=config.std_unbiased,
    )
    stats.advantage_groups = adv.num_groups
    stats.zero_variance_groups = adv.num_zero_variance_groups
    stats.singleton_groups = adv.num_singleton_groups
    stats.zero_variance_events = int(adv.zero_variance_set.sum())
    stats.singleton_events = int(adv.singleton_set.sum())
    keep = list(range(len(events)))
    if config.drop_zero_variance:
        keep = (~adv.zero_variance_set).nonzero().squeeze(1).tolist()
    stats.dropped_zero_variance_events = len(events) - len(keep)
    # members of the kept events, in order (events are kept in order, members are in event order)
    kept = torch.zeros(len(events), dtype=torch.bool)
    kept[keep] = True
    member_event = torch.repeat_interleave(
        torch.arange(len(events)), torch.tensor([len(ev.members) for ev in events], dtype=torch.int64)
    )
    member_adv = adv.member_advantage[kept[member_event]]
    return _pack(
        [events[i] for i in keep],
        adv.advantage[keep],
        member_adv,
        adv.set_group[keep],
        config,
        stats,
        ep_ids,
        ep_reward,
        ep_group,
        ep_status,
        group_names,
        [task_of_group[g] for g in group_names],
        workflow,
    )


def _pack(
    events: list[_Event],
    advantage: torch.Tensor,
    member_advantage: torch.Tensor,
    set_group: torch.Tensor,
    config: CompileConfig,
    stats: CompileStats,
    ep_ids: list[str],
    ep_reward: list[float],
    ep_group: list[int],
    ep_status: list[int],
    group_names: list[str],
    task_ids: list[str],
    workflow: str,
) -> SetBatch:
    """The packed tensors, filled as named columns (one per ``SetBatch`` field; dtypes from there)."""
    policies: dict[str, int] = {p: i for i, p in enumerate(config.policies)}
    transitions: dict[str, int] = {}
    agents: dict[str, int] = {}
    allowed: dict[tuple[int, ...], int] = {}
    prestates: dict[tuple[int, int], int] = {}
    ids: list[int] = []
    logprobs: list[float] = []
    lengths: list[int] = []
    prompt_lengths: list[int] = []
    member_ids: list[str] = []
    set_ids: list[str] = []
    set_tokens: list[int] = []
    m: dict[str, list] = {
        k: []
        for k in (
            "member_set",
            "member_policy",
            "member_policy_version",
            "member_index",
            "member_temperature",
            "member_allowed",
            "member_agent",
            "member_max_tokens",
            "member_top_k",
            "member_top_p",
        )
    }
    st: dict[str, list] = {
        k: []
        for k in (
            "set_size",
            "set_expected_size",
            "set_reward",
            "set_episode",
            "set_transition",
            "set_prestate",
            "set_frozen_size",
        )
    }
    for s, ev in enumerate(events):
        n_tok = 0
        for j, o in enumerate(ev.members):
            ids.extend(o.prompt_ids)
            ids.extend(o.completion_ids)
            logprobs.extend(o.logprobs)
            n = len(o.prompt_ids) + len(o.completion_ids)
            n_tok += n
            lengths.append(n)
            prompt_lengths.append(len(o.prompt_ids))
            member_ids.append(o.id)
            sampled = o.logprob_mode == "sampled" and o.temperature > 0  # filters the trainer re-applies
            for name, value in (
                ("member_set", s),
                ("member_policy", _index(policies, o.policy)),
                ("member_policy_version", o.policy_version),
                ("member_index", j),
                ("member_temperature", o.temperature if o.temperature > 0 else 1.0),  # greedy records T=1
                (
                    "member_allowed",
                    -1 if o.allowed_token_ids is None else allowed.setdefault(tuple(o.allowed_token_ids), len(allowed)),
                ),
                ("member_agent", _index(agents, o.agent)),
                ("member_max_tokens", o.max_tokens if o.max_tokens is not None else len(o.completion_ids)),
                ("member_top_k", o.top_k if sampled else 0),
                ("member_top_p", o.top_p if sampled else 1.0),
            ):
                m[name].append(value)
        for name, value in (
            ("set_size", len(ev.members)),
            ("set_expected_size", len(ev.transition.consumed)),
            ("set_reward", ev.ret),
            ("set_episode", ev.episode),
            ("set_transition", _index(transitions, ev.transition.name)),
            ("set_prestate", prestates.setdefault((ev.episode, min(o.step for o in ev.members)), len(prestates))),
            ("set_frozen_size", ev.frozen),
        ):
            st[name].append(value)
        set_ids.append(ev.transition.id)
        set_tokens.append(n_tok)

    # token stream from flat arrays: positions restart per member, loss on completion tokens
    lens = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    positions = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], lens)
    loss_mask = positions >= np.repeat(np.asarray(prompt_lengths, dtype=np.int64), lens)
    lp = np.zeros(total, dtype=np.float32)
    lp[loss_mask] = np.asarray(logprobs, dtype=np.float32)
    allowed_rows = list(allowed)
    a_off = np.zeros(len(allowed_rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in allowed_rows], out=a_off[1:])
    budget = config.micro_batch_tokens
    stats.events, stats.members, stats.tokens = len(events), len(member_ids), total
    stats.completion_tokens = int(loss_mask.sum())
    return SetBatch.from_columns(
        {
            "input_ids": ids,
            "position_ids": positions,
            "loss_mask": loss_mask,
            "sampler_logprobs": lp,
            "old_logprobs": lp.copy(),
            "member_offsets": offsets,
            **m,
            "member_advantage": member_advantage,
            **st,
            "set_advantage": advantage,
            "set_group": set_group,
            "micro_batch": assign_micro_batches(set_tokens, budget),
            "episode_reward": ep_reward,
            "episode_group": ep_group,
            "episode_status": ep_status,
            "allowed_ids": [t for r in allowed_rows for t in r],
            "allowed_offsets": a_off,
        },
        policies=list(policies),
        transitions=list(transitions),
        episode_ids=ep_ids,
        group_ids=group_names,
        task_ids=task_ids,
        workflow=workflow,
        stats=stats,
        agents=list(agents),
        member_ids=member_ids,
        set_ids=set_ids,
        micro_batch_tokens=budget,
    )
