"""Trainer stage, observing: every step's record to every sink.

Consumes the run's config and, each step, its :class:`~srpo_graph.train.observe.record.StepRecord`
and episodes; produces ``RUN_DIR/metrics.jsonl`` and TensorBoard files (``metrics.py``; W&B when
``logging.wandb``, ``wandb_sink.py``), sample traces (``RUN_DIR/traces/step_N.jsonl``), the plots
(``plots.py``), the progress line (``progress.py``) and the first failure of each kind on stderr
(``failures.py``). Only the process that owns the run folder (rank 0) writes; the others build
the same records and write nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srpo_graph.runtime.trace import Episode, write_traces
from srpo_graph.train.learn.step import LearnResult
from srpo_graph.train.observe.failures import FailureReport, no_update_reason
from srpo_graph.train.observe.metrics import MetricsWriter, truncate_after
from srpo_graph.train.observe.plots import draw_plots
from srpo_graph.train.observe.progress import ProgressBar
from srpo_graph.train.observe.record import StepRecord, step_record
from srpo_graph.train.rollout.lockstep import StepRollout


def due(step: int, every: int, last: int) -> bool:
    """Whether a periodic action runs at ``step``: every ``every`` steps (0: never) and at the last.

    >>> [s for s in range(1, 6) if due(s, 2, 5)]
    [2, 4, 5]
    """
    return step == last or (every > 0 and step % every == 0)


class Observer:
    """The run's metric sinks, progress line and failure report.

    Args:
        run_dir: the run folder.
        config: the run's config (``logging``, ``steps``).
        is_main: this process writes the run folder (rank 0).
        start: steps already done (a resumed run).
    """

    def __init__(self, run_dir: Path, config: Any, *, is_main: bool, start: int = 0) -> None:
        self.run_dir, self.config, self.is_main = Path(run_dir), config, is_main
        self.bar = ProgressBar(config.steps, enabled=is_main and config.logging.progress, start=start)
        self.report = FailureReport(enabled=is_main)
        self.writer: MetricsWriter | None = None

    def open(self, *, resumed_at: int | None, restore: Any = None) -> None:
        """Start writing (rank 0): ``metrics.jsonl`` cut back to the resumed step (``resumed_at``; None:
        a fresh run), a step lost up to it written again from ``restore`` (what the checkpoint kept:
        ``metrics.checkpoint_records``, Note [No step missing from metrics.jsonl]), TensorBoard from
        there, W&B if asked."""
        if not self.is_main:
            return
        truncate_after(self.run_dir / "metrics.jsonl", resumed_at or 0, restore=restore)
        sinks = []
        lg = self.config.logging
        if lg.wandb:  # optional extra: Weights & Biases (wandb_sink.py)
            from srpo_graph.train.observe.wandb_sink import WandbSink

            sinks.append(WandbSink(self.run_dir, project=lg.wandb_project, entity=lg.wandb_entity, name=lg.wandb_name,
                                   config=self.config.model_dump(mode="json")))
        self.writer = MetricsWriter(self.run_dir, tensorboard=lg.tensorboard,
                                    purge_step=resumed_at + 1 if resumed_at is not None else None, sinks=sinks)

    def record(self, step: int, wf: Any, rolled: StepRollout, learned: LearnResult, versions: dict[str, int],
               **kw: Any) -> StepRecord:
        """Step ``step``'s record (``record.step_record``; ``kw``: its keyword arguments); the first
        failure of each kind, and the first step with nothing to update, are reported once."""
        self.report.episodes(step, rolled.stats)
        if learned.update is None:
            self.report.nothing_updated(step, no_update_reason(rolled.episodes))
        return step_record(step, wf, rolled, learned, versions, **kw)

    def log(self, record: StepRecord, episodes: list[Episode]) -> None:
        """Write the step's metrics, its sample traces and the plots when due (rank 0)."""
        if self.writer is None:
            return
        lg, step = self.config.logging, record.step
        self.writer.log(record.to_metrics())
        if lg.traces_every and (due(step, lg.traces_every, self.config.steps) or step == 1):
            (self.run_dir / "traces").mkdir(exist_ok=True)
            write_traces(self.run_dir / "traces" / f"step_{step}.jsonl", episodes)
        if lg.plots and due(step, lg.plots_every, self.config.steps):
            draw_plots(self.run_dir)

    def advance(self, record: StepRecord) -> None:
        """The progress line moves on by one step."""
        self.bar.advance(record.to_metrics())

    def close(self, *, completed: bool) -> None:
        """Close the sinks. A full disk while closing is raised only when the run completed (otherwise
        the error that stopped the run is the one to report)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                if completed:
                    raise
