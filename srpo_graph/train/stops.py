"""Trainer stage: how a run ends when it cannot go on, and the command that continues it.

Every way a run stops early prints one message ending in the exact command that continues it
(:func:`continue_command`: ``srpo-graph train <the .wf> --resume <the run folder>``; with no
checkpoint yet, ``--resume`` starts the run again from step 0 with its saved configuration),
whether it stopped in the loop or while it was being set up (Note [Every stop prints its resume line]):

* :class:`TrainingInterrupted`: Ctrl-C / SIGTERM in the loop;
* :class:`RunStopped`: the disk filled up, a step's episodes failed beyond the budget, a server
  died during a weight sync, another rank of the job stopped answering -- anything with a cause
  to fix before resuming.

:func:`as_stop` is the one place that turns what the loop raised into one of them.
"""

from __future__ import annotations

import errno
import shlex
from pathlib import Path

from srpo_graph.errors import BackendError, SrpoGraphError
from srpo_graph.train.rollout.failures import FailureBudgetExceeded

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

# Note [Every stop prints its resume line]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A run can stop for a cause outside the user's code (a full disk, a backend or the rollout worker
# that died or missed its deadline, the failure budget, Ctrl-C, another rank gone) before step 1 has
# finished -- while it is set up (the worker starting, the checkpoint's weights pushed to it) or in
# the loop. Each prints one message ending in the command that continues it, the same whether a
# checkpoint exists or not ("no checkpoint yet": ``--resume`` starts again at step 0 with the saved
# configuration). Two things make that hold before the first checkpoint:
#
# * ``config.toml`` (what ``--resume`` reads) is written before anything that can stop the run is
#   started (``Trainer.__init__``: ``_prepare_run_dir`` before models, backends and the worker);
# * ``train()`` turns what set-up raised into a stop with :func:`stopped_at_start`, as ``fit``
#   does with :func:`as_stop` for the loop (before: the worker missing its start deadline exited 3,
#   a bare BackendError with no resume line).
#
# Only a stop before config.toml exists (the lock or config.toml itself on a full disk) says "nothing
# was trained ... run the command again": there is nothing to resume. tests/train/test_stop_lines.py.

# Note [A Ctrl-C handler imports no torch]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# ``train``'s Ctrl-C handler (``train/commands.py``) imports this module to tell a Ctrl-C in the
# loop from one while starting, and a Ctrl-C while starting can land inside the process's first
# ``import torch``. Importing torch again after that finds a half-initialised extension module and
# the process dies (exit 139, "SystemError: ... bad call flags", a CI run) instead of saying
# "interrupted while starting". So this module imports nothing that imports torch: the checkpoint
# layout and the collectives are imported where a stop is built, inside a run that has them
# loaded already. tests/test_except_names.py holds the modules of every Ctrl-C handler to it.


def continue_command(workflow: str | Path, run_dir: str | Path) -> str:
    """The command that continues a run (also one with no checkpoint yet: it starts at step 0).

    >>> continue_command("wf/a b.wf", "runs/x")
    "srpo-graph train 'wf/a b.wf' --resume runs/x"
    """
    return f"srpo-graph train {shlex.quote(str(workflow))} --resume {shlex.quote(str(run_dir))}"


def _where(checkpoint: Path | None) -> str:
    if checkpoint is None:
        return "no checkpoint yet (resuming starts again from step 0 with the run's configuration)"
    return f"newest complete checkpoint: {checkpoint}"


def resume_note(workflow: str | Path, run_dir: str | Path, checkpoint: Path | None) -> str:
    """The lines after a stop's first: where the run stands and the command that continues it.

    >>> print(resume_note("a.wf", "runs/x", None))
      no checkpoint yet (resuming starts again from step 0 with the run's configuration)
      resume: srpo-graph train a.wf --resume runs/x
    """
    return f"  {_where(checkpoint)}\n  resume: {continue_command(workflow, run_dir)}"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during the loop. Complete checkpoints are untouched (a checkpoint being
    written is a ``.tmp-`` folder that is never loaded), so ``--resume`` continues from the newest.

    Attributes:
        run_dir: the run folder.
        steps_done: steps whose metrics were written before the interrupt.
        checkpoint: the newest complete checkpoint, or None.
    """

    def __init__(self, run_dir: Path, steps_done: int, checkpoint: Path | None):
        super().__init__(f"interrupted after step {steps_done}")
        self.run_dir, self.steps_done, self.checkpoint = Path(run_dir), steps_done, checkpoint

    def advice(self, workflow: str | Path) -> str:
        """What to tell the user: where the run stands and the command that continues it."""
        head = f"srpo-graph train: interrupted after step {self.steps_done}; run folder {self.run_dir}"
        redo = ""
        if self.checkpoint is not None:
            step = int(self.checkpoint.name.split("_")[-1])
            redo = f" (steps after {step} are run again)" if step < self.steps_done else ""
            where = f"{_where(self.checkpoint)} (step {step})"
        else:
            where = _where(None)
        return f"{head}\n  {where}\n  resume: {continue_command(workflow, self.run_dir)}{redo}"


class RunStopped(SrpoGraphError):
    """The run could not go on (the disk is full, too many episodes failed, a server died during a
    weight sync); complete checkpoints are intact, ``--resume`` continues once the cause is fixed.
    ``str()`` is the first line; :meth:`advice` the whole message with the command."""

    exit_code = 1

    def __init__(self, run_dir: Path, steps_done: int, checkpoint: Path | None, cause: OSError | str,
                 remedy: str = "free space", *, consequence: bool = False):
        self.run_dir, self.steps_done, self.checkpoint = Path(run_dir), steps_done, checkpoint
        # the stop follows another rank's (it stopped answering): that rank's failure is the job's cause
        # (Note [The job fails with its cause], train/parallel/launch.py)
        self.consequence = consequence
        if isinstance(cause, OSError):
            from srpo_graph.train.checkpoint.layout import disk_full_reason  # Note [A Ctrl-C handler imports no torch]

            self.reason = disk_full_reason(cause, self.run_dir)
        else:
            self.reason = cause
        self.remedy = remedy
        super().__init__(f"srpo-graph train: stopped after step {steps_done}: {self.reason}")

    def advice(self, workflow: str | Path) -> str:
        if not (self.run_dir / "config.toml").is_file():  # stopped before the run's config was written
            return f"{self}\n  nothing was trained\n  {self.remedy}, then run the command again"
        return (f"{self}\n  {_where(self.checkpoint)}\n  {self.remedy}, then resume: "
                f"{continue_command(workflow, self.run_dir)}")


def is_disk_full(exc: BaseException) -> bool:
    """``exc`` is the file system saying it is full (ENOSPC, or EDQUOT: the user's quota).

    >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device")), is_disk_full(OSError(errno.EACCES, "x"))
    (True, False)
    """
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


def stopped_at_start(exc: BaseException, run_dir: Path, checkpoint: Path | None, *,
                     distributed: bool = False) -> RunStopped | None:
    """The :class:`RunStopped` of a stop met while a run was being set up (Note [Every stop prints its
    resume line]): a full disk (the lock, config.toml, the workflow's record, the metrics file), a
    backend or rollout worker that did not start (or died, or missed its deadline) or did not take the
    checkpoint's weights, another rank gone. The run stands at its newest complete checkpoint. None:
    not a stop (a bug, a refused configuration: the caller re-raises it); a Ctrl-C is left to the
    command, which says where the run stands (``commands.py``)."""
    if isinstance(exc, KeyboardInterrupt):
        return None
    step = int(checkpoint.name.split("_")[-1]) if checkpoint is not None else 0
    stop = as_stop(exc, run_dir, step, checkpoint, distributed=distributed)
    return stop if isinstance(stop, RunStopped) else None


def backend_remedy(exc: BackendError, run_dir: Path) -> str:
    """What to do about a backend that stopped a run: the error's own ``remedy`` (a rollout worker, a
    weight folder: no server to check), else the server -- its log where this run launched it.

    >>> backend_remedy(BackendError("x"), Path("/nonexistent"))
    'check the server named above (is it running and reachable?)'
    """
    if exc.remedy:
        return exc.remedy
    if (run_dir / "sglang").is_dir():
        return f"check the server (the log of a server this run launched is in {run_dir / 'sglang'})"
    return "check the server named above (is it running and reachable?)"


def as_stop(exc: BaseException, run_dir: Path, steps_done: int, checkpoint: Path | None, *,
            distributed: bool = False) -> BaseException | None:
    """The stop the exception ``exc`` means for a run that has done ``steps_done`` steps (its newest
    complete checkpoint ``checkpoint``), or None: not a stop, the caller re-raises ``exc`` as it is.

    * Ctrl-C / SIGTERM (``KeyboardInterrupt``): :class:`TrainingInterrupted`;
    * a full disk (``OSError`` ENOSPC/EDQUOT), a failure budget exceeded, a backend that failed
      (e.g. a server that died during a weight sync or an adapter swap), and -- under torchrun --
      a collective whose peer died or stalled past ``dist_timeout``: :class:`RunStopped`, with what
      to fix first.

    >>> type(as_stop(KeyboardInterrupt(), Path("r"), 3, None)).__name__
    'TrainingInterrupted'
    >>> as_stop(ValueError("a bug"), Path("r"), 3, None) is None
    True
    """
    if isinstance(exc, KeyboardInterrupt):
        return TrainingInterrupted(run_dir, steps_done, checkpoint)
    if is_disk_full(exc):
        assert isinstance(exc, OSError)
        return RunStopped(run_dir, steps_done, checkpoint, exc)
    if isinstance(exc, FailureBudgetExceeded):
        return RunStopped(
            run_dir, steps_done, checkpoint, f"rollout stopped: {exc}", remedy="fix the cause named above"
        )
    if isinstance(exc, BackendError):
        return RunStopped(run_dir, steps_done, checkpoint, str(exc).strip(), remedy=backend_remedy(exc, run_dir))
    if isinstance(exc, RuntimeError) and distributed and _collective_failed(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RunStopped(
            run_dir,
            steps_done,
            checkpoint,
            f"another rank of the job stopped answering ({first[:200]})",
            remedy="check the other ranks' output",
            consequence=True,
        )
    return None


def _collective_failed(exc: BaseException) -> bool:
    from srpo_graph.train.parallel.collectives import collective_failed  # Note [A Ctrl-C handler imports no torch]

    return collective_failed(exc)


__all__ = ["RunStopped", "TrainingInterrupted", "as_stop", "backend_remedy", "continue_command",
           "is_disk_full", "stopped_at_start"]
