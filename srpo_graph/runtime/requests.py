"""Requests of pending agents, and their answers: the helpers both schedulers share (runtime stage).

Consumes ``(episode, pending agent)`` pairs (:class:`~srpo_graph.runtime.episode.EpisodeRun`),
their agents' sampling plans (:class:`~srpo_graph.runtime.prompts.AgentPlan`) and one backend per
policy; produces :class:`~srpo_graph.backends.base.GenerationRequest` batches, one per backend
object (:func:`batch_requests`), samples a batch (:func:`sample_batch`) and hands each checked
answer back to its episode (:func:`hand_back`). The lockstep loop (``lockstep.py``) and the
streaming one (``streaming.py``) both go through these, so request seeds and ids, ``prompt_text``,
text-only outputs of external policies and failure kinds (``prompt``, ``backend``) are the same
under both. It knows nothing of scheduling: when a request is sent, or how episodes wait.

Each output's seed is :func:`output_seed` of its episode's seed and its index in the episode,
never of the batch it happened to be in.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from srpo_graph.backends.base import Backend, Completion, GenerationRequest
from srpo_graph.errors import BackendError, SrpoGraphError
from srpo_graph.runtime.chat import chat_prompt
from srpo_graph.runtime.episode import EpisodeRun, Sampled, at_node
from srpo_graph.runtime.prompts import AgentPlan, trim_at_stop
from srpo_graph.runtime.render import render
from srpo_graph.runtime.seeds import output_seed
from srpo_graph.runtime.trace import LOGPROB_TOL

Item = tuple[EpisodeRun, AgentPlan, GenerationRequest]


def batch_requests(work: list[tuple[EpisodeRun, str]], plans: Mapping[str, AgentPlan],
                   backends: Mapping[str, Backend]) -> tuple[dict[int, list[Item]], list[tuple[int, int]]]:
    """The requests of ``work`` (episode, pending agent), grouped by backend object, and the
    request order as (backend key, position in its batch): outputs are handed back in it, so an
    episode's output ids follow its request ids whatever the batching.

    Each output's seed and request id come from its episode and its index there
    (``len(ep.outputs)`` plus the episode's requests earlier in ``work``), never from the batch;
    every request carries its rendered prompt as ``prompt_text`` (a text-only external policy
    sends that). An episode whose prompt cannot be rendered, or whose request would not fit in
    the backend's ``context_length`` (:func:`over_context`), is failed here (kind ``prompt``).
    """
    rendered: list[tuple[EpisodeRun, AgentPlan, str]] = []
    chat_ids: dict[int, tuple[int, ...]] = {}  # chat agents' prompts come from their conversation
    systems: dict[int, str] = {}  # a text-only policy's `system:`, sent as its own message
    for ep, agent in work:
        plan = plans[agent]
        try:
            if plan.chat is not None:
                ids, text = chat_prompt(ep, plan.chat)
                chat_ids[len(rendered)] = ids
                rendered.append((ep, plan, text))
            else:
                chat = plan.agent.chat
                if plan.tokenizer is None and chat is not None and chat.system is not None:
                    systems[len(rendered)] = render(chat.system, ep.state)
                rendered.append((ep, plan, render(plan.agent.template, ep.state)))
        except Exception as exc:  # noqa: BLE001 - e.g. an absent reference
            ep.fail(at_node(plan.agent.template, f"prompt of agent {agent!r}: {exc}"), "prompt")
    by_agent: dict[str, list[int]] = {}
    for i, (_, plan, _) in enumerate(rendered):
        if i not in chat_ids:
            by_agent.setdefault(plan.agent.name, []).append(i)
    prompts: list[tuple[int, ...]] = [()] * len(rendered)
    for i, ids in chat_ids.items():
        prompts[i] = ids
    for idx in by_agent.values():
        for i, ids in zip(idx, rendered[idx[0]][1].encode_many([rendered[i][2] for i in idx])):
            prompts[i] = ids
    batches: dict[int, list[Item]] = {}
    order: list[tuple[int, int]] = []
    issued: dict[int, int] = {}  # episode -> requests made this round: each output its own seed
    for i, ((ep, plan, text), prompt) in enumerate(zip(rendered, prompts)):
        k = issued.get(id(ep), 0)
        issued[id(ep)] = k + 1
        n = len(ep.outputs) + k
        req = plan.request(prompt, seed=output_seed(ep.seed, n), request_id=f"{ep.group_id}/{ep.sample}/o{n}",
                           prompt_text=text, system_text=systems.get(i))
        too_long = over_context(ep, plan, req, backends[plan.agent.policy])
        if too_long:
            ep.fail(too_long, "prompt")
            continue
        key = id(backends[plan.agent.policy])
        batch = batches.setdefault(key, [])
        order.append((key, len(batch)))
        batch.append((ep, plan, req))
    return batches, order


def over_context(ep: EpisodeRun, plan: AgentPlan, req: GenerationRequest, backend: Backend) -> str | None:
    """Why ``req`` cannot be sent (its prompt and ``max_tokens`` do not fit in the backend's
    ``context_length``), naming the agent and its turn; None when it fits or the length is unknown.
    A chat agent's conversation grows with every turn, so this is where a long one ends."""
    limit = getattr(backend, "context_length", None)
    need = len(req.prompt_ids) + int(req.max_new_tokens)
    if not limit or need <= limit:
        return None
    agent = plan.agent
    turn = 1 + sum(o.agent == agent.name for o in ep.outputs)
    grows = agent.chat is not None and agent.chat.memory == "chat"
    return at_node(agent, f"agent {agent.name!r}, turn {turn}: the prompt ({len(req.prompt_ids)} tokens) and "
                          f"max_tokens ({req.max_new_tokens}) need {need} positions, more than the "
                          f"{limit} of policy {agent.policy!r}'s model"
                   + ("; its conversation (`memory: chat`) grew past the context: bound the cycle with "
                      "`max_rounds`, lower `max_tokens`, or use `memory: none`" if grows else
                      "; shorten the prompt or lower `max_tokens`"))


def generate_for_waves(backend: Backend) -> Callable[[Sequence[Any]], Sequence[Completion]]:
    """``backend.generate_together`` where the class that gives the backend its ``generate`` gives
    that too (sglang.py, Note [A wave in one call]), else ``backend.generate``: a wrapper that
    delegates other names by ``__getattr__`` (a recorder, a rate limit) or a subclass that overrides
    ``generate`` keeps every request going through its own ``generate``."""
    def owner(name: str) -> type | None:
        return next((c for c in type(backend).__mro__ if name in vars(c)), None)

    together = owner("generate_together")
    return getattr(backend, "generate_together") if together is not None and together is owner("generate") \
        else backend.generate


def sample_batch(backend: Backend, items: Sequence[Item], on_backend_error: str, together: bool = False,
                 ) -> tuple[list[Completion | None], list[str | None]]:
    """``backend.generate`` on the items' requests: (completions, errors), aligned with ``items``.
    ``together``: the answers are used together (an episode's wave), so a backend's
    ``generate_together`` may send them as one call (sglang.py, Note [A wave in one call]).

    Safe to call from a worker thread (touches no episode). A failed request is None with its
    error when ``on_backend_error == "fail"``; otherwise the BackendError propagates.
    """
    policy0 = items[0][1].agent.policy
    generate = generate_for_waves(backend) if together else backend.generate
    try:
        completions: list[Completion | None] = list(generate([req for _, _, req in items]))
        errors: list[str | None] = [None] * len(items)
    except BackendError as exc:
        partial = getattr(exc, "partial", None)  # sglang's BatchError: what did come back
        if on_backend_error == "raise":
            raise
        completions = list(partial) if partial is not None and len(partial) == len(items) else [None] * len(items)
        errors = list(getattr(exc, "errors", None) or [str(exc)] * len(items))
    except SrpoGraphError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a device error: stop the run with a clear message
        raise BackendError(f"policy {policy0!r}: the backend failed on a batch of {len(items)} requests:"
                           f" {type(exc).__name__}: {exc}") from exc
    if len(completions) != len(items):
        raise BackendError(f"policy {policy0!r}: the backend answered {len(completions)} of {len(items)} requests")
    return completions, errors


def hand_back(items: Sequence[Item], completions: Sequence[Completion | None], errors: Sequence[str | None],
               backend: Backend, versions: Mapping[str, int], stats: dict, vocab_size: int | None) -> None:
    """Check each answer and give it to its episode (in ``items`` order), or fail the episode
    (kind ``backend``)."""
    default_version = getattr(backend, "weight_version", 0)
    reports_versions = bool(getattr(backend, "reports_weight_versions", False))
    for (ep, plan, req), comp, err in zip(items, completions, errors):
        if comp is None:
            if not ep.done:
                stats["backend_failures"] += 1
                stats["backend_error"] = stats["backend_error"] or f"policy {plan.agent.policy!r}: {err}"
                ep.fail(at_node(plan.agent, f"backend error on agent {plan.agent.name!r} (policy "
                                        f"{plan.agent.policy!r}): {err}"), "backend")
            continue
        stats["tokens"] += len(comp.completion_ids)
        if ep.done:
            continue
        if plan.tokenizer is None:  # a text-only (external) answer: recorded as text, no ids
            ep.add_output(plan.agent.name, Sampled(req, (), (), comp.finish_reason, comp.text or "", 0, "text"))
            continue
        ids, lps, finish, text = trim_at_stop(plan, checked_completion(comp, req, vocab_size=vocab_size))
        version = versions.get(plan.agent.policy, default_version)
        if reports_versions and comp.weight_version != version:
            # the engine says other weights produced it (a sync raced the rollout): stale
            stats["stale"] += 1
            version = comp.weight_version
        ep.add_output(plan.agent.name, Sampled(req, ids, lps, finish, text, version))


def vocab_size_of(backend: Any) -> int | None:
    """Token ids a backend may return: those its tokenizer can decode (None: unknown)."""
    try:
        return len(backend.tokenizer)
    except TypeError:
        return None


def checked_completion(comp: Completion, req: GenerationRequest, *, vocab_size: int | None = None) -> Completion:
    """What the trace schema needs of a backend's answer (the checks ``Output`` validates).

    Raises:
        BackendError: log-probs that do not pair with the ids, or are not finite log-probabilities;
            token ids that are not integers in ``[0, vocab_size)``; more tokens than
            ``req.max_new_tokens`` (a backend that ignored the limit).

    >>> checked_completion(Completion((5,), (-0.1,), "stop"), GenerationRequest((1,), 1)).completion_ids
    (5,)
    >>> checked_completion(Completion((5, 99), (-0.1, -0.2), "stop"), GenerationRequest((1,), 2), vocab_size=32)
    Traceback (most recent call last):
    ...
    srpo_graph.errors.BackendError: request '': token id 99 at completion position 1 is outside the vocabulary [0, 32)
    """
    ids = comp.completion_ids
    if len(ids) > req.max_new_tokens:
        raise BackendError(f"request {req.request_id!r}: {len(ids)} completion tokens for max_new_tokens "
                           f"{req.max_new_tokens} (the backend ignored the limit)")
    for pos, tok in enumerate(ids):
        if type(tok) is not int or tok < 0 or (vocab_size is not None and tok >= vocab_size):
            why = (f"is a {type(tok).__name__}, not an integer" if type(tok) is not int else
                   f"is outside the vocabulary [0, {vocab_size})" if vocab_size is not None else "is negative")
            raise BackendError(f"request {req.request_id!r}: token id {tok!r} at completion position {pos} {why}")
    lps = comp.logprobs
    if len(lps) != len(comp.completion_ids) or comp.finish_reason not in ("stop", "length", "abort"):
        raise BackendError(f"request {req.request_id!r}: {len(lps)} log-probs for {len(comp.completion_ids)} tokens,"
                           f" finish_reason {comp.finish_reason!r}")
    if lps and not (max(lps) <= LOGPROB_TOL and math.isfinite(sum(lps))):  # sum is NaN/-inf if any is
        raise BackendError(f"request {req.request_id!r}: log-probs {list(lps)[:8]} are not finite log-probabilities")
    if not req.prompt_ids:
        raise BackendError(f"request {req.request_id!r}: empty prompt")
    return comp





__all__ = ["Item", "batch_requests", "checked_completion", "hand_back", "over_context", "sample_batch",
           "vocab_size_of"]
