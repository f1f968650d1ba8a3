"""CLI commands of the trainer stage (listed in ``COMMANDS``, registered by ``srpo_graph.cli``).

``srpo-graph train FILE.wf [--steps N] [--seed S] [--run-dir DIR] [--config train.toml]
[--resume RUN_DIR] [--tasks PATH] [--nproc N] [key=value ...]``

Precedence, lowest first: defaults, ``--config`` TOML, ``key=value`` overrides, the explicit
flags. ``--resume RUN_DIR`` starts from ``RUN_DIR/config.toml`` instead of the defaults (so a
resumed run is the same run; ``--steps`` may extend it). ``--nproc N`` (N > 1) re-launches the
same command under ``torchrun``. Heavy imports (torch, transformers) happen inside the command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click


def build_config(config_path, overrides, *, steps=None, seed=None, run_dir=None, tasks=None, nproc=None, resume=None):
    """The run's TrainConfig from the CLI's pieces (see the module docstring for precedence).

    Raises:
        ConfigError: bad TOML, unknown field, invalid value, or a run folder without config.toml.
    """
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.config import load_toml, merge_overrides, validate

    data: dict = {}
    source = "config"
    if resume is not None:
        saved = Path(resume) / "config.toml"
        if not saved.is_file():
            raise ConfigError(f"{resume}: error: not a run folder (no config.toml)\n"
                              "  fix: pass the --run-dir of an earlier `srpo-graph train`")
        data, source = load_toml(saved), str(saved)
    if config_path is not None:
        data = merge_overrides({**data, **load_toml(config_path)}, [])
        source = str(config_path)
    flags = list(overrides)
    for key, value in (("steps", steps), ("seed", seed), ("nproc", nproc)):
        if value is not None:
            flags.append(f"{key}={value}")
    for key, value in (("run_dir", resume if resume is not None else run_dir), ("rollout.tasks", tasks)):
        if value is not None:
            flags.append(f"{key}={json.dumps(str(value))}")
    return validate(merge_overrides(data, flags), source if not flags else f"{source} + overrides")


@click.command("train", context_settings={"ignore_unknown_options": False})
@click.argument("workflow", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("overrides", nargs=-1)
@click.option("--steps", type=int, default=None, help="Training steps (default 100, or the resumed run's).")
@click.option("--seed", type=int, default=None, help="Seed (task order, sampling, shuffling).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run folder (default: a new runs/<workflow name>-<date-time>).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A TOML file with any TrainConfig fields (see docs/training.md).")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Continue the run in this folder from its newest complete checkpoint.")
@click.option("--tasks", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Training tasks (JSONL); default: the workflow's tasks/ file.")
@click.option("--nproc", type=int, default=None, help="Data-parallel processes (re-launches under torchrun).")
@click.option("--overwrite", is_flag=True, default=False, help="Replace an earlier run found in --run-dir.")
def train_command(workflow, overrides, steps, seed, run_dir, config_path, resume, tasks, nproc, overwrite):
    """Train the workflow in WORKFLOW (.wf) with SRPO; KEY=VALUE pairs override config fields.

    Example: srpo-graph train workflows/coord_par3.wf --steps 50 optim.lr=2e-3 loss.eps_high=0.28
    """
    if LAUNCH_ENV in os.environ:  # a torchrun worker started by --nproc: the parent resolved the config
        from srpo_graph.train.config import load_toml, validate

        cfg = validate(load_toml(os.environ[LAUNCH_ENV]), os.environ[LAUNCH_ENV])
        resume = Path(cfg.run_dir) if os.environ.get(RESUME_ENV) == "1" else None
    else:
        cfg = build_config(config_path, overrides, steps=steps, seed=seed, run_dir=run_dir, tasks=tasks,
                           nproc=nproc, resume=resume)
        if overwrite:
            cfg = cfg.model_copy(update={"overwrite": True})
    if cfg.nproc > 1 and "WORLD_SIZE" not in os.environ:
        try:
            code = _launch(workflow, cfg, resume is not None)
        except KeyboardInterrupt:  # rank 0 has printed where the run stands and how to resume
            click.echo(f"srpo-graph train: interrupted; continue with: srpo-graph train {workflow} --resume RUN_DIR "
                       "(the run folder named above)", err=True)
            sys.exit(130)
        sys.exit(code)
    from srpo_graph.train.trainer import TrainingInterrupted, train

    main_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        summary = train(workflow, cfg, resume=resume is not None)
    except TrainingInterrupted as exc:  # Ctrl-C: no traceback, say how to continue
        if main_rank:
            click.echo(exc.advice(workflow), err=True)
        sys.exit(130)
    except KeyboardInterrupt:  # before the loop started (loading models, tasks)
        if main_rank:
            click.echo("srpo-graph train: interrupted before the first step; nothing was trained", err=True)
        sys.exit(130)
    if main_rank and resume is not None and summary.steps_this_run == 0:
        click.echo(f"nothing to do: the run in {summary.run_dir} is already at step {summary.steps} "
                   f"(extend it with --steps N, N > {summary.steps})")
        return
    if main_rank:
        evals = ", ".join(f"step {s}: {r:.3f}" for s, r in summary.eval_rewards[-3:]) or "-"
        click.echo(
            f"trained {summary.workflow} for {summary.steps} steps in {summary.seconds:.1f} s\n"
            f"  reward: first step {summary.first_reward:.3f} -> last {min(10, summary.steps)} steps "
            f"{summary.final_reward:.3f}\n"
            f"  eval reward: {evals}\n"
            f"  skipped updates: {summary.skipped_updates}\n"
            f"  run folder: {summary.run_dir} (metrics.jsonl, plots/, checkpoints/, tensorboard/)"
        )


LAUNCH_ENV = "SRPO_GRAPH_TRAIN_CONFIG"
RESUME_ENV = "SRPO_GRAPH_TRAIN_RESUME"


def _launch(workflow: Path, cfg, resume: bool) -> int:
    """Re-run this command under torchrun; the workers read the resolved config from a file.

    Passing a file (not the original flags) keeps torchrun's own option parser away from ours
    (it would take ``--nproc`` for its ``--nproc-per-node``).
    """
    import tempfile

    from srpo_graph.train.config import write_config
    from srpo_graph.train.distributed import launch

    with tempfile.TemporaryDirectory(prefix="srpo-graph-launch-") as tmp:
        path = Path(tmp) / "config.toml"
        if cfg.run_dir is None:  # every rank must agree on the folder
            from srpo_graph.lang import load_workflow
            from srpo_graph.train.config import default_run_dir

            cfg = cfg.model_copy(update={"run_dir": default_run_dir(load_workflow(workflow).name)})
        write_config(cfg, path)
        os.environ[LAUNCH_ENV], os.environ[RESUME_ENV] = str(path), "1" if resume else "0"
        try:
            return launch(cfg.nproc, [str(workflow)])
        finally:
            os.environ.pop(LAUNCH_ENV, None)
            os.environ.pop(RESUME_ENV, None)


COMMANDS: list = [train_command]
