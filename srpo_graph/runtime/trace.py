"""The trace schema (runtime -> compiler) and its JSONL reader/writer.

One JSON line per episode. Token ids are recorded exactly as sent to and sampled from the
backend; nothing is ever re-tokenized from text. The reader rejects a broken line with a
:class:`~srpo_graph.errors.TraceError` naming the file, the line and the field, and can
instead skip bad lines (counting them) so a long trace file is never lost to one bad line.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from srpo_graph.errors import TraceError

SCHEMA_VERSION = "srpo-graph.trace/1"

JsonValue = Any  # the typed, extracted output: str | int | float | bool | list | dict | None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkflowRef(_Frozen):
    name: str
    hash: str  # sha256 of the .wf source


class Output(_Frozen):
    """One agent output: one generation."""

    id: str
    agent: str
    policy: str
    policy_version: int = 0
    step: int  # number of transitions fired in the episode before this output was generated
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # the sampler's, one per completion token, of the distribution sampled
    temperature: float = 1.0
    allowed_token_ids: list[int] | None = None  # the constraint sampled under, if any
    text: str
    value: JsonValue = None
    finish_reason: Literal["stop", "length", "abort"] = "stop"

    @model_validator(mode="after")
    def _lengths_agree(self) -> "Output":
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"output {self.id!r}: {len(self.logprobs)} logprobs for {len(self.completion_ids)} completion tokens"
            )
        if not self.prompt_ids:
            raise ValueError(f"output {self.id!r}: empty prompt_ids")
        for i, lp in enumerate(self.logprobs):
            if not math.isfinite(lp) or lp > 1e-4:
                raise ValueError(f"output {self.id!r}: logprobs[{i}] = {lp} is not a finite log-probability")
        return self


class TransitionRecord(_Frozen):
    """One firing of a transition: one event. ``consumed`` is its active set."""

    id: str
    name: str
    step: int
    consumed: list[str]  # output ids
    activated: list[str]  # agent names, or ["end"]
    tool_results: dict[str, JsonValue] | None = None
    reward: float | None = None


class Episode(_Frozen):
    schema_: str = Field(SCHEMA_VERSION, alias="schema")
    workflow: WorkflowRef
    task_id: str
    group_id: str  # episodes of one group (same task, G samples) share it
    sample: int
    seed: int
    outputs: list[Output]
    transitions: list[TransitionRecord]
    reward: float
    status: Literal["ok", "truncated", "failed"]
    error: str | None = None

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _ids_resolve(self) -> "Episode":
        if self.schema_ != SCHEMA_VERSION:
            raise ValueError(f"schema {self.schema_!r} is not {SCHEMA_VERSION!r}")
        ids = [o.id for o in self.outputs]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate output ids")
        known = set(ids)
        for k, t in enumerate(self.transitions):
            missing = [c for c in t.consumed if c not in known]
            if missing and self.status != "failed":
                raise ValueError(f"transitions[{k}].consumed: transition {t.id!r} consumes unknown output ids {missing}")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward: {self.reward} is not finite")
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


def parse_episode_line(line: str, path: str = "<string>", lineno: int = 1) -> Episode:
    """Parse one trace line; raise :class:`TraceError` naming ``path:line`` and the field."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{lineno}:{exc.colno}: error: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}:{lineno}: error: an episode must be a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise TraceError(
            f"{path}:{lineno}: error: field schema: {schema!r} is not {SCHEMA_VERSION!r}"
            " (written by another version of srpo-graph?)"
        )
    try:
        return Episode.model_validate(data)
    except ValidationError as exc:
        raise TraceError(f"{path}:{lineno}: error: {_format_validation(exc)}") from None


def read_traces(path: str | os.PathLike, *, skip_bad: bool = False, errors: list[TraceError] | None = None) -> list[Episode]:
    """Read a JSONL trace file.

    Args:
        path: the file.
        skip_bad: skip lines that do not validate instead of raising; each is appended to
            ``errors`` when given.
    Raises:
        TraceError: on the first bad line unless ``skip_bad``.
    """
    return list(iter_traces(path, skip_bad=skip_bad, errors=errors))


def iter_traces(path: str | os.PathLike, *, skip_bad: bool = False, errors: list[TraceError] | None = None) -> Iterator[Episode]:
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
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{p}: error: cannot read trace file: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, parse_episode_line(line, str(p), lineno)
            except TraceError as exc:
                if not skip_bad:
                    raise
                if errors is not None:
                    errors.append(exc)


def write_traces(path: str | os.PathLike, episodes: Iterable[Episode], *, append: bool = False) -> int:
    """Write episodes as JSONL (one line each, flushed per line). Returns the number written."""
    n = 0
    with Path(path).open("a" if append else "w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(ep.to_json() + "\n")
            n += 1
        fh.flush()
    return n
