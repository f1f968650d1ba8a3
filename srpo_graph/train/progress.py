"""Trainer stage: the one progress bar of a run (rich), showing the key numbers of each step.

Consumes the step's flat metric record; shows step, reward, eval reward, clip fraction and
tokens/s. Disabled (a no-op) on ranks other than 0 or when ``logging.progress`` is off.
"""

from __future__ import annotations

from typing import Any, Mapping


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
    parts = [v for k, v in record.items() if k.startswith("loss/clip") and "/" not in k[len("loss/"):]
             and isinstance(v, (int, float))]
    return float(sum(parts)) if parts else None


def describe(record: Mapping[str, Any], last_eval: float | None = None) -> str:
    """One line of key numbers.

    >>> describe({"reward": 0.5, "throughput/gen_tokens_per_s": 1200.0})
    'reward 0.500  eval -  clip -  1200 tok/s'
    """
    clip = _clip(record)
    tps = float(record.get("throughput/gen_tokens_per_s", 0.0) or 0.0)
    ev = record.get("eval/reward", last_eval)
    return (f"reward {record.get('reward', float('nan')):.3f}  eval {'-' if ev is None else f'{ev:.3f}'}  "
            f"clip {'-' if clip is None else f'{clip:.3f}'}  {tps:.0f} tok/s")


class ProgressBar:
    """``with ProgressBar(steps) as bar: ... bar.advance(record)``."""

    def __init__(self, total: int, *, enabled: bool = True, start: int = 0):
        self.total, self.enabled, self.start = total, enabled, start
        self._progress = None
        self._task = None
        self._last_eval: float | None = None

    def __enter__(self) -> "ProgressBar":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TimeRemainingColumn(),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def advance(self, record: Mapping[str, Any]) -> None:
        from srpo_graph.train.metrics import flatten

        flat = flatten(record)
        if isinstance(flat.get("eval/reward"), (int, float)):
            self._last_eval = float(flat["eval/reward"])
        if self._progress is not None:
            self._progress.update(self._task, advance=1, info=describe(flat, self._last_eval))

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
