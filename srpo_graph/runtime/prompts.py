"""Per-agent sampling plans: how an agent's prompt becomes token ids and a request.

Runtime stage. Consumes a workflow's agents and each policy's backend tokenizer; produces an
:class:`AgentPlan` per agent. Tokenization happens once per prompt, here, and the ids are
recorded as sent; completion text is decoded from the sampled ids for extraction only.

* With a chat template, the prompt is one user message rendered with
  ``apply_chat_template(add_generation_prompt=True)`` then encoded without extra special
  tokens; without one it is encoded plainly and ``<bos>`` is put first when the tokenizer has
  one and did not add it.
* ``allow`` strings must each be one token of the policy's tokenizer (else an error at start).
* ``stop`` strings that are one token become ``stop_token_ids``; longer ones are matched on
  the decoded text afterwards and the completion is cut after the token that completes the
  match (the kept ids and log-probs are exactly the sampled prefix).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from srpo_graph.backends.base import Backend, Completion, GenerationRequest
from srpo_graph.errors import RuntimeFailure
from srpo_graph.workflow import Agent, Workflow


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer.
        text: the rendered prompt.
    Returns:
        The prompt ids.
    """
    if getattr(tokenizer, "chat_template", None):
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        return list(tokenizer(chat, add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(text)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def single_token_id(tokenizer: Any, s: str) -> int | None:
    """The id of ``s`` when it is exactly one token of ``tokenizer``, else None."""
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
    stop_strings: tuple[str, ...]  # multi-token stops, matched on the decoded text
    # the G samples of a task send the same first prompts: tokenizing each text once is exact
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._cache.get(text)
        if ids is None:
            if len(self._cache) > 100_000:
                self._cache.clear()
            ids = self._cache[text] = tuple(encode_prompt(self.tokenizer, text))
        return ids

    def request(self, prompt_ids: tuple[int, ...], *, seed: int, request_id: str) -> GenerationRequest:
        s = self.agent.sampling
        return GenerationRequest(
            prompt_ids=prompt_ids, max_new_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
            top_k=s.top_k, stop_token_ids=self.stop_token_ids, allowed_token_ids=self.allowed_token_ids,
            seed=seed, request_id=request_id,
        )

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def plan_agents(workflow: Workflow, backends: Mapping[str, Backend]) -> dict[str, AgentPlan]:
    """Build every agent's plan.

    Raises:
        RuntimeFailure: an ``allow`` entry that is not one token of the policy's tokenizer.
    """
    plans = {}
    for agent in workflow.agents:
        tok = backends[agent.policy].tokenizer
        allowed = None
        if agent.sampling.allow is not None:
            ids = [(s, single_token_id(tok, s)) for s in agent.sampling.allow]
            bad = [s for s, i in ids if i is None]
            if bad:
                raise RuntimeFailure(
                    f"agent {agent.name!r}: allow entries {bad} are not single tokens of policy"
                    f" {agent.policy!r}'s tokenizer"
                )
            allowed = tuple(dict.fromkeys(i for _, i in ids))  # type: ignore[misc]
        stop_ids, stop_strs = [], []
        for s in agent.sampling.stop:
            tid = single_token_id(tok, s)
            (stop_ids.append(tid) if tid is not None else stop_strs.append(s))
        eos = getattr(tok, "eos_token_id", None)
        if eos is not None and eos not in stop_ids:
            stop_ids.append(eos)
        plans[agent.name] = AgentPlan(agent, tok, allowed, tuple(stop_ids), tuple(stop_strs))
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
