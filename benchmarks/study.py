"""The objectives study: objectives x workflows x seeds on the locally pre-trained model, with statistics.

Run: ``python benchmarks/study.py [--quick | --smoke | --plan NAME] [--seeds N] [--runs-dir DIR] [--out docs/results.md]``.

A results benchmark, not a test (``.ci/run`` runs ``--quick``; the test suite runs ``--smoke`` on a
shrunken model). Every run trains one CPU workflow of
``workflows/tinymath_*.wf`` / ``tinysearch.wf`` (policy ``tiny-reason``, pre-trained locally by
``srpo-graph init-model --recipe tiny-reason``) under one objective (a row of
``srpo_graph.srpo.objectives.OBJECTIVES``, selected with the trainer's ``objective=NAME``; nothing
else differs: same steps, batch, lr, clip, seeds) and records:

* held-out accuracy (the headline): the mean reward of sampled episodes on the workflow's
  ``*_eval.jsonl`` tasks (problems neither pre-training nor RL saw), at step 0 (the pre-trained
  model, measured once per workflow and seed) and every ``eval_every`` steps;
* the train reward per step, and diagnostics by set size from the loss (clip fraction upper/lower,
  log-ratio mean and |max|), the grad-norm coefficient of variation over the run, and on the
  routed workflow the share of episodes the router sends to each specialist or skips.

Each run's record is one JSON file under ``--runs-dir`` (``<workflow>/<objective>/seed<k>.json``),
written when the run ends: an interrupted study resumes where it stopped (``--fresh`` reruns).
The analysis reports, per (workflow, objective): mean final held-out accuracy over seeds with a
95% t-interval, and for every objective a paired bootstrap of its difference to ``srpo`` (same
seeds, so same initial sampling and task order), then writes ``docs/results.md`` and the plots.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-reason"
PLACEHOLDER = "<!-- study sections: written by benchmarks/study.py -->"


@dataclass(frozen=True)
class Plan:
    """One study's budget: the same for every objective."""

    name: str
    workflows: tuple[str, ...]
    objectives: tuple[str, ...]
    seeds: int
    steps: int
    tasks_per_step: int = 8
    samples: int = 4          # G, episodes per task (the group)
    epochs: int = 2
    lr: float = 3e-4  # Note [One learning rate]
    eval_every: int = 10
    eval_tasks: int = 64      # held-out tasks per evaluation
    eval_samples: int = 2     # sampled episodes per held-out task
    coord_steps: int = 60     # steps on the tiny model's coord_par* workflows (one-token members, ~0.1 s a step)

    def key(self) -> str:
        """What a saved run must match to be reused (everything but the lists of cells)."""
        from srpo_graph.backends.recipes import RECIPES

        d = asdict(self)
        for k in ("name", "workflows", "objectives", "seeds"):
            d.pop(k)
        d["model"] = f"{MODEL}-v{RECIPES[MODEL].version}"  # a rebuilt (other-version) model invalidates every record
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


ALL_WORKFLOWS = ("tinymath_pipeline", "tinymath_mixed", "tinymath_routed", "tinysearch")
ALL_OBJECTIVES = ("srpo", "srpo_sum", "srpo_mean", "independent", "grpo", "gspo", "dr_mas")
PLANS = {
    # the full study (~2 h on 2 shared CPU cores; run it in the background, it resumes)
    "full": Plan("full", ALL_WORKFLOWS + ("coord_par2", "coord_par3", "coord_par4", "coord_par5"), ALL_OBJECTIVES,
                 seeds=5, steps=30),
    # the objectives on the mixed workflow alone (set sizes 2 and 1, where alpha matters): 7 x 5 seeds, ~30 min
    "mixed": Plan("mixed", ("tinymath_mixed",), ALL_OBJECTIVES, seeds=5, steps=20),
    # the objectives on the routed workflow, the one that learns within 30 steps (every set has size 1): ~18 min
    "routed": Plan("routed", ("tinymath_routed",), ALL_OBJECTIVES, seeds=5, steps=30),
    # a parallel coordination task on the (untrained) tiny model, one set of K = 2 per episode, at the
    # trainer's default lr (1e-3, as benchmarks/bench_objectives.py; the same for every objective): ~12 min
    "coord": Plan("coord", ("coord_par2",), ALL_OBJECTIVES, seeds=5, steps=60, lr=1e-3, tasks_per_step=8,
                  samples=8),
    # do the pipeline and the mixed workflow learn given more steps? SRPO alone, 2 seeds, 80 steps (~12 min)
    "long": Plan("long", ("tinymath_pipeline", "tinymath_mixed"), ("srpo",), seeds=2, steps=80, eval_every=20),
    # small (<= 5 min here once the model is built; CI runs it): the mixed workflow, three objectives, 2 seeds
    "quick": Plan("quick", ("tinymath_mixed",), ("srpo", "srpo_mean", "grpo"), seeds=2,
                  steps=8, eval_every=4, eval_tasks=32, tasks_per_step=6),
    # does RL help at all? SRPO alone on the three math workflows, 3 seeds, longer runs
    "learn": Plan("learn", ("tinymath_routed", "tinymath_mixed", "tinymath_pipeline"), ("srpo",), seeds=3, steps=30),
    # CI: every code path once (two objectives, one workflow, 2 seeds, 2 steps)
    "smoke": Plan("smoke", ("tinymath_mixed",), ("srpo", "grpo"), seeds=2, steps=2, tasks_per_step=2, samples=2,
                  epochs=1, eval_every=2, eval_tasks=4, eval_samples=1),
}

# Note [One learning rate]. lr = 3e-4 for every objective and workflow. It was picked once, before
# any study run, from 20-40-step probes on seed 0: at 1e-3 (the trainer's default) SRPO *lost*
# accuracy on the pipeline (0.28 -> 0.12 in 10 steps, the policy drifting off its pre-trained
# solution format); at 1e-4 and 3e-4 neither SRPO nor GRPO lost any, and 3e-4 moved the routed
# workflow (0.14 -> 0.35 under SRPO). The probes used `srpo` and `grpo` alike; no other objective
# was tried and nothing else was tuned.

# two-sided 95% t critical values, df = 1..30 (df > 30: 1.96)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


# --------------------------------------------------------------------------- statistics


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (nan with one value).

    >>> [round(v, 4) for v in mean_ci([0.2, 0.4])]
    [0.3, 1.2706]
    """
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    t = T975[len(xs) - 2] if len(xs) - 1 <= len(T975) else 1.96
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def paired_bootstrap(a: list[float], b: list[float], n: int = 10_000, seed: int = 0) -> tuple[float, float, float, float]:
    """Mean of ``a - b`` over paired seeds, its bootstrap 95% interval and a two-sided p-value.

    >>> d, lo, hi, p = paired_bootstrap([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])
    >>> round(d, 3), lo > 0, p < 0.05
    (0.4, True, True)
    """
    diffs = [x - y for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    d = sum(diffs) / len(diffs)
    lo, hi = means[int(0.025 * n)], means[int(0.975 * n) - 1]
    below = sum(m <= 0 for m in means) / n
    above = sum(m >= 0 for m in means) / n
    return d, lo, hi, min(1.0, 2 * min(below, above))


# --------------------------------------------------------------------------- one run


def _tasks_of(workflow: str) -> tuple[Path, Path]:
    stem = workflow.split("_")[0]  # tinymath_*, tinysearch, coord_par* (the tiny model's toy tasks)
    return ROOT / "workflows" / "tasks" / f"{stem}.jsonl", ROOT / "workflows" / "tasks" / f"{stem}_eval.jsonl"


def held_out_accuracy(workflow: str, plan: Plan, seed: int) -> dict[str, float]:
    """Held-out accuracy of the workflow's untrained policies (sampled, as declared): overall and per family."""
    from srpo_graph.backends import load_backend, resolve_model
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(ROOT / "workflows" / f"{workflow}.wf")
    tasks = load_tasks(_tasks_of(workflow)[1], wf)[: plan.eval_tasks]
    backends = {p.name: load_backend("transformers", resolve_model(p.model), device="cpu") for p in wf.policies}
    # the trainer's eval seed rule for step 0 (config.seed * 7919 + step)
    res = run(wf, tasks, backends, samples=plan.eval_samples, seed=seed * 7919)
    family = {t.id: str(t.fields.get("family") or t.fields.get("kind") or "all") for t in tasks}
    by: dict[str, list[float]] = defaultdict(list)
    for ep in res.episodes:
        by["all"].append(ep.reward)
        by[family[ep.task_id]].append(ep.reward)
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


def _route_shares(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per saved trace step: the share of episodes whose router chose each label."""
    out = {}
    for f in sorted((run_dir / "traces").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1])):
        c: Counter = Counter()
        for line in f.read_text(encoding="utf-8").splitlines():
            ep = json.loads(line)
            picks = [o.get("value") for o in ep["outputs"] if o["agent"] == "router"]
            c[str(picks[0]) if picks else "none"] += 1
        n = sum(c.values())
        out[f.stem.split("_")[1]] = {k: v / n for k, v in sorted(c.items())}
    return out


def run_one(workflow: str, objective: str, seed: int, plan: Plan, runs_dir: Path) -> dict:
    """Train one cell and return its record (also what is saved as JSON)."""
    from srpo_graph.train.config import load_config
    from srpo_graph.train.metrics import read_metrics
    from srpo_graph.train.trainer import train

    with tempfile.TemporaryDirectory(prefix="study-", dir=runs_dir) as tmp:
        cfg = load_config(None, [
            f"objective={objective}", f"steps={plan.coord_steps if workflow.startswith('coord') else plan.steps}", f"seed={seed}", f"run_dir={tmp}/run", "overwrite=true",
            f"rollout.tasks_per_step={plan.tasks_per_step}", f"rollout.samples={plan.samples}", "rollout.device=cpu",
            f"rollout.eval_tasks={_tasks_of(workflow)[1]}", f"optim.epochs={plan.epochs}", f"optim.lr={plan.lr}",
            f"eval.every={plan.eval_every}", "eval.mode=sampled", f"eval.samples={plan.eval_samples}",
            f"eval.num_tasks={plan.eval_tasks}", "checkpoint.every=0", "logging.progress=false",
            "logging.tensorboard=false", "logging.plots=false",
            f"logging.traces_every={plan.eval_every if workflow.endswith('routed') else 0}",
        ])
        t0 = time.perf_counter()
        summary = train(ROOT / "workflows" / f"{workflow}.wf", cfg)
        seconds = time.perf_counter() - t0
        rows = read_metrics(Path(summary.run_dir) / "metrics.jsonl")
        routes = _route_shares(Path(summary.run_dir)) if workflow.endswith("routed") else {}
    diag_keys = sorted({k for r in rows for k in r if k.startswith("loss/") and re.search(r"/k\d+$", k)})
    # grad_norm is logged per policy (flattened to grad_norm/<policy>); steps without an update have none
    grad = [float(v) for r in rows for k, v in r.items() if k.startswith("grad_norm/") and isinstance(v, (int, float))]
    return {
        "workflow": workflow, "objective": objective, "seed": seed, "plan": plan.key(), "seconds": seconds,
        "reward": [r.get("reward") for r in rows],
        "eval": [[int(s), float(v)] for s, v in summary.eval_rewards],
        "grad_norm": grad,
        "grad_norm_cv": statistics.pstdev(grad) / statistics.mean(grad) if len(grad) > 1 and statistics.mean(grad) else None,
        "diagnostics": {k: statistics.mean(float(r[k]) for r in rows if k in r) for k in diag_keys},
        "events_per_episode": statistics.mean(r["events"] / r["episodes"] for r in rows if r.get("episodes")),
        "routes": routes,
    }


# --------------------------------------------------------------------------- the study


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)  # atomic: a killed study leaves whole records only


def _load(path: Path, plan: Plan) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if data.get("plan") == plan.key() else None


def run_study(plan: Plan, runs_dir: Path, *, fresh: bool = False, log=print) -> dict:
    """Run (or resume) every cell of ``plan``; returns {"start": ..., "runs": [...], "model": ...}."""
    import torch

    from srpo_graph.backends.recipes import ensure_recipe_model, recipe_info

    torch.set_num_threads(1)
    runs_dir.mkdir(parents=True, exist_ok=True)
    model_dir = str(ensure_recipe_model(MODEL, log=log))
    start, runs = {}, []
    for wf in plan.workflows:
        for seed in range(plan.seeds):
            path = runs_dir / wf / f"start-seed{seed}.json"
            rec = None if fresh else _load(path, plan)
            if rec is None:
                rec = {"plan": plan.key(), "accuracy": held_out_accuracy(wf, plan, seed)}
                _save(path, rec)
            start[(wf, seed)] = rec["accuracy"]
        log(f"{wf}: held-out accuracy before RL {statistics.mean(start[(wf, s)]['all'] for s in range(plan.seeds)):.3f}")
    # seed outer, objective inner: machine load drifts over hours and should hit all objectives alike
    for seed in range(plan.seeds):
        for wf in plan.workflows:
            for obj in plan.objectives:
                path = runs_dir / wf / obj / f"seed{seed}.json"
                rec = None if fresh else _load(path, plan)
                if rec is None:
                    rec = run_one(wf, obj, seed, plan, runs_dir)
                    _save(path, rec)
                    log(f"seed {seed} {wf:18s} {obj:12s} held-out {start[(wf, seed)]['all']:.3f} -> "
                        f"{rec['eval'][-1][1]:.3f}  ({rec['seconds']:.0f} s)")
                runs.append(rec)
    return {"start": {f"{wf}/{s}": v for (wf, s), v in start.items()}, "runs": runs, "model": recipe_info(model_dir)}


def final_accuracy(rec: dict) -> float:
    """The headline per run: the mean of the last two held-out evaluations (one if there is one)."""
    tail = [v for _, v in rec["eval"][-2:]]
    return sum(tail) / len(tail)


def analyze(plan: Plan, data: dict) -> list[dict]:
    """One row per (workflow, objective): accuracy mean and CI, paired bootstrap vs srpo, diagnostics."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in data["runs"]:
        cells[(r["workflow"], r["objective"])].append(r)
    rows = []
    for wf in plan.workflows:
        base = sorted(cells.get((wf, "srpo"), []), key=lambda r: r["seed"])
        start = [data["start"][f"{wf}/{s}"]["all"] for s in range(plan.seeds)]
        for obj in plan.objectives:
            rs = sorted(cells.get((wf, obj), []), key=lambda r: r["seed"])
            if not rs:
                continue
            acc = [final_accuracy(r) for r in rs]
            gain = [a - s for a, s in zip(acc, start)]
            m, ci = mean_ci(acc)
            gm, gci = mean_ci(gain)
            row = {"workflow": wf, "objective": obj, "seeds": len(rs), "start": statistics.mean(start), "acc": m,
                   "acc_ci": ci, "gain": gm, "gain_ci": gci, "per_seed": acc,
                   "grad_cv": statistics.mean(r["grad_norm_cv"] for r in rs if r["grad_norm_cv"] is not None)
                   if any(r["grad_norm_cv"] is not None for r in rs) else None,
                   "diag": {k: statistics.mean(r["diagnostics"][k] for r in rs if k in r["diagnostics"])
                            for k in sorted({k for r in rs for k in r["diagnostics"]})},
                   "events_per_episode": statistics.mean(r["events_per_episode"] for r in rs),
                   "seconds": statistics.mean(r["seconds"] for r in rs)}
            if obj != "srpo" and len(base) == len(rs):
                row["vs_srpo"] = paired_bootstrap(acc, [final_accuracy(r) for r in base])
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- plots + doc


def plot(plan: Plan, data: dict, rows: list[dict], img_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    curves = img_dir / f"study_{plan.name}_curves.png"
    n = len(plan.workflows)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4), squeeze=False)
    for ax, wf in zip(axes[0], plan.workflows):
        start = statistics.mean(data["start"][f"{wf}/{s}"]["all"] for s in range(plan.seeds))
        for obj in plan.objectives:
            rs = [r for r in data["runs"] if r["workflow"] == wf and r["objective"] == obj]
            if not rs:
                continue
            steps = [0] + [s for s, _ in rs[0]["eval"]]
            ys = [[data["start"][f"{wf}/{r['seed']}"]["all"]] + [v for _, v in r["eval"]] for r in rs]
            mean = [statistics.mean(c) for c in zip(*ys)]
            sd = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in zip(*ys)]
            (line,) = ax.plot(steps, mean, marker="o", lw=1.6, label=obj)
            ax.fill_between(steps, [a - b for a, b in zip(mean, sd)], [a + b for a, b in zip(mean, sd)],
                            color=line.get_color(), alpha=0.15)
        ax.axhline(start, color="grey", ls=":", lw=1)
        ax.set_title(wf)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy (sampled)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{plan.name} study: mean over {plan.seeds} seeds, band = ±1 sd over seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(curves, dpi=110)
    plt.close(fig)

    bars = img_dir / f"study_{plan.name}_bars.png"
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * len(rows), 3.8))
    xs = list(range(len(rows)))
    ax.bar(xs, [r["acc"] for r in rows], yerr=[0 if math.isnan(r["acc_ci"]) else r["acc_ci"] for r in rows],
           color=[f"C{plan.objectives.index(r['objective'])}" for r in rows], capsize=3)
    ax.scatter(xs, [r["start"] for r in rows], marker="_", s=300, color="black", label="before RL", zorder=3)
    ax.set_xticks(xs, [f"{r['workflow'].removeprefix('tinymath_')}\n{r['objective']}" for r in rows], fontsize=7)
    ax.set_ylabel("final held-out accuracy (95% CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(bars, dpi=110)
    plt.close(fig)
    return [curves, bars]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def write_doc(plan: Plan, data: dict, rows: list[dict], images: list[Path], out: Path, total_s: float,
              command: str) -> None:
    """The study's section of docs/results.md (everything between the study markers is replaced)."""
    model = data["model"]
    coord_only = all(wf.startswith("coord") for wf in plan.workflows)
    lines = [
        f"<!-- study:{plan.name} -->",
        f"## The {plan.name} study (`{command}`)",
        "",
        (f"Model `{MODEL}`: {model['parameters']:,} parameters, pre-trained locally in {model['build_seconds']} s "
         f"({model['steps']} SFT steps, final loss {model['final_loss']:.3f}). " if not coord_only else
         "Model `tiny` (134k parameters, random weights from a seed: the coordination tasks' model). ") +
        f"Budget, the same for every objective: {plan.coord_steps if coord_only else plan.steps} steps of {plan.tasks_per_step} tasks x {plan.samples} samples, {plan.epochs} epochs, AdamW lr "
        f"{plan.lr}, clip 0.2, seeds 0..{plan.seeds - 1}; only `objective=NAME` differs. Held-out accuracy: "
        f"{plan.eval_tasks} held-out tasks x {plan.eval_samples} sampled episodes, every {plan.eval_every} steps; "
        f"*final* = mean of the last two evaluations. Machine: {platform.machine()}, {platform.python_version()}, "
        f"1 torch thread on a 2-core machine shared with other jobs; training time summed over the "
        f"{len(data['runs'])} runs {sum(r['seconds'] for r in data['runs']) / 60:.1f} min (this invocation "
        f"{total_s / 60:.1f} min; runs saved earlier are reused).",
        "",
        "| workflow | objective | before RL | final held-out acc. (95% CI) | gain | per seed | vs `srpo`: diff [95% CI], p | grad-norm CV |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = "-"
        if "vs_srpo" in r:
            d, lo, hi, p = r["vs_srpo"]
            vs = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}], p={p:.2f}"
        lines.append(f"| {r['workflow']} | `{r['objective']}` | {_fmt(r['start'])} | {_fmt(r['acc'])} ± "
                     f"{_fmt(r['acc_ci'])} | {r['gain']:+.3f} | {', '.join(_fmt(a, 2) for a in r['per_seed'])} | "
                     f"{vs} | {_fmt(r['grad_cv'], 2)} |")
    lines += ["", "Diagnostics by set size (means over steps and seeds; `k` = set size):", "",
              "| workflow | objective | clip upper k1 / kK | clip lower k1 / kK | log-ratio mean k1 / kK | events per episode |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        d = r["diag"]
        ks = sorted({int(m.group(1)) for k in d if (m := re.search(r"/k(\d+)$", k))})
        kk = ks[-1] if ks else 1

        def pair(stem: str) -> str:
            a, b = d.get(f"loss/{stem}/k1"), d.get(f"loss/{stem}/k{kk}")
            return f"{_fmt(a)} / {_fmt(b)}" if kk != 1 else _fmt(a)

        lines.append(f"| {r['workflow']} | `{r['objective']}` | {pair('clip_upper')} | {pair('clip_lower')} | "
                     f"{pair('log_ratio_mean')} | {r['events_per_episode']:.2f} |")
    routed = [r for r in data["runs"] if r["routes"]]
    if routed:
        lines += ["", "Routed workflow, share of episodes per router choice (first and last saved step, mean over seeds):", ""]
        for obj in plan.objectives:
            rs = [r for r in routed if r["objective"] == obj]
            if rs:
                first = {k: statistics.mean(r["routes"][min(r["routes"], key=int)].get(k, 0) for r in rs) for k in ("quick", "careful", "skip")}
                last = {k: statistics.mean(r["routes"][max(r["routes"], key=int)].get(k, 0) for r in rs) for k in ("quick", "careful", "skip")}
                lines.append(f"- `{obj}`: " + ", ".join(f"{k} {first[k]:.2f} -> {last[k]:.2f}" for k in first))
    lines += ["", "Held-out accuracy before RL by task family (mean over seeds):", ""]
    for wf in plan.workflows:
        fams = data["start"][f"{wf}/0"].keys()
        lines.append(f"- {wf}: " + ", ".join(
            f"{f} {statistics.mean(data['start'][f'{wf}/{s}'][f] for s in range(plan.seeds)):.3f}" for f in fams))
    lines += [""] + [f"![{p.stem}](img/{p.name})" for p in images] + ["", f"<!-- end study:{plan.name} -->", ""]
    section = "\n".join(lines)
    text = out.read_text(encoding="utf-8") if out.exists() else "# Results\n\n"
    begin, end = f"<!-- study:{plan.name} -->", f"<!-- end study:{plan.name} -->\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end):]
    elif PLACEHOLDER in text:  # new sections go where the page keeps them, in the order they were first run
        text = text.replace(PLACEHOLDER, PLACEHOLDER + "\n\n" + section.rstrip("\n"), 1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    out.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="a small study: the mixed workflow x 3 objectives x 2 seeds x 8 "
                   "steps (<= 5 min here once the model is built)")
    g.add_argument("--smoke", action="store_true", help="every code path once, for the test suite (~1 min)")
    g.add_argument("--plan", choices=sorted(PLANS), help="a named plan (full, mixed, routed, coord, long, learn, quick, smoke)")
    ap.add_argument("--seeds", type=int, help="override the plan's number of seeds")
    ap.add_argument("--steps", type=int, help="override the plan's steps per run")
    ap.add_argument("--runs-dir", type=Path, help="where per-run records go (default runs/study-<plan>)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md", help="the results page to update")
    ap.add_argument("--fresh", action="store_true", help="ignore saved runs and rerun every cell")
    args = ap.parse_args(argv)
    plan = PLANS[args.plan or ("quick" if args.quick else "smoke" if args.smoke else "full")]
    if args.seeds:
        plan = replace(plan, seeds=args.seeds)
    if args.steps:
        plan = replace(plan, steps=args.steps)
    runs_dir = args.runs_dir or ROOT / "runs" / f"study-{plan.name}"
    t0 = time.perf_counter()
    data = run_study(plan, runs_dir, fresh=args.fresh)
    total = time.perf_counter() - t0
    rows = analyze(plan, data)
    images = plot(plan, data, rows, args.out.parent / "img")
    _save(runs_dir / "summary.json", {"plan": asdict(plan), "rows": rows, "start": data["start"], "seconds": total})
    command = "python benchmarks/study.py" + {"full": "", "quick": " --quick", "smoke": " --smoke"}.get(
        plan.name, f" --plan {plan.name}") + (f" --seeds {args.seeds}" if args.seeds else "") + (
        f" --steps {args.steps}" if args.steps else "")
    write_doc(plan, data, rows, images, args.out, total, command)
    for r in rows:
        print(f"{r['workflow']:18s} {r['objective']:12s} {r['start']:.3f} -> {r['acc']:.3f} ± {_fmt(r['acc_ci'])}")
    print(f"wrote {args.out} ({total / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
