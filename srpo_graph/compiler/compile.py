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
2. **Select events**: failed episodes are excluded (counted); a transition whose consumed
   output is missing or aborted is dropped whole, never shrunk (counted).
3. **Returns and advantages**: see :class:`ReturnMode` and ``advantages.py``.
4. **Pack**: members of a set adjacent, each member prompt + completion with positions
   restarting at 0; micro-batches filled greedily up to ``micro_batch_tokens`` without ever
   splitting a set. Tensors are built from flat lists with numpy (no per-token Python).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Literal, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from srpo_graph.compiler.advantages import AdvantageMode, EventTable, compute_advantages
from srpo_graph.compiler.setbatch import SetBatch, assign_micro_batches
from srpo_graph.errors import CompileError
from srpo_graph.runtime.trace import SCHEMA_VERSION, Episode, Output, TransitionRecord


class ReturnMode(str, Enum):
    REWARD_TO_GO = "reward_to_go"
    EPISODE = "episode"


class CompileConfig(BaseModel):
    """How traces become a SetBatch. Defaults follow the SRPO paper where it says."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    advantage: AdvantageMode = Field(AdvantageMode.TRANSITION, description=(
        "Grouping of the advantage: 'transition' (same task group and transition across the G "
        "episodes; SRPO), 'episode' (episode return over the G episodes), 'agent' (Dr. MAS: "
        "task group and the agents of the set)."))
    returns: ReturnMode = Field(ReturnMode.REWARD_TO_GO, description=(
        "The return R_e of an event: 'reward_to_go' = terminal reward + rewards of this and "
        "later transitions (equals the episode reward when only a terminal reward exists); "
        "'episode' = the episode's total reward for every event."))
    use_std: bool = Field(True, description="Divide by the group std (GRPO/SRPO); False = Dr. GRPO.")
    std_unbiased: bool = Field(True, description="Sample std (n-1), as TRL and verl; False = population std.")
    eps: float = Field(1e-6, ge=0.0, le=1.0, description="Added to the group std; unitless, >= 0.")
    drop_zero_variance: bool = Field(False, description=(
        "Drop events whose group has zero variance (their advantage is 0 anyway); counted in stats."))
    micro_batch_tokens: int = Field(8192, ge=0, description=(
        "Token budget (prompt + completion tokens) of a micro-batch; 0 = one micro-batch. A set "
        "larger than the budget gets a micro-batch of its own."))
    missing_member: Literal["drop", "error"] = Field("drop", description=(
        "An event whose consumed output is missing or aborted: 'drop' it whole (counted) or raise."))
    include_truncated: bool = Field(True, description="Keep events of truncated episodes (they end early but are real).")
    policies: tuple[str, ...] = Field((), description=(
        "Fixed order of policy names: policy id = position, so ids stay stable across batches "
        "(a trainer indexes its models by them). Policies not listed are appended in order seen."))


# --------------------------------------------------------------------------- validation


def _fail(where: str, field: str, message: str) -> CompileError:
    return CompileError(f"{where}: error: field {field}: {message}")


def _validate(ep: Episode, where: str) -> None:
    if getattr(ep, "schema_", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise _fail(where, "schema", f"{ep.schema_!r} is not {SCHEMA_VERSION!r}")
    if not isinstance(ep.reward, (int, float)) or not math.isfinite(ep.reward):
        raise _fail(where, "reward", f"{ep.reward!r} is not a finite number")
    seen: set[str] = set()
    for j, o in enumerate(ep.outputs):
        f = f"outputs[{j}]"
        if o.id in seen:
            raise _fail(where, f"{f}.id", f"duplicate output id {o.id!r}")
        seen.add(o.id)
        if not o.prompt_ids:
            raise _fail(where, f"{f}.prompt_ids", f"output {o.id!r} has an empty prompt")
        if len(o.logprobs) != len(o.completion_ids):
            raise _fail(where, f"{f}.logprobs", f"output {o.id!r} has {len(o.logprobs)} log-probs for "
                        f"{len(o.completion_ids)} completion tokens")
        if not (math.isfinite(o.temperature) and o.temperature >= 0):
            raise _fail(where, f"{f}.temperature", f"output {o.id!r}: {o.temperature} is not >= 0")
        if o.allowed_token_ids is not None:
            if not o.allowed_token_ids:
                raise _fail(where, f"{f}.allowed_token_ids", f"output {o.id!r}: empty allowed set")
            outside = set(o.completion_ids) - set(o.allowed_token_ids)
            if outside:
                raise _fail(where, f"{f}.completion_ids", f"output {o.id!r} sampled tokens {sorted(outside)} "
                            "outside its allowed_token_ids")
        for name in ("prompt_ids", "completion_ids"):
            ids = getattr(o, name)
            if ids and min(ids) < 0:
                raise _fail(where, f"{f}.{name}", f"output {o.id!r} has token id {min(ids)} < 0")
        if o.logprobs:
            lp = np.asarray(o.logprobs, dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(lp) | (lp > 1e-4))
            if bad.size:
                k = int(bad[0])
                raise _fail(where, f"{f}.logprobs[{k}]", f"output {o.id!r}: {o.logprobs[k]} is not a finite log-probability")
    consumer: dict[str, str] = {}
    tids: set[str] = set()
    for k, t in enumerate(ep.transitions):
        f = f"transitions[{k}]"
        if t.id in tids:
            raise _fail(where, f"{f}.id", f"duplicate transition id {t.id!r}")
        tids.add(t.id)
        if t.reward is not None and not math.isfinite(t.reward):
            raise _fail(where, f"{f}.reward", f"transition {t.id!r}: {t.reward} is not finite")
        for c in t.consumed:
            if c in consumer:
                raise _fail(where, f"{f}.consumed", f"output {c!r} is consumed by both {consumer[c]!r} and {t.id!r}")
            consumer[c] = t.id


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


def _reward_to_go(ep: Episode) -> dict[str, float]:
    rewards = [(t.step, t.reward or 0.0) for t in ep.transitions]
    terminal = ep.reward - sum(r for _, r in rewards)
    return {t.id: terminal + sum(r for s, r in rewards if s >= t.step) for t in ep.transitions}


def _episode_return(ep: Episode) -> dict[str, float]:
    return {t.id: ep.reward for t in ep.transitions}


RETURNS: dict[ReturnMode, Callable[[Episode], dict[str, float]]] = {
    ReturnMode.REWARD_TO_GO: _reward_to_go,
    ReturnMode.EPISODE: _episode_return,
}


# --------------------------------------------------------------------------- compile


@dataclass
class _Event:
    episode: int
    transition: TransitionRecord
    members: list[Output]
    ret: float


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
        SetBatch with ``stats`` counting episodes, failed episodes, dropped incomplete events,
        zero-variance groups/events and dropped zero-variance events.
    Raises:
        CompileError: a bad episode (naming it and the field), or ``missing_member="error"``
            and an event with a missing member.

    >>> from srpo_graph.compiler.synthetic import synthetic_episodes
    >>> b = compile(synthetic_episodes(2, 2, seed=0), CompileConfig(micro_batch_tokens=0))
    >>> b.num_sets == b.stats["events"], b.num_micro_batches, int(b.position_ids[0])
    (True, 1, 0)
    """
    stats = {"episodes": len(episodes), "failed_episodes": 0, "truncated_episodes": 0,
             "dropped_incomplete_events": 0, "empty_events": 0}
    ep_ids: list[str] = []
    ep_reward: list[float] = []
    ep_group: list[int] = []
    groups: dict[str, int] = {}
    task_of_group: dict[str, str] = {}
    events: list[_Event] = []
    workflow = ""
    first_seen: dict[tuple[str, int], str] = {}
    first_workflow: tuple[str, str, str] | None = None
    for i, ep in enumerate(episodes):
        loc = where[i] if where is not None else f"episode {i} (task {ep.task_id!r}, sample {ep.sample})"
        _validate(ep, loc)
        _check_batch_consistency(ep, loc, first_seen, first_workflow)
        first_workflow = first_workflow or (ep.workflow.name, ep.workflow.hash, loc)
        if ep.status == "failed":
            stats["failed_episodes"] += 1
            continue
        if ep.status == "truncated":
            stats["truncated_episodes"] += 1
            if not config.include_truncated:
                continue
        workflow = workflow or ep.workflow.name
        e = len(ep_ids)
        ep_ids.append(f"{ep.group_id}/{ep.sample}")
        ep_reward.append(float(ep.reward))
        ep_group.append(_index(groups, ep.group_id))
        task_of_group.setdefault(ep.group_id, ep.task_id)
        by_id = {o.id: o for o in ep.outputs}
        returns = RETURNS[config.returns](ep)
        for k, t in enumerate(ep.transitions):
            members = [by_id.get(c) for c in t.consumed]
            if not members:
                stats["empty_events"] += 1
                continue
            if any(m is None or m.finish_reason == "abort" for m in members):
                if config.missing_member == "error":
                    raise _fail(loc, f"transitions[{k}].consumed", f"transition {t.id!r} consumes a missing or aborted output")
                stats["dropped_incomplete_events"] += 1
                continue
            events.append(_Event(e, t, members, returns[t.id]))

    group_names = list(groups)
    table = EventTable(
        returns=[ev.ret for ev in events],
        episode=[ev.episode for ev in events],
        group=[group_names[ep_group[ev.episode]] for ev in events],
        transition=[ev.transition.name for ev in events],
        agents=["+".join(sorted(m.agent for m in ev.members)) for ev in events],
        episode_reward=ep_reward,
    )
    adv = compute_advantages(table, config.advantage, use_std=config.use_std, eps=config.eps,
                             unbiased=config.std_unbiased)
    stats["advantage_groups"] = adv.num_groups
    stats["zero_variance_groups"] = adv.num_zero_variance_groups
    stats["zero_variance_events"] = int(adv.zero_variance_set.sum())
    keep = list(range(len(events)))
    if config.drop_zero_variance:
        keep = (~adv.zero_variance_set).nonzero().squeeze(1).tolist()
    stats["dropped_zero_variance_events"] = len(events) - len(keep)
    return _pack([events[i] for i in keep], adv.advantage[keep], adv.set_group[keep], config, stats,
                 ep_ids, ep_reward, ep_group, group_names, [task_of_group[g] for g in group_names], workflow)


def _pack(events: list[_Event], advantage: torch.Tensor, set_group: torch.Tensor, config: CompileConfig,
          stats: dict, ep_ids: list[str], ep_reward: list[float], ep_group: list[int],
          group_names: list[str], task_ids: list[str], workflow: str) -> SetBatch:
    policies: dict[str, int] = {p: i for i, p in enumerate(config.policies)}
    transitions: dict[str, int] = {}
    agents: dict[str, int] = {}
    allowed: dict[tuple[int, ...], int] = {}
    prestates: dict[tuple[int, int], int] = {}
    ids: list[int] = []
    logprobs: list[float] = []
    lengths: list[int] = []
    prompt_lengths: list[int] = []
    m_set, m_pol, m_ver, m_idx, m_temp, m_allowed, m_agent, m_ids = [], [], [], [], [], [], [], []
    s_size, s_exp, s_ret, s_ep, s_tr, s_pre, s_ids, s_tokens = [], [], [], [], [], [], [], []
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
            m_set.append(s)
            m_pol.append(_index(policies, o.policy))
            m_ver.append(o.policy_version)
            m_idx.append(j)
            m_temp.append(o.temperature if o.temperature > 0 else 1.0)  # greedy (T=0) records T=1 log-probs
            m_allowed.append(-1 if o.allowed_token_ids is None
                             else allowed.setdefault(tuple(o.allowed_token_ids), len(allowed)))
            m_agent.append(_index(agents, o.agent))
            m_ids.append(o.id)
        s_size.append(len(ev.members))
        s_exp.append(len(ev.transition.consumed))
        s_ret.append(ev.ret)
        s_ep.append(ev.episode)
        s_tr.append(_index(transitions, ev.transition.name))
        s_pre.append(prestates.setdefault((ev.episode, min(m.step for m in ev.members)), len(prestates)))
        s_ids.append(ev.transition.id)
        s_tokens.append(n_tok)

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

    def i64(x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x, dtype=np.int64))

    def f32(x) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x, dtype=np.float32))

    sampler = torch.from_numpy(lp)
    budget = config.micro_batch_tokens
    stats.update(events=len(events), members=len(m_set), tokens=total, completion_tokens=int(loss_mask.sum()))
    return SetBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64), position_ids=torch.from_numpy(positions),
        loss_mask=torch.from_numpy(loss_mask), sampler_logprobs=sampler, old_logprobs=sampler.clone(),
        member_offsets=torch.from_numpy(offsets), member_set=i64(m_set), member_policy=i64(m_pol),
        member_policy_version=i64(m_ver), member_index=i64(m_idx), member_temperature=f32(m_temp),
        member_allowed=i64(m_allowed), member_agent=i64(m_agent), set_size=i64(s_size), set_expected_size=i64(s_exp),
        set_advantage=advantage.to(torch.float32), set_reward=f32(s_ret), set_episode=i64(s_ep),
        set_transition=i64(s_tr), set_group=set_group.to(torch.int64), set_prestate=i64(s_pre),
        micro_batch=i64(assign_micro_batches(s_tokens, budget)),
        episode_reward=f32(ep_reward), episode_group=i64(ep_group),
        allowed_ids=i64([t for r in allowed_rows for t in r]), allowed_offsets=torch.from_numpy(a_off),
        policies=list(policies), transitions=list(transitions), episode_ids=ep_ids, group_ids=group_names,
        task_ids=task_ids, workflow=workflow, stats=stats, agents=list(agents), member_ids=m_ids,
        set_ids=s_ids, micro_batch_tokens=budget,
    )
