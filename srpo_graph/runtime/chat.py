"""Chat agents: a conversation per (episode, agent), token in and token out across turns.

Runtime stage. Consumes a chat agent (``Agent.chat``: ``system:``, ``memory:``, ``think:``), its
policy's tokenizer and chat template, and the episode's state; produces each turn's prompt ids.
It never calls a backend and never re-tokenizes a sampled token.

Note [Token in, token out]
~~~~~~~~~~~~~~~~~~~~~~~~~~
Turn 1's prompt is the template's rendering of ``[system?, user(prompt)]`` with the generation
prompt, encoded once. Turn k > 1 (``memory: chat``) is

    prompt_ids(k) = prompt_ids(k-1) + completion_ids(k-1) + delta_ids(k)

* ``completion_ids(k-1)`` are the ids the sampler returned for turn k-1 (kept after stop
  strings, ``prompts.trim_at_stop``), including the end-of-turn token when sampling stopped at
  it; under ``think: strip`` the ``<think> ... </think>`` block and the newlines after it are cut
  off first, exactly as Qwen3's template cuts ``content.split('</think>')[-1].lstrip('\\n')``.
* ``delta_ids(k)`` encode the template's text for the new messages: the conversation is rendered
  with a placeholder for the sampled turn and with the new messages after it; the text after
  the placeholder is the delta (the end-of-turn text the sampler did not produce, then the new
  messages and the generation prompt). The text before it must be exactly turn k-1's prompt
  text (the *prefix property*); a template that re-renders earlier turns differently breaks it
  and the episode fails with :class:`ChatTemplateError` instead of training on a drifted prompt.
  A placeholder, not the sampled text, goes through the template, so a template that rewrites
  assistant content (Qwen3 drops earlier think blocks) cannot change what was sampled.
* The new messages of a turn come from the firings since the agent's last turn that consumed
  that turn or activated this one (every firing that activated it while it was pending, not
  only the first), in firing order: the outputs of *other* agents each consumed,
  as user messages (their text after any think block), then its tool results, in the
  template's ``tool`` role (``user`` where the template has none) -- except the choice-typed
  ones, which are route labels, not content. Firings that bring nothing new (the agent
  activated itself, no tools) send the agent's prompt template rendered again as the user
  message.

Note [Think by text]
~~~~~~~~~~~~~~~~~~~~
``think: strip`` finds the block by text, as the template does: a model may sample ``</think>``
as its one special token or as ordinary BPE pieces (``</``, ``think``, ``>``), and a piece may
run on past it (``>\n\n``); both are cut at the same character. The one-token id is only a fast
path, so any tokenizer can strip (a Llama-shaped model that writes think blocks too).

Each turn is its own trace output with its own ``prompt_ids``; the trainer scores each output's
completion given that output's prompt ids, so every trained id is an id the sampler produced
and saw, whichever ``think`` option (tests/runtime/test_chat_agents.py proves it end to end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from srpo_graph.errors import RuntimeFailure
from srpo_graph.runtime.render import State, format_value, render
from srpo_graph.workflow import Agent, ChoiceType

# stands for a sampled assistant turn while the template renders the conversation
PLACEHOLDER = "SRPOGRAPHASSISTANTTURN"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class ChatTemplateError(RuntimeFailure):
    """A chat template that does not extend a conversation by appending to it (the prefix property)."""


@dataclass
class Conversation:
    """One chat agent's conversation in one episode (``memory: chat``)."""

    messages: list[dict[str, str]]  # as the template saw them: sampled turns are PLACEHOLDER
    text: str  # the template's text of the last prompt (placeholder form)
    prompt_ids: tuple[int, ...]  # the last turn's prompt ids, as sent


@dataclass(frozen=True)
class ChatPlan:
    """A chat agent's tokenizer facts, found once per run (:func:`chat_plan`)."""

    agent: Agent
    tokenizer: Any
    eot_id: int  # the end-of-turn token (the chat tokenizer's eos)
    eot_text: str
    tool_role: str  # "tool" where the template renders it, else "user"
    think_close_id: int | None  # the id of `</think>` when it is one token (a fast path; Note [Think by text])
    _newline_only: dict = field(default_factory=dict, repr=False, compare=False)

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()

    def strip_think(self, ids: Sequence[int]) -> tuple[int, ...]:
        """``ids`` without the think block: everything up to the end of the last ``</think>`` and the
        newlines right after it, as Qwen3's template cuts the text (Note [Think by text]).

        The ids after the cut are the sampled ones, except the token that holds the cut when the
        cut falls inside it (``</think>`` sampled as BPE pieces, e.g. ``</`` ``think`` ``>\n\nThe``,
        or a token that starts with newlines and goes on): what of its text is kept is re-encoded,
        the only ids here not sampled as such -- and the template's own cut.
        """
        ids = tuple(ids)
        text = self.tokenizer.decode(list(ids))
        if THINK_CLOSE not in text:
            return ids
        k = len(ids) - ids[::-1].index(self.think_close_id) if self.think_close_id in ids else 0
        if k and THINK_CLOSE not in self.tokenizer.decode(list(ids[k:])):
            extra = ""  # the last close is the one special token
        else:
            k, extra = self._after_last_close(ids, text.count(THINK_CLOSE))
        rest = ids[k:]
        extra = extra.lstrip("\n")
        if extra:  # the cut fell inside a token: its kept text, re-encoded
            return self.encode(extra) + rest
        while rest and self._is_newlines(rest[0]):
            rest = rest[1:]
        if rest and rest[0] != self.eot_id:
            first = self.tokenizer.decode([rest[0]])
            if first.startswith("\n"):
                rest = self.encode(first.lstrip("\n")) + rest[1:]
        return rest

    def _after_last_close(self, ids: tuple[int, ...], closes: int) -> tuple[int, str]:
        """(k, text): the shortest prefix ``ids[:k]`` whose text holds all ``closes`` copies of
        ``</think>`` (a binary search on decoded prefixes: the count only grows with k), and the
        text of that prefix after the last copy (the part of token k - 1 past the cut)."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.tokenizer.decode(list(ids[:mid])).count(THINK_CLOSE) >= closes:
                hi = mid
            else:
                lo = mid + 1
        head = self.tokenizer.decode(list(ids[:lo]))
        return lo, head[head.rfind(THINK_CLOSE) + len(THINK_CLOSE):]

    def _is_newlines(self, tid: int) -> bool:
        if tid not in self._newline_only:
            text = self.tokenizer.decode([tid])
            self._newline_only[tid] = bool(text) and set(text) == {"\n"}
        return self._newline_only[tid]


def chat_plan(agent: Agent, tokenizer: Any) -> ChatPlan:
    """The :class:`ChatPlan` of a chat agent.

    Raises:
        RuntimeFailure: a text-only policy, or a tokenizer without a chat template or end-of-turn
            token.
    """
    from srpo_graph.runtime.episode import at_node

    assert agent.chat is not None
    if tokenizer is None:
        raise RuntimeFailure(at_node(agent, f"chat agent {agent.name!r}: policy {agent.policy!r} is text-only "
                                            "(an external endpoint); a chat agent needs token ids"))
    if not getattr(tokenizer, "chat_template", None):
        raise RuntimeFailure(at_node(agent, f"chat agent {agent.name!r}: the tokenizer of policy {agent.policy!r} "
                                            "has no chat template (use a chat model, e.g. \"qwen3-test\")"))
    eot = getattr(tokenizer, "eos_token_id", None)
    if eot is None:
        raise RuntimeFailure(at_node(agent, f"chat agent {agent.name!r}: the tokenizer of policy {agent.policy!r} "
                                            "has no end-of-turn (eos) token"))
    close = tokenizer.convert_tokens_to_ids(THINK_CLOSE)
    close = close if isinstance(close, int) and close != getattr(tokenizer, "unk_token_id", None) else None
    return ChatPlan(agent, tokenizer, int(eot), tokenizer.convert_ids_to_tokens(int(eot)),
                    _tool_role(tokenizer), close)


def _tool_role(tokenizer: Any) -> str:
    mark = "SRPOGRAPHTOOLRESULT"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "q"}, {"role": "tool", "content": mark}],
                                             tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that refuses the role: tool results go as user messages
        return "user"
    return "tool" if mark in text else "user"


def _after_think(text: str) -> str:
    return text.split(THINK_CLOSE)[-1].lstrip("\n") if THINK_CLOSE in text else text


def delta_messages(ep: Any, cp: ChatPlan, previous: Any) -> list[dict[str, str]]:
    """The new messages of a chat agent's next turn (Note [Token in, token out]): from the firings
    since its ``previous`` output that consumed it or activated this turn, in firing order."""
    by = set(ep.activations.get(cp.agent.name, ()))  # every firing that activated this turn
    messages: list[dict[str, str]] = []
    for record in ep.records[previous.step:]:
        if previous.id not in record.consumed and record.id not in by:
            continue
        messages += [{"role": "user", "content": _after_think(o.text)}
                     for o in (ep.outputs[int(oid[1:])] for oid in record.consumed) if o.agent != cp.agent.name]
        transition = next(t for t in ep.wf.transitions if t.name == record.name)
        content = {tc.name for tc in transition.tools if not isinstance(tc.type, ChoiceType)}  # not route labels
        messages += [{"role": cp.tool_role, "content": format_value(v)}
                     for name, v in (record.tool_results or {}).items() if name in content]
    return messages


def chat_prompt(ep: Any, cp: ChatPlan) -> tuple[tuple[int, ...], str]:
    """The prompt ids of a chat agent's next turn in episode ``ep``, and its text (for display).

    Raises:
        RuntimeFailure: a reference without a value (as for any prompt).
        ChatTemplateError: the template breaks the prefix property.
    """
    agent, state = cp.agent, ep.state
    assert agent.chat is not None
    chats: dict[str, Conversation] = ep.chats
    conv = chats.get(agent.name) if agent.chat.memory == "chat" else None
    previous = _last_output(ep, agent.name) if conv is not None else None
    if conv is None or previous is None:
        messages = _first_messages(agent, state)
        text = cp.render(messages)
        ids = cp.encode(text)
    else:
        new = delta_messages(ep, cp, previous) or [{"role": "user", "content": render(agent.template, state)}]
        messages = [*conv.messages, {"role": "assistant", "content": PLACEHOLDER}, *new]
        text = cp.render(messages)
        at = text.rfind(PLACEHOLDER)
        if at < 0 or text[:at] != conv.text:
            raise ChatTemplateError(_prefix_problem(agent, conv.text, text, at))
        tail = text[at + len(PLACEHOLDER):]
        completion = tuple(previous.completion_ids)
        if agent.chat.think == "strip":
            completion = cp.strip_think(completion)
        if completion and completion[-1] == cp.eot_id:  # sampling stopped at the end of the turn
            if not tail.startswith(cp.eot_text):
                raise ChatTemplateError(f"chat agent {agent.name!r}: the template ends an assistant turn with "
                                        f"{tail[:20]!r}, not the end-of-turn token {cp.eot_text!r}")
            tail = tail[len(cp.eot_text):]
        ids = conv.prompt_ids + completion + cp.encode(tail)
    if agent.chat.memory == "chat":
        chats[agent.name] = Conversation(messages, text, ids)
    return ids, text


def _first_messages(agent: Agent, state: State) -> list[dict[str, str]]:
    assert agent.chat is not None
    system = [] if agent.chat.system is None else [{"role": "system", "content": render(agent.chat.system, state)}]
    return [*system, {"role": "user", "content": render(agent.template, state)}]


def _last_output(ep: Any, agent: str) -> Any:
    for o in reversed(ep.outputs):
        if o.agent == agent:
            return o
    return None


def _prefix_problem(agent: Agent, before: str, now: str, at: int) -> str:
    if at < 0:
        return f"chat agent {agent.name!r}: the chat template dropped the assistant turn's content"
    k = next((i for i, (a, b) in enumerate(zip(before, now)) if a != b), min(len(before), at))
    return (f"chat agent {agent.name!r}: the chat template re-renders the earlier turns differently once new "
            f"messages follow (the prefix property fails at character {k}: {before[k:k + 40]!r} became "
            f"{now[k:k + 40]!r}), so turns cannot extend the sampled tokens; use a template that renders a "
            "conversation by appending to it")
