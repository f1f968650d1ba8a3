"""CLI commands of the trainer stage (listed in ``COMMANDS``, registered by ``srpo_graph.cli``).

``srpo-graph train FILE.wf [--steps N] [--seed S] [--run-dir DIR] [--config train.toml]
[--resume RUN_DIR] [--tasks PATH] [--nproc N] [key=value ...]``

Precedence, lowest first: defaults, ``--config`` TOML, ``key=value`` overrides, the explicit
flags. ``--resume RUN_DIR`` starts from ``RUN_DIR/config.toml`` instead of the defaults (so a
resumed run is the same run; ``--steps`` may extend it). ``--nproc N`` (N > 1) re-launches the
same command under ``torchrun``. Heavy imports (torch, transformers) happen inside the command.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from srpo_graph import exiting
from srpo_graph.fmt import fixed
from srpo_graph.supervisor import USER_EXIT
from srpo_graph.train.eval_command import eval_command


@click.command("train", context_settings={"ignore_unknown_options": False})
@click.argument("workflow", type=click.Path(exists=True, path_type=Path))  # a folder: refused, naming its .wf
@click.argument("overrides", nargs=-1)
@click.option("--steps", type=int, default=None, help="Training steps (default 100, or the resumed run's).")
@click.option("--seed", type=int, default=None, help="Seed (task order, sampling, shuffling).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run folder (default: a new runs/<workflow name>-<date-time>).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A TOML file with any TrainConfig fields (see docs/training.md).")
@click.option("--resume", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Continue the run in this folder from its newest complete checkpoint.")
@click.option("--tasks", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Training tasks (JSONL); default: the workflow's tasks/ file.")
@click.option(
    "--nproc", type=int, default=None, help="Data-parallel processes on this node (re-launches under torchrun)."
)
@click.option(
    "--nnodes",
    type=click.IntRange(1, 4096),
    default=1,
    show_default=True,
    help="Nodes of a multi-node job; run the same command on each, with its --node-rank.",
)
@click.option(
    "--node-rank",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="This node's index, 0..nnodes-1 (node 0 holds rank 0 and the run folder).",
)
@click.option(
    "--rdzv-endpoint",
    default=None,
    metavar="HOST:PORT",
    help="Where the nodes meet: node 0's address and a free port (torchrun's static rendezvous).",
)
@click.option(
    "--plan",
    "plan_gpus",
    type=click.IntRange(1, 1024),
    default=None,
    metavar="GPUS",
    help="Print where SGLang servers and trainer ranks would go on GPUS GPUs of one node, and the "
    "commands that start them; start nothing.",
)
@click.option("--overwrite", is_flag=True, default=False, help="Replace an earlier run found in --run-dir.")
def train_command(
    workflow,
    overrides,
    steps,
    seed,
    run_dir,
    config_path,
    resume,
    tasks,
    nproc,
    nnodes,
    node_rank,
    rdzv_endpoint,
    plan_gpus,
    overwrite,
):
    """Train the workflow in WORKFLOW (.wf) with SRPO; KEY=VALUE pairs override config fields.

    Example: srpo-graph train workflows/coord_par3.wf --steps 50 optim.lr=2e-3 loss.eps_high=0.28
    """
    if workflow.is_dir():  # a run folder where the .wf belongs: say what it is and both ways on
        from srpo_graph.errors import ConfigError
        from srpo_graph.train.run_folder import run_folder_of, workflow_given_a_folder

        wf_file = workflow_given_a_folder(workflow, "train")
        raise ConfigError.at(str(workflow), f"a run of {wf_file}: `srpo-graph train` takes the workflow (.wf) first",
                             fix=f"continue it: srpo-graph train {wf_file} --resume {run_folder_of(workflow)}; "
                                 f"or start another run of it: srpo-graph train {wf_file} --run-dir NEW_DIR")
    if plan_gpus is not None:
        _print_plan(workflow, plan_gpus, overrides)
        return
    if resume is not None and not resume.is_dir() and not (nnodes > 1 and node_rank > 0):
        # (another node of a multi-node job has no run folder: it follows node 0, multinode.py)
        raise click.BadParameter(f"Directory '{resume}' does not exist.", param_hint="'--resume'")
    exiting.stop_on_sigterm()  # SIGTERM stops the run like Ctrl-C: resumable, no traceback
    try:
        from srpo_graph.train.config.build import build_config  # (torch and the rest load here, not at start-up)

        if LAUNCH_ENV in os.environ:  # a torchrun worker started by --nproc: the parent resolved the config
            from srpo_graph.train.config.loading import load_toml, validate

            cfg = validate(load_toml(os.environ[LAUNCH_ENV]), os.environ[LAUNCH_ENV])
            resume = Path(cfg.run_dir) if os.environ.get(RESUME_ENV) == "1" else None
        elif resume is not None and node_rank > 0 and not (Path(resume) / "config.toml").exists():
            # another node of a multi-node job: the run folder is on node 0, whose config this node follows
            from srpo_graph.train.parallel.job import FOLLOW_ENV

            cfg = build_config(config_path, overrides, steps=steps, seed=seed, run_dir=resume, tasks=tasks, nproc=nproc)
            os.environ[FOLLOW_ENV] = "1"
        else:
            cfg = build_config(
                config_path, overrides, steps=steps, seed=seed, run_dir=run_dir, tasks=tasks, nproc=nproc, resume=resume
            )
            if overwrite:
                cfg = cfg.model_copy(update={"overwrite": True})
    except KeyboardInterrupt:  # while reading the configuration: nothing was touched
        exiting.decided()
        click.echo(
            f"srpo-graph train: {_interrupt_name()} while starting, nothing was done; run the command again", err=True
        )
        sys.exit(_interrupt_code())
    if (cfg.nproc > 1 or nnodes > 1) and "WORLD_SIZE" not in os.environ:
        # the refusals of a job of several processes, here, before torchrun starts them (each rank would
        # print its own copy of the error): docs/combinations.md
        # (none of this imports torch: this process only starts torchrun, Note [A table without torch])
        from srpo_graph.lang import load_workflow
        from srpo_graph.train.config.refusals import check_async, check_strategy
        from srpo_graph.train.parallel.job import DistInfo
        from srpo_graph.train.rollout.ranks import samples_on_every_rank

        job = DistInfo(world_size=cfg.nproc * nnodes)
        check_async(cfg, job)
        samples_on_every_rank(cfg, job)
        check_strategy(load_workflow(workflow), cfg, job.world_size)
        if cfg.run_dir is None:  # every rank must agree on the folder, and the resume line names it
            from srpo_graph.lang import load_workflow
            from srpo_graph.train.config.loading import default_run_dir

            cfg = cfg.model_copy(update={"run_dir": default_run_dir(load_workflow(workflow).name)})
        try:
            code = _launch(
                workflow, cfg, resume is not None, nnodes=nnodes, node_rank=node_rank, endpoint=rdzv_endpoint
            )
        except KeyboardInterrupt:  # the ranks have stopped; rank 0 has printed where the run stands
            exiting.decided()
            from srpo_graph.train.stops import continue_command

            click.echo(
                f"srpo-graph train: {_interrupt_name()}; continue with: {continue_command(workflow, cfg.run_dir)}",
                err=True,
            )
            sys.exit(_interrupt_code())
        exiting.decided()
        sys.exit(code)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        from srpo_graph.train.trainer import RunStopped, TrainingInterrupted, train

        try:
            summary = train(workflow, cfg, resume=resume is not None)
        except RunStopped as exc:  # disk full, failure budget, a dead server: the cause and the command that continues
            exiting.decided()
            if main_rank:
                click.echo(exc.advice(workflow), err=True)
            if exc.consequence:  # another rank's failure is the job's cause: let torchrun see it first
                from srpo_graph.train.parallel.launch import stopped_after_another_rank

                stopped_after_another_rank(str(exc))
            sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        # (TrainingInterrupted is a KeyboardInterrupt; it is looked up here, not named in an `except`, because a
        # Ctrl-C can land inside the import above, before the name is bound: tests/test_except_names.py)
        from srpo_graph.train.stops import TrainingInterrupted

        exiting.decided()
        if isinstance(exc, TrainingInterrupted):  # Ctrl-C / SIGTERM in the loop: no traceback, say how to continue
            if main_rank:
                click.echo(exc.advice(workflow), err=True)
            sys.exit(_interrupt_code())
        # before the loop started (imports, loading models and tasks)
        if main_rank:
            from srpo_graph.train.stops import continue_command

            folder = resume if resume is not None else cfg.run_dir
            again = (
                f"resume: {continue_command(workflow, folder)}"
                if folder is not None and (Path(folder) / "config.toml").is_file()
                else "nothing was trained; run the command again to start"
            )
            click.echo(f"srpo-graph train: {_interrupt_name()} while starting, nothing trained yet; {again}", err=True)
        sys.exit(_interrupt_code())
    exiting.decided()
    if main_rank and resume is not None and summary.steps_this_run == 0:
        click.echo(
            f"nothing to do: the run in {summary.run_dir} is already at step {summary.steps} "
            f"(extend it with --steps N, N > {summary.steps})"
        )
        return
    if main_rank:
        evals = ", ".join(f"step {s}: {fixed(r)}" for s, r in summary.eval_rewards[-3:]) or "-"
        click.echo(
            f"trained {summary.workflow} for {summary.steps_this_run} steps in {summary.seconds:.1f} s"
            f"{f' (resumed; the run is now at step {summary.steps})' if resume is not None else ''}\n"
            f"  reward: first step {fixed(summary.first_reward)} -> last {min(10, summary.steps)} steps "
            f"{fixed(summary.final_reward)}\n"
            f"  eval reward: {evals}\n"
            f"  skipped updates: {summary.skipped_updates}\n"
            f"  run folder: {summary.run_dir} (metrics.jsonl, plots/, checkpoints/, tensorboard/)"
        )


def _interrupt_name() -> str:
    return "terminated (SIGTERM)" if exiting.stopped_by() else "interrupted"


def _interrupt_code() -> int:
    return 128 + (exiting.stopped_by() or signal.SIGINT)


def _after_a_lost_rank(workflow: Path, run_dir: Path) -> None:
    from srpo_graph.train import checkpoint as ckpt

    last = ckpt.latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if last is None:
        click.echo(
            f"srpo-graph train: no checkpoint yet; start again: srpo-graph train {workflow} --run-dir {run_dir} "
            "--overwrite",
            err=True,
        )
    else:
        click.echo(
            f"srpo-graph train: newest complete checkpoint: {last}; resume: srpo-graph train {workflow} "
            f"--resume {run_dir}",
            err=True,
        )


def _print_plan(workflow: Path, gpus: int, overrides: tuple[str, ...]) -> None:
    """``--plan GPUS``: the placement of servers and trainer ranks, and the commands (placement.py)."""
    from srpo_graph.lang import load_workflow
    from srpo_graph.models import resolve_model
    from srpo_graph.train.parallel.placement import plan

    wf = load_workflow(workflow)
    p = plan(
        gpus,
        [(pol.name, str(resolve_model(pol.model))) for pol in wf.policies if pol.adapter is None],
        train_args=[o for o in overrides if not o.startswith("rollout.sglang.urls")],
    )
    click.echo(f"{wf.name} on {gpus} GPU{'s' * (gpus > 1)} of one node:\n{p.table()}\n\ncommands:")
    for line in p.commands(str(workflow)):
        click.echo(f"  {line}")


LAUNCH_ENV = "SRPO_GRAPH_TRAIN_CONFIG"
RESUME_ENV = "SRPO_GRAPH_TRAIN_RESUME"


def _launch(
    workflow: Path, cfg, resume: bool, *, nnodes: int = 1, node_rank: int = 0, endpoint: str | None = None
) -> int:
    """Re-run this command under torchrun; the workers read the resolved config from a file.

    Passing a file (not the original flags) keeps torchrun's own option parser away from ours
    (it would take ``--nproc`` for its ``--nproc-per-node``).
    """
    import tempfile

    from srpo_graph.train.config.loading import write_config
    from srpo_graph.train.parallel.launch import launch

    with tempfile.TemporaryDirectory(prefix="srpo-graph-launch-") as tmp:
        path = Path(tmp) / "config.toml"
        if cfg.run_dir is None:  # every rank must agree on the folder
            from srpo_graph.lang import load_workflow
            from srpo_graph.train.config.loading import default_run_dir

            cfg = cfg.model_copy(update={"run_dir": default_run_dir(load_workflow(workflow).name)})
        write_config(cfg, path)
        os.environ[LAUNCH_ENV], os.environ[RESUME_ENV] = str(path), "1" if resume else "0"
        try:
            code = launch(
                cfg.nproc,
                [str(workflow)],
                nnodes=nnodes,
                node_rank=node_rank,
                endpoint=endpoint,
                timeout=cfg.dist_timeout,
            )
            if (code > 128 or code == USER_EXIT) and node_rank == 0:
                # a rank was killed or user code ended it: the survivors may not have said how to go on
                _after_a_lost_rank(workflow, Path(cfg.run_dir))
            return code
        finally:
            os.environ.pop(LAUNCH_ENV, None)
            os.environ.pop(RESUME_ENV, None)


@click.command("export-adapter")
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--policy", required=True, help="The LoRA adapter policy to export.")
@click.option("--dtype", default="float32", show_default=True, help="dtype of the saved model.")
def export_adapter_command(source, out, policy, dtype):
    """Merge a trained LoRA adapter into its base; write a full model to OUT.

    SOURCE is a run folder (its newest good checkpoint) or one checkpoints/step_N folder.

    Example: srpo-graph export-adapter runs/coord_lora2 --policy role_a exported/role_a
    """
    from srpo_graph.train.policies.lora import export_adapter

    click.echo(f"wrote {export_adapter(source, policy, out, dtype=dtype)} (load it with from_pretrained)")


@click.command("consolidate")
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Where to write.")
@click.option("--step", type=int, default=None, help="Checkpoint step_N of a run folder (default: newest good).")
@click.option("--policy", default=None, help="One policy only (default: every policy of the checkpoint).")
def consolidate_command(source, out, step, policy):
    """Write a checkpoint's policies as save_pretrained model folders (+ tokenizer).

    SOURCE is a run folder (its newest good checkpoint, or --step N) or one checkpoints/step_N
    folder; its checkpoint may be sharded (strategy=fsdp: DCP shards, read one file-sized piece at
    a time) or not. One policy (or --policy): OUT is the model folder; several: OUT/<policy>/.

    Example: srpo-graph consolidate runs/coord_fsdp --out exported/coord
    """
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.checkpoint import open_checkpoint
    from srpo_graph.train.checkpoint.layout import read_state
    from srpo_graph.train.checkpoint.sharded import consolidate

    is_run = (source / "config.toml").is_file() and (source / "checkpoints").is_dir()
    if not (is_run or ((source / "COMPLETE").is_file() and source.parent.name == "checkpoints")):
        raise ConfigError.at(
            str(source),
            "not a run folder (config.toml + checkpoints/) or one checkpoints/step_N folder",
            fix="give RUN_DIR or RUN_DIR/checkpoints/step_N",
        )
    checkpoint = open_checkpoint(source, step, reader="consolidate")  # Note [One verified read]
    policies = [policy] if policy else list(read_state(checkpoint)["policies"])  # (verified: it reads)
    for name in policies:
        written = consolidate(checkpoint, name, out if len(policies) == 1 else out / name)
        click.echo(f"wrote {written} ({name}, {checkpoint.name}; load it with from_pretrained)")


COMMANDS: list = [train_command, export_adapter_command, consolidate_command, eval_command]
