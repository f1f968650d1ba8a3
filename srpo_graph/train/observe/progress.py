"""Trainer stage: the one progress display of a run, showing the key numbers of each step.

Consumes the step's flat metric record; shows step, reward, eval reward, clip fraction,
tokens/s, and -- when there are any -- failed episodes and `no update` (a step that trained nothing). It adapts to
where stdout goes, so no column is ever cut to ``…``:

* a terminal at least ``WIDE`` columns wide: a rich bar with every column;
* a narrower terminal: fewer columns (no bar, no time remaining, shorter labels), down to
  ``step/total reward`` in the narrowest;
* not a terminal (a pipe, a file, CI logs): a plain line on the first step, every
  ``plain_every`` steps (default: about 20 lines per run), on evaluation steps and the last step.

Disabled (a no-op) on ranks other than 0 or when ``logging.progress`` is off.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping

from srpo_graph.fmt import fixed

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

WIDE = 110  # columns the full bar needs (label, bar, M/N, numbers, elapsed, remaining)
MEDIUM = 50  # columns for M/N, the short numbers and the elapsed time


class Layout(str, Enum):
    FULL = "full"
    COMPACT = "compact"
    MINIMAL = "minimal"
    PLAIN = "plain"  # not a terminal: printed lines


def choose_layout(is_terminal: bool, width: int) -> Layout:
    """The layout for a console.

    >>> choose_layout(True, 120).value, choose_layout(True, 80).value, choose_layout(True, 40).value
    ('full', 'compact', 'minimal')
    >>> choose_layout(False, 200).value
    'plain'
    """
    if not is_terminal:
        return Layout.PLAIN
    return Layout.FULL if width >= WIDE else Layout.COMPACT if width >= MEDIUM else Layout.MINIMAL


def _clip(record: Mapping[str, Any]) -> float | None:
    """The overall clip fraction among the objective's diagnostics, if it reports one.

    >>> _clip({"loss/clip_frac": 0.25})
    0.25
    >>> _clip({"loss/clip_frac_upper": 0.1, "loss/clip_frac_lower": 0.2}) is not None
    True
    """
    for key in ("loss/clip_frac", "loss/clip_fraction", "loss/clipfrac"):
        if isinstance(record.get(key), (int, float)):
            return float(record[key])
    parts = [
        v
        for k, v in record.items()
        if k.startswith("loss/clip") and "/" not in k[len("loss/") :] and isinstance(v, (int, float))
    ]
    return float(sum(parts)) if parts else None


def describe(record: Mapping[str, Any], last_eval: float | None = None, layout: Layout = Layout.FULL) -> str:
    """The key numbers of a step, as long as the layout allows.

    >>> describe({"reward": 0.5, "throughput/gen_tokens_per_s": 1200.0})
    'reward 0.500  eval -  clip -  1200 tok/s'
    >>> describe({"reward": 0.5, "throughput/gen_tokens_per_s": 1200.0, "time/wall": 2.345})
    'reward 0.500  eval -  clip -  1200 tok/s  2.3 s/step'
    >>> describe({"reward": 0.5}, 0.75, Layout.COMPACT)
    'r 0.500 ev 0.750 clip -'
    >>> describe({"reward": 0.5}, None, Layout.MINIMAL)
    'r 0.500'
    >>> describe({"reward": 0.0, "episodes": 8, "episodes_failed": 8, "updates": 0}, None, Layout.COMPACT)
    'r 0.000 ev - clip - failed 8/8 no update'
    """
    clip = _clip(record)
    tps = float(record.get("throughput/gen_tokens_per_s", 0.0) or 0.0)
    ev = record.get("eval/reward", last_eval)
    reward = fixed(record.get('reward', float('nan')))
    ev_s = "-" if ev is None else fixed(ev)
    clip_s = "-" if clip is None else f"{clip:.3f}"
    failed = int(record.get("episodes_failed", 0) or 0)
    trouble = (f" failed {failed}/{int(record.get('episodes', 0) or 0)}" if failed else "") + (
        " no update" if record.get("updates") == 0 else ""
    )
    if layout is Layout.MINIMAL:
        return f"r {reward}{trouble}"
    if layout is Layout.COMPACT:
        return f"r {reward} ev {ev_s} clip {clip_s}{trouble}"
    wall = record.get("time/wall")  # the step's wall time (Note [Step time] in record.py)
    per_step = f"  {wall:.1f} s/step" if isinstance(wall, (int, float)) else ""
    return f"reward {reward}  eval {ev_s}  clip {clip_s}  {tps:.0f} tok/s{per_step}{trouble.replace(' ', '  ', 1)}"


def _hms(seconds: float) -> str:
    """``H:MM:SS``.

    >>> _hms(3725.2)
    '1:02:05'
    """
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ProgressBar:
    """``with ProgressBar(steps) as bar: ... bar.advance(record)``.

    Args:
        total: the run's last step.
        enabled: False = do nothing (other ranks, ``logging.progress = false``).
        start: steps already done (a resumed run).
        console: a ``rich.console.Console`` (default: stdout); its ``is_terminal`` and ``width``
            pick the :class:`Layout`.
        plain_every: steps between plain lines when not a terminal; None = ``max(1, total // 20)``.
    """

    def __init__(
        self, total: int, *, enabled: bool = True, start: int = 0, console: Any = None, plain_every: int | None = None
    ):
        self.total, self.enabled, self.start = total, enabled, start
        self.console = console
        self.plain_every = plain_every or max(1, total // 20)
        self.layout: Layout | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_eval: float | None = None
        self._step = start
        self._t0 = time.monotonic()

    def __enter__(self) -> "ProgressBar":
        if not self.enabled:
            return self
        from rich.console import Console

        self.console = self.console or Console()
        self.layout = choose_layout(self.console.is_terminal, self.console.width)
        self._t0 = time.monotonic()
        if self.layout is Layout.PLAIN:
            return self
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = {
            Layout.FULL: (
                TextColumn("[bold]train"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            ),
            Layout.COMPACT: (MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn()),
            Layout.MINIMAL: (MofNCompleteColumn(), TextColumn("{task.fields[info]}")),
        }[self.layout]
        self._progress = Progress(*columns, console=self.console)
        self._progress.__enter__()
        self._task = self._progress.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def advance(self, record: Mapping[str, Any]) -> None:
        from srpo_graph.train.observe.metrics import flatten

        flat = flatten(record)
        self._step += 1
        is_eval = isinstance(flat.get("eval/reward"), (int, float))
        if is_eval:
            self._last_eval = float(flat["eval/reward"])
        if self._progress is not None and self._task is not None and self.layout is not None:  # set together
            self._progress.update(self._task, advance=1, info=describe(flat, self._last_eval, self.layout))
        elif self.layout is Layout.PLAIN:
            step = int(flat.get("step", self._step))
            if step == self.start + 1 or step == self.total or step % self.plain_every == 0 or is_eval:
                width = len(str(self.total))
                self.console.print(
                    f"train step {step:>{width}}/{self.total}  {describe(flat, self._last_eval)}  "
                    f"{_hms(time.monotonic() - self._t0)}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
