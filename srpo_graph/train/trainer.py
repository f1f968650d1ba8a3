"""Trainer stage: ``train(workflow_path, config) -> RunSummary``, the RL loop.

Consumes a ``.wf`` file and a :class:`~srpo_graph.train.config.TrainConfig`; produces a run
folder (config.toml, metrics.jsonl, tensorboard/, plots/, traces/, checkpoints/) and a
:class:`RunSummary`. Per step::

    rollout stage (rollout_stage.py: tasks by a seeded cursor -> runtime.run, G episodes per task,
      tagged with weight versions) -> learning step (step.py: compile -> old log-probs recomputed
      -> epochs x mini-batches x micro-batches (update.py) -> backend.sync_weights(model, version))
      -> metrics, eval, checkpoint, plots

Several policies: one model, optimizer and scheduler per policy (a shared-policy workflow has
one); an event spanning policies sends gradient to each. A frozen reference model per policy is
loaded only when the objective's KL coefficient is non-zero. Departures from a textbook PPO
loop: no value function (group-relative advantages), models kept in eval mode (no dropout).
Under torchrun every rank samples its share of the tasks with in-process backends
(``rank_rollout.py``); with servers or under fsdp rank 0 samples alone (episodes broadcast as
JSON). ``strategy = "fsdp"``: models sharded (``fsdp.py``); rank 0 samples in process from an
unsharded replica synced every step, or streams the weights to servers bucket by bucket
(``fsdp_stream.py``, no replica); checkpoints are sharded (``sharded_checkpoint.py``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from srpo_graph import exiting
from srpo_graph.backends import TrainedPolicy, backend_spec
from srpo_graph.errors import BackendError, ConfigError
from srpo_graph.lang import load_workflow
from srpo_graph.models import resolve_model
from srpo_graph.models.tiny import load_tokenizer
from srpo_graph.runtime.tasks import load_tasks
from srpo_graph.runtime.trace import write_traces
from srpo_graph.train import checkpoint as ckpt
from srpo_graph.train import frozen as frozen_policies
from srpo_graph.train import fsdp, lora
from srpo_graph.train import sharded_checkpoint as sharded_ckpt
from srpo_graph.train.async_rollout import check_async, make_rollouts
from srpo_graph.train.config import TrainConfig, check_trainable, default_run_dir, to_data, validate, write_config
from srpo_graph.train.data import default_task_file, override_workflow, split_tasks
from srpo_graph.train.distributed import DistInfo, collective_failed, init_distributed, shutdown
from srpo_graph.train.evaluate import score
from srpo_graph.train.metrics import MetricsWriter, truncate_after
from srpo_graph.train.multinode import FOLLOW_ENV, agree_config, ship_checkpoint
from srpo_graph.train.plots import draw_plots
from srpo_graph.train.precision import enable_gradient_checkpointing
from srpo_graph.train.progress import ProgressBar
from srpo_graph.train.rank_rollout import samples_on_every_rank
from srpo_graph.train.rollout_stage import rollout
from srpo_graph.train.rollout_worker import close_worker
from srpo_graph.train.runinfo import check_resumed_workflow, record_workflow
from srpo_graph.train.runlock import lock_run_dir
from srpo_graph.train.sglang_rollout import server_scope, with_backend_defaults
from srpo_graph.train.step import learn_step
from srpo_graph.train.stops import (
    FailureBudgetExceeded,
    FailureReport,
    RunStopped,
    TrainingInterrupted,
)


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


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class PolicySlot:
    """One trainable policy: its model, optimizer, scheduler and the backend sampling from it."""

    name: str
    base: str  # the resolved base model path/name (reference model source)
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    backend: Any
    ref_model: Any = None
    version: int = 0
    replica: Any = None  # fsdp: rank 0's unsharded copy (sampled from in process); None otherwise
    stream: bool = False  # fsdp with a server backend: the sync streams gathered buckets (every rank)

    def sync(self, version: int) -> None:
        """Give the backend the current weights, tagged ``version``. A collective under fsdp."""
        self.version = version
        fsdp.sync_backend(self.model, self.replica, self.backend, version, stream=self.stream)


def _lr_lambda(config: TrainConfig, updates_total: int):
    o = config.optim

    def factor(n: int) -> float:  # n = optimizer steps taken
        if o.warmup_steps and n < o.warmup_steps:
            return (n + 1) / o.warmup_steps
        frac = min(1.0, (n - o.warmup_steps) / max(1, updates_total - o.warmup_steps))
        return {"constant": 1.0, "linear": 1.0 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[o.schedule]

    return factor


def _device(config: TrainConfig) -> str:
    if config.rollout.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.rollout.device


def _build_slots(wf, config: TrainConfig, device: str, resume_from: Path | None, dist: DistInfo,
                 frozen: Sequence[TrainedPolicy] = ()) -> tuple[list[PolicySlot], dict[str, Any]]:
    """The trained policies' slots, and the frozen local policies' backends (``frozen``: built with
    the same ``for_training`` call, so e.g. SGLang servers get distinct ports)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dtype = getattr(torch, config.rollout.dtype)
    updates_total = config.steps * config.optim.epochs * config.optim.mini_batches
    kl = float(getattr(config.loss, "kl_coef", 0.0) or 0.0)
    spec = backend_spec(config.rollout.backend)
    slots = []
    sharded = config.strategy == "fsdp" and dist.enabled
    if lora.uses_adapters(wf):  # LoRA adapters on one shared frozen base per base policy: lora.py
        slots = lora.build_slots(wf, config, device, resume_from, dist, make_slot=PolicySlot,
                                 lr_lambda=_lr_lambda(config, updates_total))
    for pol in wf.policies if not slots else ():
        if pol.name in wf.untrained_policies:  # frozen / external: train/frozen.py, no slot
            continue
        base = resolve_model(pol.model)
        path = str(ckpt.policy_path(resume_from, pol.name)) if resume_from else base
        model: Any = sharded_ckpt.load_model(path, dtype)  # a sharded checkpoint: its config; shards below
        model = model.to(device).eval()  # no dropout: update.py
        tok = load_tokenizer(path)
        # fsdp: shard before the optimizer sees the parameters; rank 0 keeps a whole replica only to
        # sample from in process; a server gets the weights streamed bucket by bucket (fsdp_stream.py)
        replica = fsdp.shard_with_replica(model, path, dtype, device, dist) if sharded and spec.in_process else None
        if sharded and not spec.in_process:
            fsdp.shard_model(model)
        o = config.optim
        opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(config, updates_total))
        if resume_from is not None and sharded_ckpt.is_sharded_checkpoint(resume_from):  # every rank its shards
            sharded_ckpt.load_policy(resume_from, pol.name, model, opt)
        ref: Any = None
        if kl != 0.0:
            ref = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
            ref = ref.to(device).eval()
            ref.requires_grad_(False)
        slots.append(PolicySlot(pol.name, base, model, tok, opt, sched, None, ref, replica=replica,
                                stream=sharded and not spec.in_process))
    frozen_backends: dict[str, Any] = {}
    if dist.is_main or samples_on_every_rank(config, dist):  # the ranks that sample build backends (rank 0
        # alone starts servers); each rank's in-process backends sample from its own models
        trained = [TrainedPolicy(s.name, s.base, s.replica if s.replica is not None else s.model, s.tokenizer, device)
                   for s in slots]
        options = getattr(config.rollout, config.rollout.backend)
        if frozen and lora.uses_adapters(wf) and not spec.in_process:
            raise ConfigError.at("field `rollout.backend`", "frozen policies beside LoRA adapters need the "
                                 "transformers backend", fix='rollout.backend = "transformers"')
        if config.rollout.worker:  # sampling in a process of its own (train/rollout_worker.py); it builds the frozen ones
            from srpo_graph.train.rollout_worker import start_for_training

            backends = start_for_training(wf, config, slots, device)
        else:
            backends = spec.for_training([*trained, *frozen], options, Path(config.run_dir or "runs"))
        for s in slots:
            s.backend = backends[s.name]
        frozen_backends = {p.name: backends[p.name] for p in frozen}
    if config.optim.gradient_checkpointing:  # train/precision.py
        for s in slots:
            enable_gradient_checkpointing(s.model)
    return slots, frozen_backends


def _resolve_tasks(workflow_path: Path, wf, config: TrainConfig):
    r = config.rollout
    path = r.tasks if r.tasks is not None else default_task_file(workflow_path, wf)
    tasks = load_tasks(path, wf)
    eval_path = r.eval_tasks
    if eval_path is None and Path(path).with_name(f"{Path(path).stem}_eval.jsonl").is_file():
        eval_path = Path(path).with_name(f"{Path(path).stem}_eval.jsonl")  # make_data.py's held-out split
    eval_list = load_tasks(eval_path, wf) if eval_path is not None else None
    train_tasks, eval_tasks = split_tasks(tasks, eval_list, config.eval.num_tasks)
    if not train_tasks:
        raise ConfigError.at(str(path), "no training tasks", fix="give a task file with at least 2 tasks")
    return Path(path), train_tasks, eval_tasks[: config.eval.num_tasks]


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
            in use by another process (``runlock.py``).
        RunStopped: the disk filled up during the run (checkpoints intact; resume later).
        WorkflowSyntaxError, WorkflowCheckError: the workflow does not load.
    """
    check_trainable(config)  # also for a TrainConfig built in code, not through validate()
    if config.run_dir is None:  # the folder is chosen (and locked) before anything is loaded
        config = config.model_copy(update={"run_dir": default_run_dir(load_workflow(workflow_path).name)})
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 holds the lock for the whole job
        return _train(workflow_path, config, resume=resume)
    assert config.run_dir is not None
    with lock_run_dir(config.run_dir), server_scope():  # servers it launched stop with it, whatever happens
        return _train(workflow_path, config, resume=resume)


def _train(workflow_path: str | Path, config: TrainConfig, *, resume: bool) -> RunSummary:
    t_start = time.perf_counter()
    config = with_backend_defaults(config)  # e.g. loss.mismatch=tis on SGLang unless set (docs/sglang.md)
    workflow_path = Path(workflow_path)
    device = _device(config)
    dist = init_distributed(device, config.dist_timeout)
    check_async(config, dist)  # overlapped rollouts: a server backend, one process
    if dist.enabled:  # several nodes may have resolved their own command lines: rank 0's config wins
        config = validate(json.loads(agree_config(json.dumps(to_data(config)), workflow_path.read_text(), dist,
                                                       follow=os.environ.get(FOLLOW_ENV) == "1")),
                          "rank 0's config")
    torch.manual_seed(config.seed)
    wf_base = load_workflow(workflow_path)
    if resume and config.run_dir is not None:  # before overrides, tasks, checkpoints, models: another .wf is
        check_resumed_workflow(Path(config.run_dir), wf_base, workflow_path)  # named as such, nothing else
    wf = override_workflow(wf_base, models=config.rollout.models, max_tokens=config.rollout.max_tokens,
                           logprobs=config.rollout.logprobs)
    frozen_policies.check_something_trains(wf, workflow_path)
    wf_eval = override_workflow(wf, greedy=config.eval.mode == "greedy")
    run_dir = Path(config.run_dir) if config.run_dir is not None else default_run_dir(wf.name)
    task_path, train_tasks, eval_tasks = _resolve_tasks(workflow_path, wf, config)
    # stored resolved, so `--resume` works from any working directory
    resolved = {"tasks": task_path.resolve()}
    if config.rollout.eval_tasks is not None:
        resolved["eval_tasks"] = Path(config.rollout.eval_tasks).resolve()
    config = config.model_copy(update={"run_dir": run_dir, "rollout": config.rollout.model_copy(update=resolved)})
    resume_from = None
    if resume:  # rank 0 chooses; ranks that cannot read its run folder (other nodes) receive the files
        chosen = _choose_checkpoint(run_dir, announce=True) if dist.is_main else None
        resume_from = ship_checkpoint(chosen, dist)
    if resume_from is not None:  # before loading anything: the frozen policies must be the run's
        frozen_policies.check_pointers(frozen_policies.saved_pointers(resume_from), wf, resume_from)
    restart = resume and resume_from is None  # a run stopped before its first checkpoint: step 0 again
    samplers = dist.is_main or samples_on_every_rank(config, dist)  # (raises on an every_rank it cannot do)
    frozen_local, frozen = frozen_policies.load_frozen(wf, config, device) \
        if samplers and not config.rollout.worker else ([], {})  # a rollout worker loads its own
    slots, frozen_backends = _build_slots(wf, config, device, resume_from, dist, frozen_local)
    try:  # from here a rollout worker may run: set-up that fails must not leave it behind
        frozen.update(frozen_backends)
        state = ckpt.LoopState(step=0, cursor=0)
        if resume_from is not None:
            state = ckpt.load_checkpoint(
                resume_from, optimizers={s.name: s.optimizer for s in slots},
                schedulers={s.name: s.scheduler for s in slots})
            started_with = state.extra.get("workflow")
            if started_with is not None and started_with != wf.name:
                raise ConfigError.at(str(resume_from), f"this run trained workflow {started_with!r}, not {wf.name!r} "
                                     f"({workflow_path})", fix="resume with the .wf file the run was started with")
            for s in slots:
                s.sync(int(state.extra.get("versions", {}).get(s.name, state.step)))
        compile_cfg = config.compile.model_copy(update={"policies": tuple(s.name for s in slots),
                                                        "frozen_policies": frozen_policies.frozen_policies(wf)})
        writer = None
        if dist.is_main:
            if resume_from is None:  # before anything is written: a refused folder keeps all it had
                _clear_previous_run(run_dir, overwrite=config.overwrite or restart, quiet=restart)
            run_dir.mkdir(parents=True, exist_ok=True)
            # stop_after_step belongs to this invocation only: a resumed run must not stop again
            write_config(config.model_copy(update={"debug": config.debug.model_copy(update={"stop_after_step": None}),
                                                   "overwrite": False}),
                         run_dir / "config.toml")
            if resume_from is None:
                record_workflow(run_dir, wf, workflow_path)
            truncate_after(run_dir / "metrics.jsonl", state.step)
            sinks = []
            if config.logging.wandb:  # optional extra: Weights & Biases (train/wandb_log.py)
                from srpo_graph.train.wandb_log import WandbSink

                lg = config.logging
                sinks.append(WandbSink(run_dir, project=lg.wandb_project, entity=lg.wandb_entity, name=lg.wandb_name,
                                       config=config.model_dump(mode="json")))
            writer = MetricsWriter(run_dir, tensorboard=config.logging.tensorboard,
                                   purge_step=state.step + 1 if resume_from is not None else None, sinks=sinks)
        rewards: list[float] = [r for r in state.extra.get("rewards", [])]
        evals: list[tuple[int, float]] = [tuple(e) for e in state.extra.get("evals", [])]
        last_ckpt = str(resume_from) if resume_from else None
        first_step = state.step
        bar = ProgressBar(config.steps, enabled=dist.is_main and config.logging.progress, start=state.step)
        report = FailureReport(enabled=dist.is_main)
        completed = False
        rollouts = make_rollouts(wf, train_tasks, slots, config, dist, frozen)  # max_staleness >= 1: overlapped
    except BaseException:
        close_worker(slots)
        raise
    try:
        try:
            with bar:  # a Ctrl-C stops the bar first, then becomes TrainingInterrupted
                for step in range(state.step + 1, config.steps + 1):
                    exiting.raise_if_stopped()  # a SIGTERM whose exception a finalizer swallowed still stops the run
                    result = learn_step(step, wf, rollouts.get(step, state), slots, config, compile_cfg, state, dist,
                                        report)
                    rollouts.weights_updated(step)  # the weights of version `step` are synced
                    record, episodes = result.record, result.episodes
                    state.step = step
                    rewards.append(record["reward"])
                    if config.eval.every and eval_tasks and (step % config.eval.every == 0 or step == config.steps):
                        t0 = time.perf_counter()
                        eps, _ = rollout(wf_eval, eval_tasks, slots, config, eval_seed := config.seed * 7919 + step, dist,
                                          config.eval.samples, frozen=frozen)
                        record.update(score(wf_eval, eps, eval_tasks, samples=config.eval.samples, seed=eval_seed).metrics())  # eval/reward = Avg@k, Pass@k
                        record["time/eval"] = time.perf_counter() - t0
                        evals.append((step, record["eval/reward"]))
                    state.extra.update(rewards=rewards, evals=evals, versions={s.name: s.version for s in slots},
                                       workflow=wf.name, frozen=frozen_policies.pointers(wf))
                    if writer is not None:
                        writer.log(record)
                        if config.logging.traces_every and (_due(step, config.logging.traces_every, config.steps) or step == 1):
                            (run_dir / "traces").mkdir(exist_ok=True)
                            write_traces(run_dir / "traces" / f"step_{step}.jsonl", episodes)
                        if config.logging.plots and _due(step, config.logging.plots_every, config.steps):
                            draw_plots(run_dir)
                    if _due(step, config.checkpoint.every, config.steps) and any(fsdp.is_sharded(s.model) for s in slots):
                        last_ckpt = str(sharded_ckpt.save(  # every rank writes its shards: sharded_checkpoint.py
                            run_dir, state, models={s.name: s.model for s in slots},
                            tokenizers={s.name: s.tokenizer for s in slots}, optimizers={s.name: s.optimizer for s in slots},
                            schedulers={s.name: s.scheduler for s in slots}, keep_last=config.checkpoint.keep_last))
                    elif _due(step, config.checkpoint.every, config.steps):
                        if writer is not None:
                            last_ckpt = str(ckpt.save_checkpoint(
                                run_dir, state, models={s.name: s.model for s in slots},
                                tokenizers={s.name: s.tokenizer for s in slots},
                                optimizers={s.name: s.optimizer for s in slots},
                                schedulers={s.name: s.scheduler for s in slots}, keep_last=config.checkpoint.keep_last))
                    bar.advance(record)
                    if config.debug.stop_after_step is not None and step >= config.debug.stop_after_step:
                        break
            completed = True
            exiting.decided()  # finished: a signal from now on does not turn it into a stop (exiting.py)
        except BaseException:
            exiting.decided()  # the run stops: no second signal raises into the handling and cleanup below
            raise
    except KeyboardInterrupt:
        raise TrainingInterrupted(run_dir, state.step, ckpt.latest_checkpoint(run_dir)) from None
    except OSError as exc:
        if exc.errno not in _DISK_FULL:
            raise
        raise RunStopped(run_dir, state.step, ckpt.latest_checkpoint(run_dir), exc) from None
    except FailureBudgetExceeded as exc:
        raise RunStopped(run_dir, state.step, ckpt.latest_checkpoint(run_dir), f"rollout stopped: {exc}",
                         remedy="fix the cause named above") from None
    except BackendError as exc:  # e.g. a server that died during a weight sync or an adapter swap
        raise RunStopped(run_dir, state.step, ckpt.latest_checkpoint(run_dir), str(exc).strip(),
                         remedy=f"check the server (a launched server's log is in {run_dir / 'sglang'})") from None
    except RuntimeError as exc:  # under torchrun: another rank died or stalled past dist_timeout
        if not (dist.enabled and collective_failed(exc)):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunStopped(run_dir, state.step, ckpt.latest_checkpoint(run_dir),
                         f"another rank of the job stopped answering ({first[:200]})",
                         remedy="check the other ranks' output") from None
    finally:
        rollouts.close()
        if writer is not None:
            try:
                writer.close()
            except OSError:  # the disk is full: the error that stopped the run is the one to report
                if completed:
                    raise
        shutdown(dist, barrier=completed)
    tail = rewards[-min(10, len(rewards)):] if rewards else [float("nan")]
    summary = RunSummary(run_dir=str(run_dir), workflow=wf.name, steps=state.step,
                         first_reward=rewards[0] if rewards else float("nan"), final_reward=sum(tail) / len(tail),
                         eval_rewards=evals, skipped_updates=state.skipped_updates,
                         seconds=time.perf_counter() - t_start, checkpoint=last_ckpt,
                         steps_this_run=state.step - first_step)
    if dist.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary.__dict__, indent=2))
    return summary


def _choose_checkpoint(run_dir: Path, *, announce: bool) -> Path | None:
    """The newest checkpoint that verifies (checksums, finite weights); damaged newer ones are named.
    None: the run has no checkpoint yet (it stopped before the first), so it starts again at step 0.

    Raises:
        ConfigError: every checkpoint is damaged (each named with why).
    """
    good, damaged = ckpt.latest_good_checkpoint(run_dir)
    if good is None:
        if not damaged:
            if announce:
                print(f"srpo-graph train: {run_dir} has no checkpoint yet; starting the run again from step 0 with "
                      "its saved configuration", file=sys.stderr)
            return None
        listed = "\n".join(f"  {p}: {why}" for p, why in damaged)
        raise ConfigError.at(str(run_dir), f"every checkpoint is damaged, nothing to resume from\n{listed}",
                             fix="restore the run folder from a backup, or start a new run with --overwrite")
    if announce:
        for path, why in damaged:
            print(f"srpo-graph train: checkpoint {path} is damaged ({why}); skipping it", file=sys.stderr)
        if damaged:
            print(f"srpo-graph train: resuming from the previous good checkpoint {good}", file=sys.stderr)
    return good


def _clear_previous_run(run_dir: Path, *, overwrite: bool, quiet: bool = False) -> None:
    """A fresh (not resumed) run never mixes with an earlier run's outputs in the same folder.

    It refuses the folder (losing nothing) unless ``overwrite`` is set; then the old outputs
    go, since an old, newer-numbered checkpoint would be what a later ``--resume`` picks.
    """
    import shutil
    import sys

    old = [run_dir / n for n in ("checkpoints", "traces", "plots", "tensorboard", "metrics.jsonl", "summary.json")]
    old = [p for p in old if p.exists()]
    if old and not overwrite:
        raise ConfigError.at(
            str(run_dir), f"the folder holds an earlier run ({', '.join(p.name for p in old)})",
            why="a fresh run there would mix with it or destroy it",
            fix=f"continue it with --resume {run_dir}, choose another --run-dir, or pass --overwrite to replace it",
        )
    if old and not quiet:
        print(f"srpo-graph train: replacing the previous run in {run_dir} (--overwrite)", file=sys.stderr)
    for p in old:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)
