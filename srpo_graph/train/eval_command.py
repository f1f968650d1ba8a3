"""Trainer stage, top: ``srpo-graph eval`` -- evaluate run folders, checkpoints and model directories on a task file.

Consumes a ``.wf`` file, sources and a task file; produces, in ``--out``: ``eval.json`` (every
:class:`~srpo_graph.eval.score.EvalReport` and comparison), ``eval.md`` (the tables, also
printed), ``eval.png`` (Avg@k and Pass@k per source with their intervals) and
``traces/<n>.jsonl`` (the episodes). A source is

* a **run folder** of ``srpo-graph train`` (its newest good checkpoint, or ``--step N``; full or
  LoRA-adapter policies, loaded the way ``--resume`` loads them), or one ``checkpoints/step_N``;
* a **model directory** (``config.json`` + weights): every policy of the workflow uses it;
* ``base``: the workflow's policies as declared (the untrained start).

The policies are built by the trainer's own code (``policies/build.py``, ``rollout/backends.py``) under the run's saved
config (or ``--config`` / ``-o key=value``), so ``-o rollout.backend=sglang`` launches SGLang
servers exactly as ``train`` does (``rollout.sglang.*``) and stops them after each source. Every
source runs the same tasks with the same ``--seed``: the same per-request seeds, so
``--compare A B`` pairs sample j of problem i of A with sample j of problem i of B.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import click

from srpo_graph.errors import ConfigError
from srpo_graph.eval.score import Comparison, EvalReport, compare, score
from srpo_graph.fmt import fixed


@dataclass(frozen=True)
class Source:
    """What to evaluate: ``kind`` is ``run`` (with its checkpoint), ``model`` or ``base``."""

    label: str
    kind: str
    path: Path | None = None
    checkpoint: Path | None = None


def resolve_source(text: str, step: int | None = None) -> Source:
    """The :class:`Source` a command-line word names.

    Raises:
        ConfigError: not ``base``, a run folder, a checkpoint or a model directory; ``--step N``
            has no checkpoint; the run has no good checkpoint.
    """
    from srpo_graph.train import checkpoint as ckpt

    if text == "base":
        return Source(text, "base")
    path = Path(text)
    if (path / ckpt.COMPLETE).is_file() and path.parent.name == "checkpoints":  # one checkpoint, verified
        return Source(text, "run", path.parent.parent, ckpt.open_checkpoint(path, reader="evaluate"))
    if (path / "config.toml").is_file() and (path / "checkpoints").is_dir():  # Note [One verified read]
        return Source(text, "run", path, ckpt.open_checkpoint(path, step, reader="evaluate"))
    if (path / "config.json").is_file():
        if ckpt.enclosing_checkpoint(path) is not None:  # a checkpoint's policy folder: a verified snapshot
            return Source(text, "model", ckpt.open_checkpoint(path, reader="evaluate"))
        return Source(text, "model", path)
    raise ConfigError.at(text, "not a source to evaluate",
                         why="a source is `base`, a run folder (config.toml + checkpoints/), one "
                             "checkpoints/step_N folder, or a model directory (config.json)",
                         fix="check the path")


def source_config(source: Source, config_path: Path | None, overrides: Sequence[str], out: Path):
    """The ``TrainConfig`` a source is loaded under: a run's saved config (then ``--config`` and
    the overrides), else the defaults with them; ``run_dir`` is the evaluation's folder (SGLang's
    weight files go there)."""
    from srpo_graph.train.config.build import build_config

    resume = source.path if source.kind == "run" else None
    refuse_training_only(config_path, overrides)
    cfg = build_config(config_path, list(overrides), resume=resume)
    rollout = cfg.rollout.model_copy(update=SAMPLING_ALONE)  # a run's overlap settings are the trainer's
    return cfg.model_copy(update={"run_dir": out / "work", "overwrite": True, "rollout": rollout})


# Note [Sampling outside the trainer]: the rollout worker and overlapped rollouts overlap sampling
# with the trainer's updates; a command that only samples (eval) has no updates to overlap with, so
# a run trained with them is evaluated by its backend in this process (issue 39, item 1: `eval` on a
# `rollout.worker = true` run used to meet the worker's "run the whole batch there").
SAMPLING_ALONE = {"worker": False, "max_staleness": 0, "partial_rollouts": False}


def refuse_training_only(config_path: Path | None, overrides: Sequence[str]) -> None:
    """Refuse a training-only rollout setting given to a command that only samples.

    Raises:
        ConfigError: ``rollout.worker``, ``rollout.max_staleness`` or ``rollout.partial_rollouts``
            set by an override or by ``--config`` (named).
    """
    from srpo_graph.train.config.loading import load_toml

    given = {o.split("=", 1)[0].strip() for o in overrides}
    if config_path is not None:
        given |= {f"rollout.{k}" for k in (load_toml(config_path).get("rollout") or {})}
    for key in sorted(given & {f"rollout.{k}" for k in SAMPLING_ALONE}):
        raise ConfigError.at(f"field `{key}`", "is a training setting: it overlaps sampling with the trainer's "
                             "updates, and `eval` only samples (it runs the backend in this process)",
                             fix=f"leave {key} out of eval's overrides and --config")


def evaluate_source(workflow_path: Path, source: Source, tasks_path: Path | None, *, samples: int, seed: int,
                    threshold: float = 1.0, ks: Sequence[int] | None = None, num_tasks: int | None = None,
                    greedy: bool = False, config_path: Path | None = None, overrides: Sequence[str] = (),
                    out: Path, progress: bool = False) -> tuple[EvalReport, list[Any]]:
    """Load ``source``'s policies, run ``samples`` episodes per task and score them.

    Raises:
        ConfigError: a bad source, config or task file.
    """
    from srpo_graph.backends import backend_spec
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks
    from srpo_graph.train.parallel.job import DistInfo
    from srpo_graph.train.policies import frozen as frozen_policies
    from srpo_graph.train.policies.build import build_policies, device_of
    from srpo_graph.train.rollout.backends import attach_backends, server_scope
    from srpo_graph.train.rollout.tasks import default_task_file, override_workflow

    cfg = source_config(source, config_path, overrides, out)
    wf = load_workflow(workflow_path, models=cfg.rollout.models)  # checked on the models that will run
    models = dict(cfg.rollout.models or {})
    if source.kind == "model":
        models = {p.name: str(source.path) for p in wf.policies if p.adapter is None}
    wf = override_workflow(wf, models=models, max_tokens=cfg.rollout.max_tokens, logprobs=cfg.rollout.logprobs)
    wf = override_workflow(wf, greedy=greedy)
    if tasks_path is None:  # a run's own held-out file, else the one next to its (or the workflow's) tasks
        r = cfg.rollout
        if r.eval_tasks is not None:
            tasks_path = Path(r.eval_tasks)
        else:
            train_file = Path(r.tasks) if r.tasks is not None else default_task_file(workflow_path, wf)
            tasks_path = held_out_next_to(train_file)
    tasks = load_tasks(tasks_path, wf)[:num_tasks]
    t0 = time.perf_counter()
    device = device_of(cfg)
    with server_scope():  # servers launched for this source stop with it
        frozen_local, external = frozen_policies.load_frozen(wf, cfg, device)  # frozen / external policies
        slots = build_policies(wf, cfg, device, source.checkpoint, DistInfo())
        frozen = attach_backends(wf, cfg, slots, frozen_local, external, device, DistInfo())
        res = run(
            wf,
            tasks,
            {**frozen, **{s.name: s.backend for s in slots}},
            samples=samples,
            seed=seed,
            progress=progress,
            on_backend_error="fail"
            if backend_spec(cfg.rollout.backend).remote or any(p.external is not None for p in wf.policies)
            else "raise",
            scheduler=cfg.rollout.scheduler,
        )
    rep = score(
        wf,
        res.episodes,
        tasks,
        samples=samples,
        seed=seed,
        threshold=threshold,
        ks=ks,
        label=source.label,
        seconds=time.perf_counter() - t0,
    )
    return rep, list(res.episodes)


def held_out_next_to(train: Path) -> Path:
    """The held-out split next to a task file (``<stem>_eval.jsonl``, as the trainer finds it), else that file."""
    held = Path(train).with_name(f"{Path(train).stem}_eval.jsonl")
    return held if held.is_file() else Path(train)


# --------------------------------------------------------------------------- outputs


def markdown(reports: Sequence[EvalReport], comparisons: Sequence[Comparison]) -> str:
    """The tables ``srpo-graph eval`` prints and writes to ``eval.md``."""
    if not reports:
        return ""
    ks = reports[0].ks
    k = reports[0].samples
    lines = [
        f"Workflow `{reports[0].workflow}`: {reports[0].overall.problems} problems x {k} samples, seed "
        f"{reports[0].seed}; correct = reward >= {reports[0].threshold:g}; [95% bootstrap interval over problems].",
        "",
        "| source | Avg@"
        + str(k)
        + " | "
        + " | ".join(f"Pass@{x}" for x in ks)
        + " | terminal reward | ok / truncated / failed |",
        "|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    for r in reports:
        st = r.statuses
        lines.append(
            f"| {r.label} | {r.overall.avg.fmt()} | "
            + " | ".join(r.overall.pass_at[x].fmt() for x in ks)
            + f" | {fixed(r.terminal_reward)} | {st.get('ok', 0)} / {st.get('truncated', 0)} / {st.get('failed', 0)} |"
        )
    for title, attr in (
        ("task family", "by_family"),
        ("route (transitions fired)", "by_route"),
        ("answering agent", "by_agent"),
    ):
        keys = sorted({g for r in reports for g in getattr(r, attr)})
        if len(keys) < 2 and attr != "by_family":
            continue
        lines += [
            "",
            f"By {title}: Avg [95% interval] (share of episodes)",
            "",
            "| " + title.split(" (")[0] + " | " + " | ".join(r.label for r in reports) + " |",
            "|---|" + "---|" * len(reports),
        ]
        for key in keys:
            cells = [f"{g.avg.fmt()} ({g.share:.2f})" if (g := getattr(r, attr).get(key)) else "-" for r in reports]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    declared = sorted({t for r in reports for t in r.transition_rewards})
    if declared:
        lines += [
            "",
            "Transition rewards: mean per firing (firings per episode)",
            "",
            "| transition | " + " | ".join(r.label for r in reports) + " |",
            "|---|" + "---|" * len(reports),
        ]
        for t in declared:
            cells = [
                f"{fixed(x.mean_reward)} ({x.firings_per_episode:.2f})" if (x := r.transition_rewards.get(t)) else "-"
                for r in reports
            ]
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
    for c in comparisons:
        lines += [
            "",
            f"Paired difference `{c.b}` - `{c.a}` over {c.problems} problems (same seeds): mean "
            "[paired bootstrap 95% interval], sign-flip p",
            "",
            "| metric | difference |",
            "|---|---|",
        ]
        lines += [
            f"| {'Avg@%d' % k if m == 'avg' else m.replace('pass', 'Pass')} | {d.fmt()} |" for m, d in c.diffs.items()
        ]
        lines += [f"| Avg@{k}, {fam} | {d.fmt()} |" for fam, d in c.by_family.items() if len(c.by_family) > 1]
    return "\n".join(lines) + "\n"


def plot(reports: Sequence[EvalReport], path: Path) -> Path:
    """Avg@k and Pass@k per source (bars with the 95% intervals); one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("Avg@%d" % reports[0].samples, lambda r: r.overall.avg)] + [
        (f"Pass@{k}", lambda r, k=k: r.overall.pass_at[k]) for k in reports[0].ks
    ]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(metrics) * max(1, len(reports)) / 2, 3.4))
    width = 0.8 / len(reports)
    for i, r in enumerate(reports):
        xs = [j + i * width for j in range(len(metrics))]
        ests = [f(r) for _, f in metrics]
        err = [
            [max(0.0, e.value - e.low) if e.low == e.low else 0.0 for e in ests],
            [max(0.0, e.high - e.value) if e.high == e.high else 0.0 for e in ests],
        ]
        ax.bar(xs, [e.value for e in ests], width, yerr=err, capsize=2, label=r.label, color=f"C{i}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(metrics))], [m for m, _ in metrics], fontsize=8)
    ax.set_ylabel("mean over problems (95% CI)", fontsize=8)
    ax.set_title(
        f"{reports[0].workflow}: {reports[0].overall.problems} problems x {reports[0].samples} samples", fontsize=9
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(
    out: Path, reports: Sequence[EvalReport], comparisons: Sequence[Comparison], episodes: Sequence[Sequence[Any]] = ()
) -> str:
    """``eval.json``, ``eval.md``, ``eval.png`` and ``traces/<n>.jsonl`` in ``out``; returns the markdown."""
    from srpo_graph.runtime.trace import write_traces

    out.mkdir(parents=True, exist_ok=True)
    # through pydantic's JSON (an undefined interval, nan, becomes null: strict JSON)
    record = {
        "reports": [json.loads(r.model_dump_json()) for r in reports],
        "comparisons": [json.loads(c.model_dump_json()) for c in comparisons],
    }
    (out / "eval.json").write_text(json.dumps(record, indent=1, allow_nan=False), encoding="utf-8")
    md = markdown(reports, comparisons)
    (out / "eval.md").write_text(md, encoding="utf-8")
    if reports:
        plot(reports, out / "eval.png")
    for i, eps in enumerate(episodes):
        (out / "traces").mkdir(exist_ok=True)
        write_traces(out / "traces" / f"{i}.jsonl", list(eps))
    return md


def evaluate_all(
    workflow_path: Path,
    sources: Sequence[str],
    *,
    compare_pair: tuple[str, str] | None = None,
    step: int | None = None,
    out: Path,
    **kw: Any,
) -> tuple[list[EvalReport], list[Comparison]]:
    """Evaluate every source (``compare_pair``'s two are added when missing) and write the outputs.

    ``kw`` goes to :func:`evaluate_source` (``tasks_path``, ``samples``, ``seed``, ...).
    """
    words = list(dict.fromkeys([*sources, *(compare_pair or ())])) or ["base"]
    resolved = [resolve_source(w, step) for w in words]  # every source checked before any runs
    reports, episodes = [], []
    for src in resolved:
        rep, eps = evaluate_source(workflow_path, src, out=out, **kw)
        reports.append(rep)
        episodes.append(eps)
    comparisons = []
    if compare_pair is not None:
        by = {r.label: r for r in reports}
        try:
            comparisons.append(compare(by[compare_pair[0]], by[compare_pair[1]]))
        except ValueError as exc:
            raise ConfigError.at("--compare", str(exc)) from None
    write_outputs(out, reports, comparisons, episodes)
    return reports, comparisons


@click.command("eval")
@click.argument("workflow", type=click.Path(exists=True, path_type=Path))  # a run folder: its recorded .wf
@click.argument("sources", nargs=-1)
@click.option(
    "--tasks",
    "tasks_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Task file (JSONL); default: the workflow's held-out split (<tasks>_eval.jsonl), else its task file.",
)
@click.option(
    "--samples",
    "-k",
    type=click.IntRange(1, 1024),
    default=16,
    show_default=True,
    help="k: sampled episodes per problem (Avg@k; Pass@k for k' <= k).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed: per-request seeds and the bootstrap.")
@click.option(
    "--step", type=int, default=None, help="Evaluate run folders at checkpoint step_N (default: newest good)."
)
@click.option(
    "--compare",
    "compare_pair",
    nargs=2,
    default=None,
    metavar="A B",
    help="Paired differences B - A over the same problems and samples (A, B: sources, added if missing).",
)
@click.option(
    "--threshold",
    type=float,
    default=1.0,
    show_default=True,
    help="An episode is correct (Pass@k) when its reward >= this.",
)
@click.option("--pass-k", "pass_k", default=None, help="Comma-separated k for Pass@k (default 1, 2, 4, ..., samples).")
@click.option("--num-tasks", type=click.IntRange(1), default=None, help="Evaluate only the first N tasks.")
@click.option("--greedy", is_flag=True, default=False, help="Temperature 0 everywhere (default: sampled, as declared).")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A TOML TrainConfig (rollout.* chooses the backend; a run folder's own config comes first).",
)
@click.option(
    "--override",
    "-o",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Config overrides, e.g. -o rollout.backend=sglang -o rollout.sglang.launch=cpu.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output folder (default evals/<workflow>-<date-time>).",
)
@click.option("--progress/--no-progress", default=True, help="Show a progress bar per source.")
def eval_command(
    workflow,
    sources,
    tasks_path,
    samples,
    seed,
    step,
    compare_pair,
    threshold,
    pass_k,
    num_tasks,
    greedy,
    config_path,
    overrides,
    out,
    progress,
):
    """Evaluate SOURCES (run folders, checkpoints, model directories, `base`) on a task file.

    WORKFLOW may be a run folder itself (`srpo-graph eval RUN_DIR`): the workflow it recorded
    evaluates it, and it is the first source.

    Example: srpo-graph eval workflows/tinysearch.wf base runs/tinysearch --samples 16 --compare base runs/tinysearch
    """
    from srpo_graph.lang import load_workflow

    if workflow.is_dir():  # the run folder first, as typed after `train`: its own workflow (run_folder.py)
        from srpo_graph.train.run_folder import workflow_given_a_folder

        wf_file = workflow_given_a_folder(workflow, "eval")
        click.echo(f"srpo-graph eval: {workflow} is a run of {wf_file}; evaluating it with that workflow", err=True)
        workflow, sources = wf_file, (str(workflow), *sources)

    try:
        ks = [int(x) for x in pass_k.split(",")] if pass_k else None
    except ValueError:
        raise ConfigError.at("--pass-k", f"{pass_k!r} is not a comma-separated list of integers") from None
    if out is None:
        out = Path("evals") / f"{load_workflow(workflow).name}-{time.strftime('%Y%m%d-%H%M%S')}"
    reports, comparisons = evaluate_all(
        workflow,
        sources,
        compare_pair=tuple(compare_pair) if compare_pair else None,
        step=step,
        out=out,
        tasks_path=tasks_path,
        samples=samples,
        seed=seed,
        threshold=threshold,
        ks=ks,
        num_tasks=num_tasks,
        greedy=greedy,
        config_path=config_path,
        overrides=overrides,
        progress=progress,
    )
    click.echo(markdown(reports, comparisons))
    click.echo(f"srpo-graph eval: wrote {out / 'eval.json'}, {out / 'eval.md'}, {out / 'eval.png'}")
