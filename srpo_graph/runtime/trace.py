"""The trace schema (runtime -> compiler) and its JSONL reader/writer.

One JSON line per episode. Token ids are recorded exactly as sent to and sampled from the
backend; nothing is ever re-tokenized from text. The reader rejects a broken line with a
:class:`~srpo_graph.errors.TraceError` naming the file, the line and the field, and can
instead skip bad lines (counting them) so a long trace file is never lost to one bad line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Any, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from srpo_graph.errors import TraceError
from srpo_graph.runtime.jsonl import MAX_DEPTH, iter_lines, parse_line  # noqa: F401 - MAX_DEPTH: part of the trace rules

SCHEMA_VERSION = "srpo-graph.trace/1"

JsonValue = Any  # the typed, extracted output: str | int | float | bool | list | dict | None

# Numbers are strict: a JSON string "1.0" is not a float here, nor `true` an int (pydantic would
# coerce both), and every integer fits the int64 tensors the compiler builds from it.
MAX_ABS_REWARD = 1e9  # |reward| above this is a bug upstream (and would overflow advantage statistics)
TokenId = Annotated[int, Field(strict=True, ge=0, lt=2**31)]
Count = Annotated[int, Field(strict=True, ge=0, lt=2**63)]
Seed = Annotated[int, Field(strict=True, ge=-(2**63), lt=2**63)]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Reward = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_ABS_REWARD, le=MAX_ABS_REWARD)]


LOGPROB_TOL = 1e-4  # a log-prob may exceed 0 by float rounding, never by more
# Log-probs, temperatures and top-p become float32 tensors in the compiler (SetBatch): a JSON number
# finite as a Python float but past float32's range (-1e39) would compile to -inf, and a positive one
# below its smallest normal (1e-40) to 0 or a subnormal (a temperature that divides by ~0). So the
# rules are checked on the value float32 will hold.
F32_MAX = 3.4028234663852886e38
F32_TINY = 1.1754943508222875e-38  # the smallest positive normal float32


def _f32_positive(x: float) -> bool:
    """``x`` is a positive float32 that stays a normal number (no overflow, no underflow)."""
    return F32_TINY <= x <= F32_MAX


# Note [One copy of the trace rules]
# The rules an episode must keep are written once, here, as generators of (field, message): the
# pydantic validators below raise the first one when a trace line is read, and the compiler
# applies the same functions to in-memory episodes, which the runtime builds with
# ``model_construct`` (no validation, for speed). Field paths are relative to the output or the
# episode (``logprobs[3]``, ``transitions[1].consumed``).


def output_problems(o: Any) -> Iterator[tuple[str, str]]:
    """The rules one :class:`Output` breaks, as ``(field, message)``, in a fixed order.

    >>> o = Output.model_construct(id="o0", prompt_ids=[1], completion_ids=[2], logprobs=[0.5], temperature=1.0,
    ...                            allowed_token_ids=None, max_tokens=None)
    >>> list(output_problems(o))
    [('logprobs[0]', "output 'o0': logprobs[0] = 0.5 is not a finite log-probability")]
    """
    if getattr(o, "source", "tokens") == "text":  # an external model's answer: text only, no ids
        if o.prompt_ids or o.completion_ids or o.logprobs:
            yield "source", f"output {o.id!r}: a text-only output (source 'text') records no token ids or log-probs"
    elif not o.prompt_ids:
        yield "prompt_ids", f"output {o.id!r}: empty prompt_ids"
    if getattr(o, "messages", None) is not None and getattr(o, "source", "tokens") != "text":
        yield "messages", f"output {o.id!r}: only a text-only output (source 'text') records the messages it sent"
    if len(o.logprobs) != len(o.completion_ids):
        yield "logprobs", f"output {o.id!r}: {len(o.logprobs)} logprobs for {len(o.completion_ids)} completion tokens"
    for name in ("prompt_ids", "completion_ids"):
        ids = getattr(o, name)
        if ids and min(ids) < 0:
            yield name, f"output {o.id!r}: token id {min(ids)} < 0"
    if not (math.isfinite(o.temperature) and o.temperature >= 0):
        yield "temperature", f"output {o.id!r}: temperature {o.temperature} is not >= 0"
    elif o.temperature != 0 and not _f32_positive(o.temperature):
        yield "temperature", (f"output {o.id!r}: temperature {o.temperature} is outside float32's normal range "
                              f"[{F32_TINY:.4g}, {F32_MAX:.4g}] (0 = greedy)")
    top_p = getattr(o, "top_p", 1.0)
    if isinstance(top_p, float) and 0 < top_p < F32_TINY:
        yield "top_p", f"output {o.id!r}: top_p {top_p} rounds to 0 in float32 (smallest: {F32_TINY:.4g})"
    lps = o.logprobs
    # C loops (max, min, all); the index only if one is bad; -F32_MAX: float32's -inf below it
    if lps and (max(lps) > LOGPROB_TOL or min(lps) < -F32_MAX or not all(map(math.isfinite, lps))):
        k = next(i for i, lp in enumerate(lps) if not -F32_MAX <= lp <= LOGPROB_TOL)
        why = " (below float32's range: it would compile to -inf)" if math.isfinite(lps[k]) and lps[k] < 0 else ""
        yield f"logprobs[{k}]", f"output {o.id!r}: logprobs[{k}] = {lps[k]} is not a finite log-probability{why}"
    if o.allowed_token_ids is not None:
        if not o.allowed_token_ids:
            yield "allowed_token_ids", f"output {o.id!r}: allowed_token_ids is empty"
        else:
            outside = set(o.completion_ids) - set(o.allowed_token_ids)
            if outside:
                yield (
                    "completion_ids",
                    f"output {o.id!r}: completion_ids {sorted(outside)} are outside its allowed_token_ids",
                )
    if o.max_tokens is not None and len(o.completion_ids) > o.max_tokens:
        yield "max_tokens", f"output {o.id!r}: {len(o.completion_ids)} completion tokens for max_tokens {o.max_tokens}"


def episode_problems(ep: Any, *, outputs: bool = False, resolve_ids: bool = True) -> Iterator[tuple[str, str]]:
    """The rules one :class:`Episode` breaks, as ``(field, message)``.

    Args:
        ep: the episode.
        outputs: also each output's rules (:func:`output_problems`, fields ``outputs[j].*``);
            the validators check outputs on their own.
        resolve_ids: every consumed id names an output (episodes that did not fail); the
            compiler instead drops or rejects an event with a missing member by its own option.
    """
    if getattr(ep, "schema_", SCHEMA_VERSION) != SCHEMA_VERSION:
        yield "schema", f"{ep.schema_!r} is not {SCHEMA_VERSION!r}"
    if not isinstance(ep.reward, (int, float)) or not math.isfinite(ep.reward):
        yield "reward", f"{ep.reward!r} is not a finite number"
    known: set[str] = set()
    for j, o in enumerate(ep.outputs):
        if o.id in known:
            yield f"outputs[{j}].id", f"duplicate output id {o.id!r}"
        known.add(o.id)
        if outputs:
            for field_, message in output_problems(o):
                yield f"outputs[{j}].{field_}", message
    seen: set[str] = set()
    consumer: dict[str, str] = {}
    for k, t in enumerate(ep.transitions):
        if t.id in seen:
            yield f"transitions[{k}].id", f"duplicate transition id {t.id!r}"
        seen.add(t.id)
        if t.reward is not None and not math.isfinite(t.reward):
            yield f"transitions[{k}].reward", f"transition {t.id!r}: {t.reward} is not finite"
        missing = [c for c in t.consumed if c not in known]
        if resolve_ids and missing and ep.status != "failed":
            yield f"transitions[{k}].consumed", f"transition {t.id!r} consumes unknown output ids {missing}"
        for c in t.consumed:
            if c in consumer:
                yield f"transitions[{k}].consumed", f"output {c!r} is consumed by both {consumer[c]!r} and {t.id!r}"
            consumer[c] = t.id
        for c in t.superseded or ():
            if c in consumer:
                yield (
                    f"transitions[{k}].superseded",
                    f"output {c!r} is superseded by {t.id!r} and consumed by {consumer[c]!r}",
                )
            consumer[c] = t.id


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkflowRef(_Frozen):
    name: str
    hash: str  # sha256 of the .wf source


class ChatMessage(_Frozen):
    """One message sent to a text-only (external) policy: ``system`` or ``user``."""

    role: Literal["system", "user"]
    content: str


class Output(_Frozen):
    """One agent output: one generation."""

    id: str
    agent: str
    policy: str
    policy_version: Count = 0
    step: Count  # number of transitions fired in the episode before this output was generated
    prompt_ids: list[TokenId]
    completion_ids: list[TokenId]
    logprobs: list[Finite]  # the sampler's, one per completion token, of the distribution sampled
    temperature: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0.0)] = 1.0
    allowed_token_ids: list[TokenId] | None = None  # the constraint sampled under, if any
    # the max_new_tokens it was sampled with (Dr. GRPO's constant denominator)
    max_tokens: Annotated[int, Field(strict=True, ge=1, lt=2**31)] | None = None
    activated_by: str | None = None  # id of the transition record whose firing activated it; None = start
    top_k: Annotated[int, Field(strict=True, ge=0)] = 0  # the top-k / top-p it was sampled with (0 / 1.0 = off)
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    logprob_mode: Literal["full", "sampled"] = "full"  # the convention of ``logprobs`` (backends/sampling.py)
    text: str
    value: JsonValue = None
    finish_reason: Literal["stop", "length", "abort"] = "stop"
    # "text": an external (OpenAI-compatible) model's answer, recorded as text only -- no prompt or
    # completion ids, no log-probs (backends/openai.py says why); always from a frozen policy
    source: Literal["tokens", "text"] = "tokens"
    # a text output: the messages sent to the endpoint (system, user), as sent; None for token outputs
    messages: list[ChatMessage] | None = None

    @model_validator(mode="after")
    def _rules(self) -> "Output":  # Note [One copy of the trace rules]
        for _field, message in output_problems(self):
            raise ValueError(message)
        return self


class TransitionRecord(_Frozen):
    """One firing of a transition: one event. ``consumed`` is its active set."""

    id: str
    name: str
    step: Count
    consumed: list[str]  # output ids
    activated: list[str]  # agent names, or ["end"]
    tool_results: dict[str, JsonValue] | None = None
    reward: Reward | None = None
    # older fresh outputs of a consumed agent that this firing dropped (it takes the latest of
    # each agent: Note [Firing semantics] in lang/firing.py); they are in no active set
    superseded: list[str] | None = None


class Episode(_Frozen):
    schema_: str = Field(SCHEMA_VERSION, alias="schema")
    workflow: WorkflowRef
    task_id: str
    group_id: str  # episodes of one group (same task, G samples) share it
    sample: Annotated[int, Field(strict=True, ge=0, lt=2**31)]
    seed: Seed
    outputs: list[Output]
    transitions: list[TransitionRecord]
    reward: Reward
    status: Literal["ok", "truncated", "failed"]
    error: str | None = None

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _rules(self) -> "Episode":  # Note [One copy of the trace rules]
        for field_, message in episode_problems(self):
            raise ValueError(f"{field_}: {message}")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


# --------------------------------------------------------------------------- JSONL I/O


def _format_validation(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:5]:
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        # whole-episode checks name their field at the start of the message
        parts.append(f"field {loc}: {msg}" if loc else f"field {msg}")
    more = len(err.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_episode_line(line: str | bytes, path: str = "<string>", lineno: int = 1) -> Episode:
    """Parse one trace line; raise :class:`TraceError` naming ``path:line`` and the field.

    Every way a line can be wrong is a TraceError: not UTF-8, not JSON (also numbers too long
    to read, nesting deeper than Python's stack), nesting deeper than :data:`MAX_DEPTH`, or a
    field that breaks the schema.

    >>> parse_episode_line(b'{"schema": \\xff}', "t.jsonl", 3)
    Traceback (most recent call last):
    ...
    srpo_graph.errors.TraceError: t.jsonl:3:12: error: not UTF-8 text (byte 0xff)
    """
    data = parse_line(line, path, lineno, TraceError)  # the one JSONL reader: UTF-8, JSON, limits
    if not isinstance(data, dict):
        raise TraceError.at(f"{path}:{lineno}", f"an episode must be a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise TraceError.at(
            f"{path}:{lineno}",
            f"field schema: {schema!r} is not {SCHEMA_VERSION!r} (written by another version of srpo-graph?)",
        )
    try:
        return Episode.model_validate(data)
    except ValidationError as exc:
        raise TraceError.at(f"{path}:{lineno}", _format_validation(exc)) from None


def read_traces(
    path: str | os.PathLike, *, skip_bad: bool = False, errors: list[TraceError] | None = None
) -> list[Episode]:
    """Read a JSONL trace file.

    Args:
        path: the file.
        skip_bad: skip lines that do not validate instead of raising; each is appended to
            ``errors`` when given.
    Raises:
        TraceError: on the first bad line unless ``skip_bad``.
    """
    return list(iter_traces(path, skip_bad=skip_bad, errors=errors))


def iter_traces(
    path: str | os.PathLike, *, skip_bad: bool = False, errors: list[TraceError] | None = None
) -> Iterator[Episode]:
    """Episodes of a JSONL trace file, one at a time (see :func:`read_traces`)."""
    for _, episode in iter_numbered_traces(path, skip_bad=skip_bad, errors=errors):
        yield episode


def iter_numbered_traces(
    path: str | os.PathLike, *, skip_bad: bool = False, errors: list[TraceError] | None = None
) -> Iterator[tuple[int, Episode]]:
    """``(line number, episode)`` of every trace line, so later errors can still point at the line.

    Raises:
        TraceError: the file cannot be read, or on the first bad line unless ``skip_bad``
            (skipped lines are appended to ``errors`` when given).
    """
    # the one JSONL reader (jsonl.py), each line turned into an Episode
    bad = (errors if errors is not None else []) if skip_bad else None
    yield from iter_lines(path, TraceError, what="trace file", bad=bad, parse=parse_episode_line)


def read_trace_set(path: str | os.PathLike) -> list[Episode]:
    """Read a trace file that is one batch: every line valid, one workflow (name and hash) and
    each ``(group_id, sample)`` once -- the rules ``compile`` applies, so ``show`` shows exactly
    the files ``compile`` accepts.

    Raises:
        TraceError: ``path:line`` and the field of the first line that breaks a rule.
    """
    episodes: list[Episode] = []
    first: tuple[str, str, int] | None = None
    seen: dict[tuple[str, int], int] = {}
    for lineno, ep in iter_numbered_traces(path):
        where = f"{path}:{lineno}"
        if first is None:
            first = (ep.workflow.name, ep.workflow.hash, lineno)
        elif ep.workflow.name != first[0]:
            raise TraceError.at(
                where,
                f"field workflow.name: {ep.workflow.name!r}, but line {first[2]} is from "
                f"workflow {first[0]!r}; one trace file holds one workflow's episodes",
            )
        elif ep.workflow.hash != first[1]:
            raise TraceError.at(
                where,
                f"field workflow.hash: workflow {first[0]!r} changed since line {first[2]} "
                f"(hash {ep.workflow.hash[:12]} vs {first[1][:12]})",
            )
        key = (ep.group_id, ep.sample)
        if key in seen:
            raise TraceError.at(
                where, f"field sample: group {ep.group_id!r} sample {ep.sample} appears twice (also line {seen[key]})"
            )
        seen[key] = lineno
        episodes.append(ep)
    return episodes


def write_traces(path: str | os.PathLike, episodes: Iterable[Episode], *, append: bool = False) -> int:
    """Write episodes as JSONL (one line each, flushed per line). Returns the number written."""
    n = 0
    with Path(path).open("a" if append else "w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(ep.to_json() + "\n")
            n += 1
        fh.flush()
    return n
