"""Trainer stage: ``train(workflow_path, config) -> RunSummary``, the RL loop as a pipeline you can see.

Consumes a ``.wf`` file and a :class:`~srpo_graph.train.config.schema.TrainConfig`; produces a run
folder (config.toml, metrics.jsonl, tensorboard/, plots/, traces/, checkpoints/) and a
:class:`RunSummary`. :class:`Trainer` builds its parts up front from the config and holds them
as typed attributes (torchtitan's shape); its loop is the pipeline of DESIGN.md, one call per
stage::

    rollout (rollout/: tasks by the stage's own cursor -> runtime.run, G episodes per task, tagged
      with weight versions; overlapped with the update when rollout.max_staleness >= 1)
    -> compile + update (learn/: SetBatch -> old log-probs -> epochs x mini-batches x micro-batches)
    -> sync (sync.py: the new weights to every backend, version = step)
    -> evaluate, log (observe/: the step's record to metrics.jsonl, TensorBoard, traces, plots)
    -> checkpoint (checkpoint/: every checkpoint.every steps, in the policies' format)

and :func:`~srpo_graph.train.stops.as_stop` turns what the loop raised into a stop that says how to
resume. Several policies: one model, optimizer and scheduler per policy (``policies/``); an event
spanning policies sends gradient to each. Departures from a textbook PPO loop: no value function
(group-relative advantages), models kept in eval mode (no dropout). Under torchrun every rank
samples its share of the tasks with in-process backends (``rollout/ranks.py``); with servers or
under fsdp rank 0 samples alone (episodes broadcast as JSON); under fsdp the models are sharded
and the checkpoints too (``parallel/fsdp.py``, ``checkpoint/sharded.py``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from srpo_graph import exiting, supervisor
from srpo_graph.errors import ConfigError
from srpo_graph.lang import load_workflow
from srpo_graph.models import cpu_threads
from srpo_graph.train.checkpoint import Checkpointer, LoopState, latest_checkpoint
from srpo_graph.train.checkpoint.agree import DiskFull
from srpo_graph.train.config.defaults import with_loss_defaults
from srpo_graph.train.config.loading import check_trainable, default_run_dir, to_data, validate, write_config
from srpo_graph.train.config.refusals import check_async
from srpo_graph.train.config.schema import TrainConfig
from srpo_graph.train.learn.step import Learner
from srpo_graph.train.observe.evaluator import Evaluator
from srpo_graph.train.observe.metrics import checkpoint_records
from srpo_graph.train.observe.observer import Observer
from srpo_graph.train.observe.record import StepRecord
from srpo_graph.train.parallel.collectives import init_distributed, shutdown
from srpo_graph.train.parallel.job import FOLLOW_ENV, DistInfo
from srpo_graph.train.parallel.multinode import agree_config, ship_checkpoint
from srpo_graph.train.policies import frozen as frozen_policies
from srpo_graph.train.policies.build import build_policies, device_of
from srpo_graph.train.policies.slot import PolicySlot
from srpo_graph.train.rollout.backends import attach_backends, load_frozen, server_scope
from srpo_graph.train.rollout.lockstep import Rollouts
from srpo_graph.train.rollout.overlapped import AsyncRollouts, make_rollouts
from srpo_graph.train.rollout.tasks import override_workflow, resolve_tasks
from srpo_graph.train.rollout.worker.client import close_worker
from srpo_graph.train.run_folder import check_resumed_workflow, clear_previous_run, lock_run_dir, record_workflow
from srpo_graph.train.stops import (
    RunStopped,
    TrainingInterrupted,
    as_stop,
    resume_note,
    stopped_at_start,
)
from srpo_graph.train.sync import Syncer
from srpo_graph.workflow import Workflow

__all__ = ["RunStopped", "RunSummary", "Trainer", "TrainingInterrupted", "train"]


@dataclass
class RunSummary:
    """What a finished run reports (also written to RUN_DIR/summary.json)."""

    run_dir: str
    workflow: str
    steps: int
    first_reward: float
    final_reward: float  # mean reward of the last min(10, steps) steps
    eval_rewards: list[tuple[int, float]] = field(default_factory=list)
    skipped_updates: int = 0
    seconds: float = 0.0
    checkpoint: str | None = None
    steps_this_run: int = 0  # steps trained by this call (a resumed run already had the others)


def train(workflow_path: str | Path, config: TrainConfig = TrainConfig(), *, resume: bool = False) -> RunSummary:
    """Train the workflow in ``workflow_path`` as ``config`` says, holding the run folder's lock.

    Args:
        workflow_path: a ``.wf`` file.
        config: the run's configuration (``run_dir`` None = ``runs/<workflow name>``).
        resume: continue from the newest complete checkpoint in ``config.run_dir``.
    Returns:
        RunSummary.
    Raises:
        ConfigError: bad configuration, missing task file, nothing to resume, the run folder
            in use by another process (``run_folder.py``).
        RunStopped: the disk filled up, too many episodes failed, a server or another rank died
            (checkpoints intact; resume later).
        TrainingInterrupted: Ctrl-C or SIGTERM.
        WorkflowSyntaxError, WorkflowCheckError: the workflow does not load.
    """
    check_trainable(config)  # also for a TrainConfig built in code, not through validate()
    if config.run_dir is None:  # the folder is chosen (and locked) before anything is loaded
        config = config.model_copy(update={"run_dir": default_run_dir(load_workflow(workflow_path).name)})
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 holds the lock for the whole job
        return _set_up(workflow_path, config, resume).fit()
    assert config.run_dir is not None
    try:
        with lock_run_dir(config.run_dir), server_scope():  # servers it launched stop with it, whatever happens
            return _set_up(workflow_path, config, resume).fit()
    except OSError as exc:  # the loop turns a full disk into RunStopped itself: this one came with the lock
        stop = stopped_at_start(exc, Path(config.run_dir), latest_checkpoint(config.run_dir))
        if stop is None:
            raise
        raise stop from None


def _set_up(workflow_path: str | Path, config: TrainConfig, resume: bool) -> Trainer:
    """The run's :class:`Trainer`; a stop while it is set up (a full disk, a rollout worker or a backend
    that did not start, another rank gone) raised as :class:`RunStopped` with its resume line
    (Note [Every stop prints its resume line], ``stops.py``)."""
    try:
        return Trainer(workflow_path, config, resume=resume)
    except BaseException as exc:
        assert config.run_dir is not None
        distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        stop = stopped_at_start(exc, Path(config.run_dir), latest_checkpoint(config.run_dir), distributed=distributed)
        if stop is None:
            raise
        raise stop from None


class Trainer:
    """One training run: its parts, built up front from the config, and the loop over them.

    Attributes (set by the constructor; a rank that does not sample holds no backends):
        config: the run's resolved configuration (rank 0's under torchrun).
        dist: this process's place in the job.
        workflow, workflow_eval: the workflow as trained, and as evaluated (greedy or sampled).
        run_dir: the run folder.
        policies: the trained policies (model, optimizer, scheduler, backend, version).
        frozen: the backends of the frozen and external policies (never updated).
        rollouts: the rollout stage (synchronous, or overlapped with the update); owns the task cursor.
        learner: compile + update.
        syncer: the weights to the backends.
        evaluator: the held-out evaluation.
        observer: metrics, traces, plots, progress, failure report.
        checkpointer: saves and restores the run.
        state: the loop's state (step, counters, rewards so far).
    """

    config: TrainConfig
    dist: DistInfo
    workflow: Workflow
    workflow_eval: Workflow
    run_dir: Path
    policies: list[PolicySlot]
    frozen: dict[str, Any]
    rollouts: Rollouts | AsyncRollouts
    learner: Learner
    syncer: Syncer
    evaluator: Evaluator
    observer: Observer
    checkpointer: Checkpointer
    state: LoopState

    def __init__(self, workflow_path: str | Path, config: TrainConfig, *, resume: bool = False) -> None:
        self._t_start = time.perf_counter()
        self.workflow_path = Path(workflow_path)
        config = with_loss_defaults(config)  # a no-op once validated: config/defaults.py (stale samples corrected)
        self.device = device_of(config)
        self.dist = dist = init_distributed(self.device, config.dist_timeout)
        check_async(config, dist)  # overlapped rollouts: a server backend or a rollout worker, one process
        if dist.enabled:  # several nodes may have resolved their own command lines: rank 0's config wins
            config = validate(json.loads(agree_config(json.dumps(to_data(config)), self.workflow_path.read_text(),
                                                      dist, follow=os.environ.get(FOLLOW_ENV) == "1")),
                              "rank 0's config")
        torch.manual_seed(config.seed)
        wf_base = load_workflow(self.workflow_path, models=config.rollout.models)  # checked on the run's models
        if resume and config.run_dir is not None:  # before overrides, tasks, checkpoints, models: another .wf is
            check_resumed_workflow(Path(config.run_dir), wf_base, self.workflow_path)  # named as such, nothing else
        r = config.rollout
        self.workflow = override_workflow(wf_base, models=r.models, max_tokens=r.max_tokens, logprobs=r.logprobs)
        frozen_policies.check_something_trains(self.workflow, self.workflow_path)
        if str(self.device) == "cpu":  # small models: one thread (models/__init__.py, Note [Threads for small models])
            threads = cpu_threads(p.model for p in self.workflow.policies if p.external is None)
            if threads:
                torch.set_num_threads(threads)
        self.workflow_eval = override_workflow(self.workflow, greedy=config.eval.mode == "greedy")
        self.run_dir = Path(config.run_dir) if config.run_dir is not None else default_run_dir(self.workflow.name)
        task_path, train_tasks, eval_tasks = resolve_tasks(self.workflow_path, self.workflow, config)
        resolved = {"tasks": task_path.resolve()}  # stored resolved, so `--resume` works from any working directory
        if r.eval_tasks is not None:
            resolved["eval_tasks"] = Path(r.eval_tasks).resolve()
        config = config.model_copy(update={"run_dir": self.run_dir, "rollout": r.model_copy(update=resolved)})
        self.config = config
        self.checkpointer = Checkpointer(
            self.run_dir,
            every=config.checkpoint.every,
            keep_last=config.checkpoint.keep_last,
            last_step=config.steps,
            is_main=dist.is_main,
        )
        resume_from = None
        if resume:  # rank 0 chooses; ranks that cannot read its run folder (other nodes) receive the files
            chosen = self.checkpointer.choose(announce=True) if dist.is_main else None
            resume_from = ship_checkpoint(chosen, dist)
        if resume_from is not None:  # before loading anything: the frozen policies must be the run's
            frozen_policies.check_pointers(frozen_policies.saved_pointers(resume_from), self.workflow, resume_from)
        restart = resume and resume_from is None  # a run stopped before its first checkpoint: step 0 again
        if dist.is_main:  # config.toml before anything that can stop the run can start: every stop can be
            # resumed (Note [Every stop prints its resume line], stops.py)
            self._prepare_run_dir(fresh=resume_from is None, restart=restart)
        self._note_stop()  # what the supervising parent prints if user code ends the process from here on
        # (a rollout worker loads its own)
        frozen_local, external = load_frozen(self.workflow, config, self.device, dist)
        self.policies = build_policies(self.workflow, config, self.device, resume_from, dist)
        try:  # from here a rollout worker may run: set-up that fails must not leave it behind
            self.frozen = attach_backends(
                self.workflow, config, self.policies, frozen_local, external, self.device, dist
            )
            self.syncer = Syncer(self.policies)
            self.state = LoopState(step=0, cursor=0)
            if resume_from is not None:
                self.state = self.checkpointer.restore(resume_from, self.policies)
                if self.state.workflow is not None and self.state.workflow != self.workflow.name:
                    raise ConfigError.at(
                        str(resume_from),
                        f"this run trained workflow {self.state.workflow!r}, not "
                        f"{self.workflow.name!r} ({self.workflow_path})",
                        fix="resume with the .wf file the run was started with",
                    )
                self.syncer.restore(self.state.versions, default=self.state.step)  # the checkpoint's weights
            compile_config = config.compile.model_copy(
                update={
                    "policies": tuple(s.name for s in self.policies),
                    "frozen_policies": frozen_policies.frozen_policies(self.workflow),
                }
            )
            self.learner = Learner(self.policies, config, compile_config, dist)
            self.evaluator = Evaluator(self.workflow_eval, eval_tasks, config, dist, self.policies, self.frozen)
            self.observer = Observer(self.run_dir, config, is_main=dist.is_main, start=self.state.step)
            if dist.is_main:
                st = self.state  # a step whose metrics line was lost is written again from the checkpoint
                self.observer.open(resumed_at=st.step if resume_from is not None else None,
                                   restore=checkpoint_records(st.step, st.rewards, st.evals) if resume_from else None)
            self._first_step = self.state.step
            self.rollouts = make_rollouts(self.workflow, train_tasks, self.policies, config, dist, self.frozen)
            self.rollouts.load_state_dict({"cursor": self.state.cursor})
        except BaseException:
            close_worker(self.policies)
            raise

    def _note_stop(self) -> None:
        """What this process's supervising parent prints if user code ends the process: where the run
        stands and the command that resumes it (supervisor.py; under torchrun the launcher says it)."""
        if self.dist.is_main and not self.dist.enabled:
            supervisor.note_stop(resume_note(self.workflow_path, self.run_dir, self.checkpointer.newest()))

    def _prepare_run_dir(self, *, fresh: bool, restart: bool) -> None:
        """Rank 0, before the first step: a fresh run clears (or refuses) an earlier run's outputs first,
        so a refused folder keeps all it had; then config.toml and the workflow's record."""
        if fresh:
            clear_previous_run(self.run_dir, overwrite=self.config.overwrite or restart, quiet=restart)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # stop_after_step belongs to this invocation only: a resumed run must not stop again
        debug = self.config.debug.model_copy(update={"stop_after_step": None})
        write_config(self.config.model_copy(update={"debug": debug, "overwrite": False}), self.run_dir / "config.toml")
        if fresh:
            record_workflow(self.run_dir, self.workflow, self.workflow_path)

    # -- the loop ----------------------------------------------------------------------------------

    def fit(self) -> RunSummary:
        """Train from ``state.step + 1`` to ``config.steps``; the run's summary.

        Raises:
            TrainingInterrupted, RunStopped: the run stopped (``stops.as_stop``); resumable.
        """
        completed = agreed = False
        try:
            try:
                with self.observer.bar:  # a Ctrl-C stops the bar first, then becomes TrainingInterrupted
                    for step in range(self.state.step + 1, self.config.steps + 1):
                        # a SIGTERM whose exception a finalizer swallowed still stops the run
                        exiting.raise_if_stopped()
                        t_step = time.perf_counter()  # time/wall (Note [Step time])
                        # 1. rollout: the step's episodes (sampled ahead when rollouts overlap the update)
                        rolled = self.rollouts.get(step)
                        # 2. compile + update, from the weights every policy has now
                        versions = {s.name: s.version for s in self.policies}
                        learned = self.learner.learn(step, rolled.episodes)
                        # 3. sync: the new weights, version `step`, to every backend
                        sync_seconds = self.syncer.sync(step)
                        self.rollouts.weights_updated(step)
                        # 4. evaluate and log
                        record = self._record(step, rolled, learned, versions, sync_seconds,
                                              wall_seconds=time.perf_counter() - t_step)
                        self.observer.log(record, rolled.episodes)
                        # 5. checkpoint
                        if self.checkpointer.due(step):
                            self.checkpointer.save(self.state, self.policies)
                            self._note_stop()
                        self.observer.advance(record)
                        if self.config.debug.stop_after_step is not None and step >= self.config.debug.stop_after_step:
                            break
                completed = True
                exiting.decided()  # finished: a signal from now on does not turn it into a stop (exiting.py)
            except BaseException:
                exiting.decided()  # the run stops: no second signal raises into the handling and cleanup below
                raise
        except BaseException as exc:
            agreed = isinstance(exc, DiskFull)  # every rank raised it (Note [A full disk stops every rank])
            stop = as_stop(
                exc, self.run_dir, self.state.step, self.checkpointer.newest(), distributed=self.dist.enabled
            )
            if stop is None:
                raise
            raise stop from None
        finally:
            self.rollouts.close()
            self.observer.close(completed=completed)
            shutdown(self.dist, barrier=completed or agreed)  # agreed: no rank leaves before rank 0 has decided
        return self._summary()

    def _record(
        self, step: int, rolled: Any, learned: Any, versions: dict[str, int], sync_seconds: float,
        wall_seconds: float | None = None,
    ) -> StepRecord:
        """Step ``step``'s record, with its evaluation when due; the loop state moves on to it."""
        if learned.update is not None:
            self.state.skipped_updates += learned.update.skipped_updates
        record = self.observer.record(
            step,
            self.workflow,
            rolled,
            learned,
            versions,
            sync_seconds=sync_seconds,
            skipped_updates=self.state.skipped_updates,
            lr=self.policies[0].scheduler.get_last_lr()[0],
            device=self.device,
            wall_seconds=wall_seconds,
        )
        s = self.state
        s.step, s.cursor = step, self.rollouts.state_dict()["cursor"]
        s.rewards.append(record.reward)
        if self.evaluator.due(step):
            record.eval = self.evaluator.evaluate(step)  # eval/reward = Avg@k, Pass@k
            s.evals.append((step, record.eval["eval/reward"]))
        s.versions = {p.name: p.version for p in self.policies}
        s.workflow, s.frozen = self.workflow.name, frozen_policies.pointers(self.workflow)
        return record

    def _summary(self) -> RunSummary:
        rewards = self.state.rewards
        tail = rewards[-min(10, len(rewards)) :] if rewards else [float("nan")]
        latest = self.checkpointer.latest
        summary = RunSummary(
            run_dir=str(self.run_dir),
            workflow=self.workflow.name,
            steps=self.state.step,
            first_reward=rewards[0] if rewards else float("nan"),
            final_reward=sum(tail) / len(tail),
            eval_rewards=list(self.state.evals),
            skipped_updates=self.state.skipped_updates,
            seconds=time.perf_counter() - self._t_start,
            checkpoint=str(latest) if latest else None,
            steps_this_run=self.state.step - self._first_step,
        )
        if self.dist.is_main:
            (self.run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
        return summary
