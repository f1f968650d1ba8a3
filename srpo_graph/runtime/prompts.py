"""Per-agent sampling plans: how an agent's prompt becomes token ids and a request.

Runtime stage. Consumes a workflow's agents and each policy's backend tokenizer; produces an
:class:`AgentPlan` per agent. Tokenization happens once per prompt, here, and the ids are
recorded as sent; completion text is decoded from the sampled ids for extraction only.

* With a chat template, the prompt is one user message rendered with
  ``apply_chat_template(add_generation_prompt=True)`` then encoded without extra special
  tokens; without one it is encoded plainly and ``<bos>`` is put first when the tokenizer has
  one and did not add it.
* ``allow`` strings must each be one token of the policy's tokenizer (else an error at start).
* A chat agent (``system:`` / ``memory: chat``) gets its prompt ids from ``runtime/chat.py``
  instead (a conversation, token in and token out across turns); the turn ends at the
  tokenizer's end-of-turn token (its ``eos``, always a stop id).
* ``stop`` strings that are one token become ``stop_token_ids``; longer ones are matched on
  the decoded text afterwards and the completion is cut after the token that completes the
  match (the kept ids and log-probs are exactly the sampled prefix).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from srpo_graph.backends.base import Backend, Completion, GenerationRequest
from srpo_graph.errors import RuntimeFailure
from srpo_graph.runtime.chat import ChatPlan, chat_plan
from srpo_graph.runtime.episode import at_node
from srpo_graph.workflow import Agent, Workflow

_CACHE_LIMIT = 100_000  # entries per cache before it is emptied (bounded memory on long runs)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer.
        text: the rendered prompt.
    Returns:
        The prompt ids.
    """
    return encode_prompts(tokenizer, [text])[0]


def encode_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """:func:`encode_prompt` of many texts in one tokenizer call (no padding: ids are identical).

    Args:
        tokenizer: a Hugging Face tokenizer.
        texts: rendered prompts.
    Returns:
        One id list per text.
    """
    if not texts:
        return []
    if getattr(tokenizer, "chat_template", None):
        chats = [
            tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts
        ]
        return [list(ids) for ids in tokenizer(chats, add_special_tokens=False)["input_ids"]]
    bos = getattr(tokenizer, "bos_token_id", None)
    out = []
    for ids in tokenizer(list(texts))["input_ids"]:
        ids = list(ids)
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        out.append(ids)
    return out


_SINGLE: "weakref.WeakKeyDictionary[Any, dict[str, int | None]]" = weakref.WeakKeyDictionary()


def single_token_id(tokenizer: Any, s: str) -> int | None:
    """The id of ``s`` when it is exactly one token of ``tokenizer``, else None.

    Cached per tokenizer object (a run plans its agents once; training re-plans every step),
    so a tokenizer's vocabulary must not change after its first use here.
    """
    try:
        known = _SINGLE.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        known = {}
    if s not in known:
        known[s] = _single_token_id(tokenizer, s)
    return known[s]


def _single_token_id(tokenizer: Any, s: str) -> int | None:
    ids = tokenizer(s, add_special_tokens=False)["input_ids"]
    if len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None):
        return int(ids[0])
    tid = tokenizer.convert_tokens_to_ids(s)
    if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
        return tid
    return None


@dataclass(frozen=True)
class AgentPlan:
    """Everything the executor needs to sample one agent."""

    agent: Agent
    tokenizer: Any
    allowed_token_ids: tuple[int, ...] | None
    stop_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]  # every stop string, matched on the decoded text (one-token ones: stop ids too)
    chat: ChatPlan | None = None  # a chat agent's conversation rules (runtime/chat.py)
    # the G samples of a task send the same prompts and sample the same short completions:
    # encoding a text (decoding ids) once and reusing the result is exact, both are pure functions
    _cache: dict = field(default_factory=dict, repr=False, compare=False)
    _decoded: dict = field(default_factory=dict, repr=False, compare=False)

    def encode_many(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Ids of many prompts; the ones not seen yet are tokenized in one batched call."""
        if self.tokenizer is None:  # a text-only backend (an external model): no ids, the text is sent
            return [() for _ in texts]
        cache = self._cache
        todo = list(dict.fromkeys(t for t in texts if t not in cache))
        if todo:
            if len(cache) + len(todo) > _CACHE_LIMIT:
                cache.clear()
            for text, ids in zip(todo, encode_prompts(self.tokenizer, todo)):
                cache[text] = tuple(ids)
        return [cache[t] for t in texts]

    def request(self, prompt_ids: tuple[int, ...], *, seed: int, request_id: str,
                prompt_text: str | None = None, system_text: str | None = None) -> GenerationRequest:
        s = self.agent.sampling
        return GenerationRequest(
            prompt_ids=prompt_ids, max_new_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
            top_k=s.top_k, stop_token_ids=self.stop_token_ids, allowed_token_ids=self.allowed_token_ids,
            seed=seed, request_id=request_id, logprobs=s.logprobs,
            prompt_text=prompt_text if self.tokenizer is None else None,
            stop=self.stop_strings if self.tokenizer is None else (),
            system_text=system_text if self.tokenizer is None else None,
        )

    def decode(self, ids: Sequence[int]) -> str:
        key = tuple(ids)
        text = self._decoded.get(key)
        if text is None:
            if len(self._decoded) > _CACHE_LIMIT:
                self._decoded.clear()
            text = self._decoded[key] = self.tokenizer.decode(list(key), skip_special_tokens=True)
        return text


def plan_agents(workflow: Workflow, backends: Mapping[str, Backend]) -> dict[str, AgentPlan]:
    """Build every agent's plan.

    Raises:
        RuntimeFailure: an ``allow`` entry that is not one token of the policy's tokenizer.
    """
    plans = {}
    for agent in workflow.agents:
        tok = backends[agent.policy].tokenizer
        if tok is None and agent.chat is not None and agent.chat.memory == "chat":
            chat_plan(agent, tok)  # raises: a conversation of token ids needs a tokenizer
        # a text-only backend gets its `system:` as a message of its own (requests.py), not a ChatPlan
        chat = chat_plan(agent, tok) if agent.chat is not None and tok is not None else None
        if tok is None:  # a text-only backend (an external model): stops go as strings
            if agent.sampling.allow is not None or agent.sampling.top_k:  # the checker refuses these for
                # openai(...) policies; `run --backend openai` on a local policy's agent gets here
                raise RuntimeFailure(at_node(agent, f"agent {agent.name!r} uses `allow`/`top_k`, which the text-only "
                                                    f"backend of policy {agent.policy!r} cannot honour"))
            plans[agent.name] = AgentPlan(agent, None, None, (), tuple(agent.sampling.stop))
            continue
        allowed = None
        if agent.sampling.allow is not None:
            ids = [(s, single_token_id(tok, s)) for s in agent.sampling.allow]
            bad = [s for s, i in ids if i is None]
            if bad:
                raise RuntimeFailure(
                    f"agent {agent.name!r}: allow entries {bad} are not single tokens of policy"
                    f" {agent.policy!r}'s tokenizer"
                )
            allowed = tuple(dict.fromkeys(i for _, i in ids if i is not None))
        stop_ids, stop_strs = [], []
        for s in agent.sampling.stop:
            # a stop string is text: matched on the decoded completion, wherever its characters fall
            # (a real BPE vocabulary has "ans" as a token *and* inside " answer"); one that is a
            # single token also stops the sampler at that id (a fast path, not the rule)
            tid = single_token_id(tok, s)
            if tid is not None:
                stop_ids.append(tid)
            stop_strs.append(s)
        eos = getattr(tok, "eos_token_id", None)
        if eos is not None and eos not in stop_ids:
            stop_ids.append(eos)
        plans[agent.name] = AgentPlan(agent, tok, allowed, tuple(stop_ids), tuple(stop_strs), chat)
    return plans


def trim_at_stop(plan: AgentPlan, comp: Completion) -> tuple[tuple[int, ...], tuple[float, ...], str, str]:
    """Apply multi-token stop strings: (ids, logprobs, finish_reason, text) of the kept prefix."""
    ids, lps, finish = comp.completion_ids, comp.logprobs, comp.finish_reason
    if plan.stop_strings:
        text = plan.decode(ids)
        if any(s in text for s in plan.stop_strings):
            for k in range(1, len(ids) + 1):
                if any(s in plan.decode(ids[:k]) for s in plan.stop_strings):
                    ids, lps, finish = ids[:k], lps[:k], "stop"
                    break
    return ids, lps, finish, plan.decode(ids)
