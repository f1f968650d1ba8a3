"""One episode as a state machine: the firing rules of ``srpo_graph.workflow``, nothing else.

Runtime stage. Consumes a :class:`~srpo_graph.workflow.Workflow`, a task and the completions the
executor hands it; produces an :class:`~srpo_graph.runtime.trace.Episode`. It never calls a
backend and never blocks: it says which agents are *pending* (want a generation), accepts their
outputs, fires every transition that is ready (declaration order), and, when a transition has
tools, hands back a job for the executor's thread pool and waits for its result. The rule
itself (readiness, one latest output per consumed agent, bounds, route targets) is
:mod:`srpo_graph.lang.firing`, the definition the checker explores (Note [Firing semantics]).

Bounds are checked eagerly: when a firing activates an agent whose consumer can no longer fire
(``max_steps`` reached, or its ``max_rounds`` used up) the episode ends ``truncated`` at once,
so no output is generated that no transition could consume.
"""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from srpo_graph.backends.base import GenerationRequest
from srpo_graph.errors import Diagnostic, RuntimeFailure
from srpo_graph.lang import firing
from srpo_graph.lang.callables import import_module
from srpo_graph.runtime.render import State, call_args, choice_problem
from srpo_graph.runtime.trace import MAX_ABS_REWARD, ChatMessage, Episode, Output, TransitionRecord, WorkflowRef
from srpo_graph.runtime.usercode import Deadlines, Overdue, UserTimeout, described
from srpo_graph.runtime.usercode import call as call_user
from srpo_graph.supervisor import running
from srpo_graph.workflow import END, ActivateRoute, Call, Transition, Workflow

_OUTPUT_ORDER = tuple(Output.model_fields)  # the order model_construct (and so model_dump) keeps
_OUTPUT_FIELDS = frozenset(_OUTPUT_ORDER)


def sent_messages(req: Any) -> list[ChatMessage]:
    """The messages a text-only backend was sent for ``req`` (its ``system:``, then the prompt)."""
    system = getattr(req, "system_text", None)
    head = [ChatMessage(role="system", content=system)] if system is not None else []
    return [*head, ChatMessage(role="user", content=req.prompt_text or "")]


def _record_output(**fields: Any) -> Output:
    """``Output.model_construct(**fields)`` without its per-field default handling when every
    field is given (~4 us of the executor's ~25 us of Python per 1-token output, see
    benchmarks/profile_overheads.py); ``model_construct`` itself otherwise. No validation
    either way (see ``add_output``)."""
    if fields.keys() != _OUTPUT_FIELDS or Output.__private_attributes__:
        return Output.model_construct(**fields)
    out = Output.__new__(Output)
    object.__setattr__(out, "__dict__", {k: fields[k] for k in _OUTPUT_ORDER})
    object.__setattr__(out, "__pydantic_fields_set__", set(_OUTPUT_FIELDS))
    object.__setattr__(out, "__pydantic_extra__", None)
    object.__setattr__(out, "__pydantic_private__", None)
    return out


@dataclass(frozen=True)
class Sampled:
    """What the executor hands an episode for one pending agent: the request and what came back."""

    request: GenerationRequest
    completion_ids: tuple[int, ...]  # the kept ids (after multi-token stop strings)
    logprobs: tuple[float, ...]
    finish_reason: str
    text: str  # decoded from the kept ids, for extraction and display only
    policy_version: int
    source: str = "tokens"  # "text": a text-only backend's answer (trace ``Output.source``)


def at_node(node: Any, message: str) -> str:
    """An episode's error: ``message`` at the ``.wf`` position of the node that failed, rendered
    like a check error's first line (``search.wf:28:3: error: tool 'docs' raised ...``); a node
    without a position (a workflow built in Python) gives ``error: message``."""
    return Diagnostic(message, getattr(node, "span", None)).headline()


class _ToolFailed(Exception):
    """Which tool of a firing raised (the job runs a transition's tools in order)."""

    def __init__(self, tool: Any, cause: BaseException):
        super().__init__(f"tool {tool.name!r} raised {cause!r}")
        self.tool = tool


class Callables:
    """Imports the Python functions a workflow calls (``Call.module``), once, thread-safely.

    Modules are imported by the checker's importer (``lang.callables.import_module``): the
    ``.wf`` file's directory comes first on ``sys.path`` while a module is imported, so
    ``import my_tools`` finds a module next to it, and ``sys.path`` is left as it was. An import that fails is
    remembered and re-raised for every episode
    that needs it (each such episode is marked failed; the run goes on). It also indexes which
    transitions consume each agent (``consumers``), so readiness checks look at those only.
    """

    def __init__(self, workflow: Workflow, deadlines: Deadlines | None = None):
        self.deadlines = deadlines or Deadlines()
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], Callable[..., Any] | Exception] = {}
        # agent -> indices (declaration order) of the transitions that consume it
        self.consumers: dict[str, tuple[int, ...]] = {}
        for i, t in enumerate(workflow.transitions):
            for a in t.consume:
                self.consumers[a] = (*self.consumers.get(a, ()), i)
        # agent -> (its consumer, that transition's max_rounds), for consumers with a bound
        self.bounded = firing.bounded_consumers(workflow.transitions)
        self.base_dir = Path(workflow.path).resolve().parent if workflow.path and workflow.path != "<string>" else None

    def get(self, call: Call) -> Callable[..., Any]:
        key = (call.module, call.function)
        found = self._cache.get(key)  # a plain dict read is atomic: no lock once imported
        if found is not None and not isinstance(found, Exception):
            return found
        with self._lock:
            if key not in self._cache:
                try:
                    fn = getattr(import_module(call.module, self.base_dir), call.function)
                    if not callable(fn):
                        raise TypeError(f"{call.module}.{call.function} is not callable")
                    self._cache[key] = fn
                except Exception as exc:  # noqa: BLE001 - any import error fails the episodes that need it
                    self._cache[key] = RuntimeFailure(f"cannot import {call.qualname} ({call.module}): {exc!r}")
            found = self._cache[key]
        if isinstance(found, Exception):
            raise found
        return found


class EpisodeRun:
    """The mutable state of one running episode (see the module docstring)."""

    def __init__(
        self,
        workflow: Workflow,
        callables: Callables,
        task_id: str,
        task: dict[str, Any],
        group_id: str,
        sample: int,
        seed: int,
    ):
        self.wf, self.callables = workflow, callables
        self.task_id, self.group_id, self.sample, self.seed = task_id, group_id, sample, seed
        self.state = State(task=dict(task))
        self.pending: list[str] = []  # activated agents without an output yet, in activation order
        self.activator: dict[str, str | None] = {}  # pending agent -> the record id that activated it (None = start)
        # pending agent -> every firing that activated it while pending, in order (the first is
        # ``activator``'s): a chat agent's next turn carries the messages of all of them
        self.activations: dict[str, list[str]] = {}
        self.fresh: dict[str, list[str]] = {}  # agent -> unconsumed output ids (never an empty list)
        self.superseded: list[str] = []  # older fresh outputs the next recorded firing supersedes
        self.outputs: list[Output] = []
        self.records: list[TransitionRecord] = []
        self.rounds: dict[str, int] = {}  # transition -> times fired
        self.transition_rewards = 0.0
        self.end_activated = False
        self.status: str | None = None  # set when the episode is over
        self.error: str | None = None
        self.failure_kind: str | None = None  # one of usercode.FAILURE_KINDS once failed
        self.reward = 0.0
        self.waiting: tuple[Transition, list[str]] | None = None  # a firing whose tools run
        self.chats: dict[str, Any] = {}  # chat agent -> its runtime.chat.Conversation (``memory: chat``)
        self._activate(self.wf.start)

    # ------------------------------------------------------------------ queries

    @property
    def done(self) -> bool:
        return self.status is not None

    @property
    def steps(self) -> int:
        return len(self.records) + (1 if self.waiting else 0)

    def wants_generation(self) -> list[str]:
        """Agents to generate now (none while a tool runs or once the episode is over)."""
        return [] if self.done or self.waiting else list(self.pending)

    # ------------------------------------------------------------------ events

    def add_output(self, agent_name: str, sampled: Sampled) -> None:
        """Accept the generation of a pending agent: extract its typed value, record the output."""
        agent = self.wf.agent_by_name[agent_name]
        value, error, kind = None, None, "extractor"
        try:
            ex = agent.extractor
            fn = self.callables.get(ex)
            args, kwargs = call_args(ex, self.state)
            what = f"extractor {ex.qualname} of agent {agent.name!r}"
            try:
                value = call_user(
                    fn,
                    [sampled.text, *args],
                    kwargs,
                    module=ex.module,
                    what=what,
                    kind="extractor",
                    deadlines=self.callables.deadlines,
                    span=ex.span,
                )
            except ValueError:
                value = None  # the output holds no such value: documented, not a failure
        except UserTimeout as exc:
            error, kind = at_node(agent.extractor, str(exc)), "timeout"
        except Exception as exc:  # noqa: BLE001
            error, kind = (
                at_node(
                    agent.extractor, f"extractor {agent.extractor.qualname} of agent {agent.name!r} raised {exc!r}"
                ),
                "extractor",
            )
        req = sampled.request
        oid = f"o{len(self.outputs)}"
        # no re-validation here (it costs O(tokens) per output): every field is typed by
        # construction and the scheduler checked the backend's part (``requests.checked_completion``);
        # the trace reader validates everything
        self.outputs.append(
            _record_output(
                id=oid,
                agent=agent.name,
                policy=agent.policy,
                policy_version=int(sampled.policy_version),
                step=len(self.records),
                prompt_ids=list(req.prompt_ids),
                completion_ids=list(sampled.completion_ids),
                logprobs=list(sampled.logprobs),
                temperature=float(req.temperature),
                allowed_token_ids=None if req.allowed_token_ids is None else list(req.allowed_token_ids),
                max_tokens=int(req.max_new_tokens),
                activated_by=self.activator.pop(agent.name, None),
                top_k=int(req.top_k),
                top_p=float(req.top_p),
                logprob_mode=req.logprobs,
                text=sampled.text,
                value=value,
                finish_reason=sampled.finish_reason,
                source=sampled.source,
                messages=sent_messages(req) if sampled.source == "text" else None,
            )
        )
        if error is not None:
            self.fail(error, kind)
            return
        self.pending.remove(agent.name)
        self.activations.pop(agent.name, None)
        self.fresh.setdefault(agent.name, []).append(oid)
        self.state.values[agent.name] = value

    def fail(self, error: str, kind: str = "workflow") -> None:
        """End the episode as failed; ``kind`` is one of ``usercode.FAILURE_KINDS``."""
        if not self.done:
            self.status, self.error, self.reward, self.waiting = "failed", error, 0.0, None
            self.failure_kind = kind

    def advance(self) -> "ToolJob | None":
        """Fire every ready transition; return a tool job to run (the episode then waits) or None."""
        consumers, transitions = self.callables.consumers, self.wf.transitions
        while self.status is None and self.waiting is None:
            # only a transition consuming an agent with fresh outputs (a key of ``fresh``, never
            # an empty list) can be ready; the first declared one fires
            candidates = sorted({i for a in self.fresh for i in consumers.get(a, ())})
            ready = firing.first_ready(transitions, candidates, self.fresh, self.pending)
            if ready is None:
                if not self.pending:
                    if self.end_activated:
                        self._finish("ok")
                    else:
                        self.fail(
                            at_node(
                                self.wf, "episode stalled: nothing pending, no transition ready, `end` never activated"
                            )
                        )
                return None
            if firing.over_budget(ready, len(self.records), self.rounds, self.wf.max_steps):
                self._finish("truncated")
                return None
            consumed, superseded = firing.take(ready, self.fresh)
            self.superseded.extend(superseded)
            if ready.tools:
                try:
                    job = self._tool_job(ready)
                except Exception as exc:  # noqa: BLE001 - e.g. the tool's module does not import
                    self.fail(at_node(ready, f"tool of transition {ready.name!r}: {exc}"), "tool")
                    return None
                self.waiting = (ready, consumed)
                return job
            self._complete_firing(ready, consumed, None)
        return None

    def tool_done(self, results: dict[str, Any] | None, error: BaseException | None) -> None:
        """Resume after the executor ran the tool job returned by :meth:`advance`."""
        if self.waiting is None or self.done:
            return
        transition, consumed = self.waiting
        self.waiting = None
        if error is not None:
            if isinstance(error, UserTimeout):
                node = getattr(error, "node", None) or transition
                self.fail(at_node(node, f"{error} (transition {transition.name!r})"), "timeout")
            elif isinstance(error, _ToolFailed):
                self.fail(at_node(error.tool, f"{error} (transition {transition.name!r})"), "tool")
            else:
                self.fail(at_node(transition, f"tool of transition {transition.name!r}: {error!r}"), "tool")
            return
        self.state.vars.update(results or {})
        self._complete_firing(transition, consumed, results)

    # ------------------------------------------------------------------ internals

    def _tool_job(self, t: Transition) -> "ToolJob":
        # arguments are evaluated in the job, in order, each tool seeing the results of the earlier ones
        state = State(task=self.state.task, values=dict(self.state.values), vars=dict(self.state.vars))
        return ToolJob(t, [self.callables.get(tc.call) for tc in t.tools], state)

    def _complete_firing(self, t: Transition, consumed: list[str], tool_results: dict[str, Any] | None) -> None:
        reward = None
        if t.reward is not None:
            try:
                reward = self._call_reward(t.reward)
            except UserTimeout as exc:
                self.fail(at_node(t.reward, f"{exc} (transition {t.name!r})"), "timeout")
                return
            except Exception as exc:  # noqa: BLE001 - any failure of user code, SystemExit included (UserExit)
                self.fail(at_node(t.reward, f"reward {t.reward.qualname} of transition {t.name!r}: {exc!r}"), "reward")
                return
        try:
            activated = self._activation(t)
        except Exception as exc:  # noqa: BLE001 - e.g. a route on a value that names no case
            self.fail(at_node(t, f"transition {t.name!r}: {exc!r}"))
            return
        self.records.append(
            TransitionRecord(
                id=f"t{len(self.records)}",
                name=t.name,
                step=len(self.records),
                consumed=consumed,
                activated=list(activated),
                tool_results=tool_results,
                reward=reward,
                superseded=self.superseded or None,
            )
        )
        self.superseded = []
        self.rounds[t.name] = self.rounds.get(t.name, 0) + 1
        self.transition_rewards += reward or 0.0
        self._activate(activated, by=self.records[-1].id)
        if firing.truncates_after(activated, len(self.records), self.rounds, self.wf.max_steps, self.callables.bounded):
            self._finish("truncated")

    def _activation(self, t: Transition) -> tuple[str, ...]:
        fixed = firing.fixed_targets(t)
        if fixed is not None:
            return fixed
        assert isinstance(t.activate, ActivateRoute)
        return firing.route_targets(t.activate, self.state.get(t.activate.on))

    def _activate(self, names: tuple[str, ...] | list[str], by: str | None = None) -> None:
        for a in names:
            if a == END:
                self.end_activated = True
            else:
                if a not in self.pending:
                    self.pending.append(a)
                    self.activator[a] = by  # provenance: the firing that caused this output
                if by is not None:
                    self.activations.setdefault(a, []).append(by)

    def _call_reward(self, call: Call) -> float:
        args, kwargs = call_args(call, self.state)
        got = call_user(
            self.callables.get(call),
            args,
            kwargs,
            module=call.module,
            what=f"reward {call.qualname}",
            kind="reward",
            deadlines=self.callables.deadlines,
            span=call.span,
        )
        value = reward_value(call.qualname, got)
        if value != value or value in (float("inf"), float("-inf")) or abs(value) > MAX_ABS_REWARD:
            raise ValueError(f"reward {call.qualname} returned {value} (rewards are finite, |r| <= {MAX_ABS_REWARD:g})")
        return value

    def _finish(self, status: str) -> None:
        reward, terminal = self.wf.reward, 0.0
        if reward is not None:
            try:
                terminal = self._call_reward(reward)
            except UserTimeout as exc:
                self.fail(at_node(reward, f"terminal {exc}"), "timeout")
                return
            except Exception as exc:  # noqa: BLE001 - any failure of user code, SystemExit included (UserExit)
                self.fail(at_node(reward, f"terminal reward {reward.qualname}: {exc!r}"), "reward")
                return
        if abs(terminal + self.transition_rewards) > MAX_ABS_REWARD:  # the trace schema's bound
            self.fail(
                at_node(
                    reward or self.wf,
                    f"episode reward {terminal + self.transition_rewards:g} exceeds |r| <= {MAX_ABS_REWARD:g}",
                ),
                "reward",
            )
            return
        self.status, self.reward = status, terminal + self.transition_rewards

    def to_episode(self, workflow_ref: WorkflowRef) -> Episode:
        """The trace record (call once the episode is over)."""
        return Episode(
            workflow=workflow_ref,
            task_id=self.task_id,
            group_id=self.group_id,
            sample=self.sample,
            seed=self.seed,
            outputs=self.outputs,
            transitions=self.records,
            reward=self.reward,
            status=self.status or "failed",
            error=self.error,
        )


class ToolJob:
    """The tools of one firing, run in order in a worker thread (``usercode.start``); ``overdue``
    says which tool runs and since when, so the executor can fail the episode at that tool's
    deadline, naming its ``.wf`` line."""

    def __init__(self, t: Transition, fns: list[Callable[..., Any]], state: State):
        self.transition, self.fns, self.state = t, fns, state
        self.overdue = Overdue()

    def __call__(self) -> dict[str, Any]:
        results: dict[str, Any] = {}
        for tc, fn in zip(self.transition.tools, self.fns):
            self.overdue.begin(tc)
            what = described(f"tool {tc.name!r} {tc.call.qualname} of transition {self.transition.name!r}",
                             tc.call.module, tc.call.span)
            try:
                args, kwargs = call_args(tc.call, self.state)
                with running(what):  # named if it ends the process (supervisor.py)
                    results[tc.name] = self.state.vars[tc.name] = fn(*args, **kwargs)
                if (problem := choice_problem(tc.type, results[tc.name])) is not None:
                    raise ValueError(problem)  # a `-> Literal[...]` tool outside its labels
            except BaseException as exc:  # noqa: BLE001 - user code (SystemExit too): the episode fails, naming this tool
                raise _ToolFailed(tc, exc) from exc
        self.overdue.begin(None)
        return results

    def timeout(self, seconds: float) -> UserTimeout:
        """The error of the tool now past ``seconds`` (``node``: its ``.wf`` position)."""
        tc = self.overdue.current
        err = UserTimeout(f"tool {tc.name!r} ({tc.call.qualname})", "tool", seconds)
        err.node = tc  # type: ignore[attr-defined]
        return err


class RewardTypeError(TypeError):
    """A reward returned something that is not a real number (``repr`` is the message)."""

    def __repr__(self) -> str:
        return str(self)


def reward_value(qualname: str, got: Any) -> float:
    """A reward's value as a float: a real number only (``int``, ``float``, numpy reals), never a
    ``bool`` or a ``str`` (``True`` / ``"1.0"`` are a reward function's bug, not a score).

    >>> reward_value("m.f", 1), reward_value("m.f", 0.5)
    (1.0, 0.5)
    >>> reward_value("m.f", True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    srpo_graph.runtime.episode.RewardTypeError: returned True (a bool); a reward returns a real number ...
    """
    if isinstance(got, numbers.Real) and not isinstance(got, bool) and type(got).__name__ != "bool_":
        return float(got)
    raise RewardTypeError(
        f"returned {got!r:.80} (a {type(got).__name__}); a reward returns a real number "
        f"(int or float), not a bool or str"
    )
