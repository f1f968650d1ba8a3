"""Trainer stage: per-step metrics to ``RUN_DIR/metrics.jsonl`` and TensorBoard.

Consumes one flat record of numbers per step (``{"step": 3, "reward": 0.41, "loss/clip_frac": ...}``,
names with ``/`` group related values); produces one JSON line per step and the same scalars as
TensorBoard events in ``RUN_DIR/tensorboard``. Non-finite numbers are written as ``null`` in JSON
(JSON has no NaN) and skipped in TensorBoard.

On resume, :func:`truncate_after` drops the lines an interrupted run wrote after its last
checkpoint, so the resumed file equals an uninterrupted run's.

>>> flatten({"loss": {"clip_frac": 0.1, "by_size": {"2": 0.3}}, "step": 1})
{'loss/clip_frac': 0.1, 'loss/by_size/2': 0.3, 'step': 1}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

# Fields that depend on wall-clock time: excluded when comparing runs for equality.
TIMING_PREFIXES = ("time/", "throughput/", "async/")  # async/: overlapped rollouts' timing


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> one level, keys joined with ``/``."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f if math.isfinite(f) else None


class MetricsWriter:
    """Appends metric records to ``metrics.jsonl`` and (optionally) TensorBoard.

    Args:
        run_dir: the run folder.
        tensorboard: also write TensorBoard event files under ``run_dir/tensorboard``.
        purge_step: on resume, the first step to be written again: TensorBoard hides the
            events at and after it that an interrupted run had written.
        sinks: more places each record goes to, each with ``log(flat, step)`` and ``close()``
            (e.g. :class:`~srpo_graph.train.observe.wandb_sink.WandbSink`).
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, purge_step: int | None = None,
                 sinks: Sequence[Any] = ()):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self._tb = None
        self._sinks = list(sinks)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=purge_step)

    def log(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record (must hold ``step``); returns the cleaned, flat record."""
        flat = {k: _clean(v) for k, v in flatten(record).items()}
        step = int(flat["step"])
        self._fh.write(json.dumps(flat) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in flat.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        for sink in self._sinks:
            sink.log(flat, step)
        return flat

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        for sink in self._sinks:
            sink.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file (missing file: empty list).

    Raises:
        ConfigError: a line that does not read (``file:line``, the one JSONL reader's limits).
    """
    from srpo_graph.errors import ConfigError
    from srpo_graph.runtime.jsonl import iter_lines

    p = Path(path)
    if not p.exists():
        return []
    return [row for _, row in iter_lines(p, ConfigError, what="metrics file")]


# Note [No step missing from metrics.jsonl]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# On resume, metrics.jsonl is cut back to the checkpoint's step; a line that does not read is
# moved, as it was, to metrics.jsonl.damaged (the log is a record, the checkpoint holds the run's
# state, so the resume goes on). Its step must not then be silently missing:
#
# * a step after the checkpoint is run again, and the rerun writes its line (as for every step
#   after the checkpoint, damaged or not);
# * a step up to the checkpoint cannot be recomputed from weights, but the checkpoint's state keeps
#   the mean reward of every step and ``eval/reward`` of every evaluation (LoopState.rewards,
#   .evals): the step's line is written again from those, marked ``"metrics_lost"`` (what was lost),
#   so a reader or a plot sees the step and knows the rest of its numbers are gone. The same holds
#   for any step up to the checkpoint absent from the file (a line deleted by hand, the file gone).
#
# The user is told in one line (:func:`truncate_after`'s message). The alternative, a copy of every
# step's whole record in each checkpoint, was not taken: it grows each checkpoint by the whole log,
# and ``keep_last`` would delete the copies of older steps anyway.
LOST = "metrics_lost"


def checkpoint_records(step: int, rewards: Sequence[float], evals: Iterable[tuple[int, float]]) -> dict[int, dict]:
    """What a checkpoint at ``step`` keeps of the metrics of steps ``1..step`` (Note [No step missing
    from metrics.jsonl]): each step's ``reward`` (when the state holds one per step) and ``eval/reward``.

    >>> checkpoint_records(2, [0.5, 0.25], [(2, 0.75)])
    {1: {'step': 1, 'reward': 0.5}, 2: {'step': 2, 'reward': 0.25, 'eval/reward': 0.75}}
    """
    out: dict[int, dict] = {s: {"step": s} for s in range(1, step + 1)}
    if len(rewards) == step:
        for s, r in enumerate(rewards, start=1):
            out[s]["reward"] = _clean(r)
    for s, r in evals:
        if s in out:
            out[s]["eval/reward"] = _clean(r)
    return out


def truncate_after(path: str | Path, step: int, *, warn: Any = None,
                   restore: Mapping[int, Mapping[str, Any]] | None = None) -> list[str]:
    """Keep only the records with ``step <= step`` (used when resuming from a checkpoint).

    A cut-off last line (the process was killed while writing it) is dropped. Any other line that
    does not read (damaged on disk, edited by hand) does not stop the resume: it is moved, as it
    was, to ``metrics.jsonl.damaged``; the metrics log is a record, the checkpoint holds the run's
    state. A step up to ``step`` with no line left is written again from ``restore`` (what the
    checkpoint kept of it, :func:`checkpoint_records`) marked ``"metrics_lost"`` (Note [No step
    missing from metrics.jsonl]). One line through ``warn`` (default: stderr) says what was moved
    and restored. Returns the damaged lines' messages (``file:line: why``).
    """
    import sys

    from srpo_graph.errors import ConfigError
    from srpo_graph.runtime.jsonl import parse_line

    p = Path(path)
    if not p.exists() and not (restore and step > 0):
        return []
    lines = p.read_bytes().splitlines() if p.exists() else []
    rows, damaged, notes = [], [], []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = parse_line(line, str(p), i + 1, ConfigError)
            if not isinstance(row, dict) or type(row.get("step")) is not int:
                raise ConfigError.at(f"{p}:{i + 1}", "not a metrics record (a JSON object with an integer `step`)")
        except ConfigError as exc:
            if i == last:
                continue  # the last line was cut by a killed process: drop it (its step is redone)
            damaged.append(line)
            notes.append(str(exc).splitlines()[0])
            continue
        rows.append(row)
    aside = p.with_name(p.name + ".damaged")
    if damaged:
        with aside.open("ab") as fh:
            fh.write(b"".join(line + b"\n" for line in damaged))
    kept = [r for r in rows if r["step"] <= step]
    have = {r["step"] for r in kept}
    lost = [s for s in range(1, step + 1) if s not in have and restore is not None and s in restore]
    why = f"its line was damaged or missing (damaged lines: {aside.name})"
    for s in lost:
        assert restore is not None
        kept.append({**restore[s], "step": s, LOST: f"{why}; reward and eval/reward restored from the checkpoint"})
    kept.sort(key=lambda r: r["step"])
    tmp = p.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    tmp.replace(p)
    if damaged or lost:
        said = [f"{len(damaged)} damaged line(s) moved to {aside} ({'; '.join(notes)})"] if damaged else []
        if lost:
            said.append(f"step(s) {_ranges(lost)} written again from the checkpoint with reward and eval/reward "
                        f"only, marked \"{LOST}\"")
        print(f"srpo-graph train: {p.name}: {'; '.join(said)}; steps after {step} are run again, resuming",
              file=warn or sys.stderr)
    return notes


def _ranges(steps: Sequence[int]) -> str:
    """
    >>> _ranges([1, 2, 3, 5, 7, 8])
    '1-3, 5, 7-8'
    """
    out: list[str] = []
    for s in steps:
        if out and int(out[-1].split("-")[-1]) == s - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def deterministic_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record without wall-clock fields (timings, throughput): what resume must reproduce.

    >>> deterministic_fields({"step": 1, "reward": 0.5, "time/rollout": 0.2})
    {'step': 1, 'reward': 0.5}
    """
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def summarize(values: Iterable[float]) -> dict[str, float]:
    """mean/std/min/max of a sequence (empty -> zeros).

    >>> summarize([1.0, 3.0])
    {'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0}
    """
    xs = [float(v) for v in values]
    if not xs:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs)}
