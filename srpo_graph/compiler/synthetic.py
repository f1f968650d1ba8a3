"""Synthetic, schema-valid episodes for tests and benchmarks (compiler stage helper).

Produces :class:`~srpo_graph.runtime.trace.Episode` objects shaped like a real run: G samples
per task, each episode a chain of transitions whose active sets have 1..``max_set`` members,
random prompt/completion lengths, several policies, sampled log-probs that are real
log-probabilities (of a random categorical), optional transition rewards and allowed-token
constraints. Deterministic for a given seed. This is not a test double for a model: it only
stands in for trace *files*, which the compiler treats as data.
"""

from __future__ import annotations

import random

from srpo_graph.runtime.trace import Episode, Output, TransitionRecord, WorkflowRef


def synthetic_episodes(
    num_tasks: int = 3,
    samples: int = 4,
    *,
    seed: int = 0,
    max_set: int = 5,
    max_events: int = 3,
    prompt_len: tuple[int, int] = (2, 8),
    completion_len: tuple[int, int] = (1, 6),
    policies: tuple[str, ...] = ("p0", "p1"),
    vocab: int = 32,
    transition_rewards: bool = True,
    constrained_share: float = 0.3,
) -> list[Episode]:
    """Random episodes: ``num_tasks`` groups of ``samples`` episodes each.

    Transition names are shared across the group (``t0``, ``t1``, ...) so events are
    comparable across samples; set sizes and lengths vary per episode.

    >>> eps = synthetic_episodes(2, 3, seed=1)
    >>> len(eps), {e.group_id for e in eps} == {"task0", "task1"}
    (6, True)
    """
    rng = random.Random(seed)
    prov = random.Random(seed + 7919)  # provenance draws: a stream of their own, the rest stays as it was
    out: list[Episode] = []
    allowed = list(range(4, 14))
    for task in range(num_tasks):
        num_events = rng.randint(1, max_events)
        for g in range(samples):
            outputs: list[Output] = []
            total = 0.0
            activated: list[list[str]] = []
            specs: list[tuple[int, list[str], float | None]] = []
            for step in range(num_events):
                k = rng.randint(1, max_set)
                consumed = []
                for j in range(k):
                    oid = f"o{step}_{j}"
                    # provenance: a random earlier firing activated it (branches and joins), or the start
                    parent = prov.randrange(step) if step and prov.random() < 0.8 else None
                    if parent is not None:
                        activated[parent].append(f"agent{j % 3}")
                    constrained = rng.random() < constrained_share
                    n = rng.randint(*completion_len)
                    comp = [rng.choice(allowed) if constrained else rng.randrange(vocab) for _ in range(n)]
                    outputs.append(Output(
                        id=oid, agent=f"agent{j % 3}", policy=policies[(step + j) % len(policies)],
                        policy_version=0, step=step,
                        prompt_ids=[rng.randrange(vocab) for _ in range(rng.randint(*prompt_len))],
                        completion_ids=comp, logprobs=[-rng.uniform(0.05, 3.0) for _ in comp],
                        temperature=rng.choice([1.0, 0.7]),
                        allowed_token_ids=allowed if constrained else None, max_tokens=completion_len[1],
                        activated_by=None if parent is None else f"t{parent}", text="", value=None))
                    consumed.append(oid)
                r = float(rng.randint(0, 1)) if transition_rewards and rng.random() < 0.5 else None
                total += r or 0.0
                activated.append([])
                specs.append((step, consumed, r))
            # the records, once every activation list is complete
            transitions = [TransitionRecord(id=f"t{step}", name=f"t{step}", step=step, consumed=consumed,
                                            activated=list(dict.fromkeys(acts)) or ["end"], reward=r)
                           for (step, consumed, r), acts in zip(specs, activated)]
            out.append(Episode(
                workflow=WorkflowRef(name="synthetic", hash="0" * 64), task_id=f"task{task}",
                group_id=f"task{task}", sample=g, seed=seed, outputs=outputs, transitions=transitions,
                reward=total + float(rng.randint(0, 2)), status="ok"))
    return out


def one_event_batch(sampled: list[list[float]], advantage: float, *, policy: str = "p0"):
    """A SetBatch of ONE event whose K members have the given sampled log-probs (worked examples).

    Each member gets a one-token prompt and ``len(sampled[j])`` completion tokens; the event's
    advantage is set to ``advantage`` (a lone event has no group to be relative to).

    Args:
        sampled: per member, the sampler's log-prob of each completion token (all <= 0).
        advantage: A_e.
        policy: the policy name of every member.
    Returns:
        SetBatch with one set of K = len(sampled) members.

    >>> b = one_event_batch([[-1.0, -0.5], [-2.0]], advantage=1.0)
    >>> b.num_sets, b.set_size.tolist(), int(b.loss_mask.sum())
    (1, [2], 3)
    """
    import torch

    from srpo_graph.compiler.compile import compile

    outputs = [Output(id=f"o{j}", agent=f"a{j}", policy=policy, policy_version=0, step=0, prompt_ids=[1],
                      completion_ids=[2 + (k % 8) for k in range(len(lps))], logprobs=list(lps), temperature=1.0,
                      allowed_token_ids=None, text="", value=None) for j, lps in enumerate(sampled)]
    ep = Episode(workflow=WorkflowRef(name="example", hash="0" * 64), task_id="task", group_id="task", sample=0,
                 seed=0, outputs=outputs, transitions=[TransitionRecord(
                     id="t0", name="t0", step=0, consumed=[o.id for o in outputs], activated=["end"], reward=None)],
                 reward=0.0, status="ok")
    b = compile([ep])
    return b.with_(set_advantage=torch.tensor([float(advantage)]))
