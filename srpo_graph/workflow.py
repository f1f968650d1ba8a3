"""The typed workflow model: what ``check`` produces and every later stage consumes.

A :class:`Workflow` is a bipartite graph, like a Petri net: **agents** (one LLM call each)
and **transitions** (one environment step each). It is a frozen pydantic model, so it can be
saved as JSON and compared; :meth:`Workflow.graph` gives its networkx view.

Execution semantics (the runtime implements exactly these; the checker proves what it can):

* The episode starts by *activating* the agents in ``start``. An activated agent is
  *pending* until it produces one output (one generation).
* A transition *fires* when at least one agent it consumes has a fresh (not yet consumed)
  output and none of the agents it consumes is still pending (the first declared of the ready
  ones). It takes one output per consumed agent, the latest fresh one: its **active set**
  (one event); an older fresh output of that agent is *superseded* (recorded, no credit).
  The rule is ``lang/firing.py`` (Note [Firing semantics]). With fixed activations that is exactly "every agent
  it consumes has a fresh output"; with a multi-choice router only the activated
  specialists are waited for, so set sizes vary (``Transition.set_sizes``).
* Firing: run ``tools`` in order (results join the state under their names, replacing an
  older value), evaluate ``reward`` (a per-transition reward), then ``activate``:
  a fixed list of agents, ``end``, or a route on a choice-typed output.
* ``max_rounds`` bounds how often one transition may fire in an episode, ``max_steps``
  bounds the number of transition firings; exceeding either ends the episode as
  ``truncated`` (it is kept, not lost). The episode ends ``ok`` when ``end`` is activated
  and nothing is pending.
* The terminal ``reward`` is evaluated when the episode ends; the episode reward is the
  terminal reward plus the sum of transition rewards.
* An extractor that cannot read an output (raises ``ValueError``) leaves its value
  ``None``; a route on a ``None`` choice activates ``end``; built-in rewards score
  ``None`` as 0.
* References: ``task.FIELD``, ``AGENT`` (its latest output value), ``AGENT.FIELD`` (a record
  field), ``VAR`` (a tool result). A reference marked optional (``{docs?}``) renders as the
  empty string while absent; an unmarked reference must be produced on every path first.

The model knows nothing about parsing, tokens or tensors.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Annotated, Literal, Union

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

from srpo_graph.errors import Span

END = "end"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- types


class TextType(_Frozen):
    kind: Literal["text"] = "text"


class IntType(_Frozen):
    kind: Literal["int"] = "int"


class FloatType(_Frozen):
    kind: Literal["float"] = "float"


class BoolType(_Frozen):
    kind: Literal["bool"] = "bool"


class ChoiceType(_Frozen):
    """One label of ``options`` (``choice[a, b]``), or a non-empty subset (``choices[a, b]``)."""

    kind: Literal["choice"] = "choice"
    options: tuple[str, ...]
    multi: bool = False


class ListType(_Frozen):
    kind: Literal["list"] = "list"
    item: "WfType"


class RecordType(_Frozen):
    kind: Literal["record"] = "record"
    fields: tuple[tuple[str, "WfType"], ...]

    def field_type(self, name: str) -> "WfType | None":
        return dict(self.fields).get(name)


WfType = Annotated[
    Union[TextType, IntType, FloatType, BoolType, ChoiceType, ListType, RecordType],
    Field(discriminator="kind"),
]
ListType.model_rebuild()
RecordType.model_rebuild()


def type_str(t: WfType) -> str:
    """The type as written in ``.wf`` source.

    >>> type_str(ChoiceType(options=("a", "b")))
    'choice[a, b]'
    """
    if isinstance(t, ChoiceType):
        return f"{'choices' if t.multi else 'choice'}[{', '.join(t.options)}]"
    if isinstance(t, ListType):
        return f"list[{type_str(t.item)}]"
    if isinstance(t, RecordType):
        return "{" + ", ".join(f"{n}: {type_str(ft)}" for n, ft in t.fields) + "}"
    return t.kind


# --------------------------------------------------------------------------- expressions


class Ref(_Frozen):
    """A reference: ``task.target``, ``solver``, ``searcher.query``, ``docs``; ``?`` = optional."""

    kind: Literal["ref"] = "ref"
    path: tuple[str, ...]
    optional: bool = False
    span: Span | None = None

    def __str__(self) -> str:
        return ".".join(self.path) + ("?" if self.optional else "")


class Literal_(_Frozen):
    kind: Literal["literal"] = "literal"
    value: str | int | float | bool
    span: Span | None = None


Expr = Annotated[Union[Ref, Literal_], Field(discriminator="kind")]


class TextPart(_Frozen):
    kind: Literal["text"] = "text"
    text: str


class Template(_Frozen):
    """A prompt template: literal text and ``{reference}`` holes, in order."""

    parts: tuple[Annotated[Union[TextPart, Ref], Field(discriminator="kind")], ...]
    span: Span | None = None

    def refs(self) -> list[Ref]:
        return [p for p in self.parts if isinstance(p, Ref)]


class Call(_Frozen):
    """A call of a Python function from an imported module: ``std.exact_match(answer, task.answer)``.

    ``module`` is the importable Python module name (``srpo_graph.std`` for ``std``);
    ``alias`` is the name the ``.wf`` file used.
    """

    module: str
    alias: str
    function: str
    args: tuple[Expr, ...] = ()
    kwargs: tuple[tuple[str, Expr], ...] = ()
    span: Span | None = None

    @property
    def qualname(self) -> str:
        return f"{self.alias}.{self.function}"


# --------------------------------------------------------------------------- nodes


class Import(_Frozen):
    module: str
    alias: str
    span: Span | None = None


class LoraAdapter(_Frozen):
    """``lora("base", r=.., alpha=.., targets=[..], dropout=..)``: a LoRA adapter on another policy.

    The base policy's weights are loaded once and frozen; each adapter policy trains only its
    low-rank matrices ``B A`` (rank ``r``, scaled by ``alpha / r``) on the ``targets`` modules.
    """

    base: str  # the policy whose model is the frozen base (a full policy, never an adapter)
    r: int = 8  # rank, > 0
    alpha: float = 16.0  # scaling numerator (the update is alpha / r * B A), > 0
    targets: tuple[str, ...] = ("q_proj", "v_proj")  # module names (the last dotted component)
    dropout: float = 0.0  # in [0, 1); the trainer runs in eval mode, so only a stored setting

    def label(self) -> str:
        """The declaration as written back: ``lora("base", r=8, alpha=16, targets=[q_proj, v_proj])``."""
        alpha = int(self.alpha) if float(self.alpha).is_integer() else self.alpha
        extra = f", dropout={self.dropout}" if self.dropout else ""
        return f'lora("{self.base}", r={self.r}, alpha={alpha}, targets=[{", ".join(self.targets)}]{extra})'


class ExternalModel(_Frozen):
    """``openai("http://host:port/v1", model=.., api_key_env=.., timeout=.., retries=.., concurrency=..)``:
    a model behind an OpenAI-compatible chat-completions endpoint. Always frozen; text in and out."""

    url: str  # the API base, e.g. "http://127.0.0.1:30000/v1" (``/chat/completions`` is appended)
    model: str = "default"  # the ``model`` field of each request
    api_key_env: str | None = None  # the environment variable holding the API key (never the key)
    timeout: float = 60.0  # seconds per request, > 0
    retries: int = 2  # further attempts after a failed request, >= 0
    concurrency: int = 8  # requests in flight at once, >= 1

    def label(self) -> str:
        """The declaration as written back: ``openai("http://...", model="m")``."""
        key = f', api_key_env="{self.api_key_env}"' if self.api_key_env else ""
        return f'openai("{self.url}", model="{self.model}"{key})'


class Policy(_Frozen):
    """A model: a Hugging Face name, a local path, or ``tiny`` (the built-in default).

    Trainable unless declared ``frozen`` (sampled, never updated) or ``external`` (a model
    behind an OpenAI-compatible endpoint, always frozen; ``model`` is then its URL). With
    ``adapter`` set, the policy is a LoRA adapter on ``adapter.base`` and ``model`` is the base
    policy's model (filled in by the checker). A policy that is the base of adapters is frozen:
    agents that use it sample from the base with every adapter disabled.
    """

    name: str
    model: str
    adapter: LoraAdapter | None = None
    span: Span | None = None
    frozen: bool = False  # declared `frozen` (or external): never updated, no optimizer, no weights saved
    external: ExternalModel | None = None

    def label(self) -> str:
        """``"tiny"`` for a full policy, the ``lora(...)`` or ``openai(...)`` declaration, `` frozen`` when declared."""
        if self.external is not None:
            return self.external.label()
        core = self.adapter.label() if self.adapter is not None else f'"{self.model}"'
        return core + (" frozen" if self.frozen else "")


class Sampling(_Frozen):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (full vocabulary)
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    allow: tuple[str, ...] | None = None  # token strings the output is constrained to
    # log-prob of record with top-k/top-p: "full" (the full temperature-scaled distribution) or
    # "sampled" (the truncated, renormalized distribution actually sampled); rollout.logprobs
    logprobs: Literal["full", "sampled"] = "full"


class Chat(_Frozen):
    """A chat agent's conversation settings (``system:``, ``memory:``, ``think:``; runtime/chat.py).

    The agent's messages go through its policy's chat template. With ``memory == "chat"`` the
    agent keeps one conversation per episode: turn k's prompt ids are turn k-1's prompt ids, its
    sampled completion ids and the delta of the new messages (Note [Token in, token out]).
    """

    system: Template | None = None  # the system message (rendered once, at the first turn)
    memory: Literal["none", "chat"] = "none"  # "chat": a conversation across activations
    # a sampled `<think>...</think>` block in later turns' prompts: kept as sampled, or removed
    # (as Qwen3's template removes it from turns before the last user message)
    think: Literal["keep", "strip"] = "keep"


class Agent(_Frozen):
    node: Literal["agent"] = "agent"
    name: str
    policy: str
    template: Template
    sampling: Sampling = Sampling()
    output: WfType = TextType()
    extractor: Call  # called as fn(text, *args, **kwargs); the checker fills a default per type
    span: Span | None = None
    chat: Chat | None = None  # None: a plain agent (one user message per activation)


class ToolCall(_Frozen):
    name: str  # the state variable the result is stored under
    call: Call
    type: WfType
    span: Span | None = None


class ActivateAgents(_Frozen):
    kind: Literal["agents"] = "agents"
    agents: tuple[str, ...]


class ActivateEnd(_Frozen):
    kind: Literal["end"] = "end"


class ActivateRoute(_Frozen):
    """Route on a choice-typed output: each label activates its agents (or ``end``)."""

    kind: Literal["route"] = "route"
    on: Ref
    cases: tuple[tuple[str, tuple[str, ...]], ...]  # label -> agent names, END allowed

    def targets(self, label: str) -> tuple[str, ...]:
        return dict(self.cases).get(label, (END,))


Activation = Annotated[Union[ActivateAgents, ActivateEnd, ActivateRoute], Field(discriminator="kind")]


class Transition(_Frozen):
    node: Literal["transition"] = "transition"
    name: str
    consume: tuple[str, ...]
    tools: tuple[ToolCall, ...] = ()
    reward: Call | None = None
    activate: Activation
    max_rounds: int | None = None
    set_sizes: tuple[int, ...] = ()  # proved by the checker: the possible active-set sizes
    span: Span | None = None


class Workflow(_Frozen):
    name: str
    description: str = ""
    path: str = "<string>"
    source_hash: str = ""
    imports: tuple[Import, ...] = ()
    task_fields: tuple[tuple[str, WfType], ...] = ()
    policies: tuple[Policy, ...]
    agents: tuple[Agent, ...]
    transitions: tuple[Transition, ...]
    start: tuple[str, ...]
    reward: Call | None = None
    max_steps: int = 32
    span: Span | None = None

    # -- lookups -------------------------------------------------------------

    @cached_property
    def agent_by_name(self) -> dict[str, Agent]:
        return {a.name: a for a in self.agents}

    @cached_property
    def transition_by_name(self) -> dict[str, Transition]:
        return {t.name: t for t in self.transitions}

    @cached_property
    def policy_by_name(self) -> dict[str, Policy]:
        return {p.name: p for p in self.policies}

    @cached_property
    def frozen_bases(self) -> frozenset[str]:
        """Policies that are the base of at least one LoRA adapter (frozen, never updated)."""
        return frozenset(p.adapter.base for p in self.policies if p.adapter is not None)

    @cached_property
    def untrained_policies(self) -> frozenset[str]:
        """Policies the trainer never updates: declared ``frozen``, external, or the base of adapters."""
        return frozenset(p.name for p in self.policies if p.frozen or p.external is not None) | self.frozen_bases

    @cached_property
    def trained_policies(self) -> tuple[str, ...]:
        """The policies training updates, in declaration order."""
        return tuple(p.name for p in self.policies if p.name not in self.untrained_policies)

    @cached_property
    def consumer_of(self) -> dict[str, str]:
        """agent name -> the transition that consumes its outputs."""
        return {a: t.name for t in self.transitions for a in t.consume}

    # -- the networkx view ----------------------------------------------------

    def graph(self) -> nx.MultiDiGraph:
        """The routing graph: nodes ``start``, agents, transitions and ``end``.

        Node attribute ``kind`` is ``agent``/``transition``/``start``/``end``; agent nodes carry
        ``policy``, transition nodes ``set_sizes``. Edge attribute ``kind`` is ``start``,
        ``consume``, ``activate`` or ``route`` (with ``label``, the choice).
        """
        g = nx.MultiDiGraph(name=self.name)
        g.add_node("start", kind="start")
        g.add_node(END, kind="end")
        for agent in self.agents:
            g.add_node(agent.name, kind="agent", policy=agent.policy)
        for t in self.transitions:
            g.add_node(t.name, kind="transition", set_sizes=t.set_sizes, max_rounds=t.max_rounds)
        for a in self.start:
            g.add_edge("start", a, kind="start")
        for t in self.transitions:
            for a in t.consume:
                g.add_edge(a, t.name, kind="consume")
            act = t.activate
            if isinstance(act, ActivateAgents):
                for a in act.agents:
                    g.add_edge(t.name, a, kind="activate")
            elif isinstance(act, ActivateEnd):
                g.add_edge(t.name, END, kind="activate")
            else:
                for label, targets in act.cases:
                    for a in targets:
                        g.add_edge(t.name, a, kind="route", label=label)
        return g

    def _repr_svg_(self) -> str:  # Jupyter shows a Workflow as its routing graph
        from srpo_graph.viz import to_svg

        return to_svg(self)


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
