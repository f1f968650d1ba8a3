"""Overlapped rollouts (issue 26 item 5), side by side in one run on ONE real SGLang CPU server:

* training step time, synchronous (``rollout.max_staleness=0``) vs k = 1 vs k = 2, on a multi-turn
  workflow with outputs of varied length (``workloads/multiturn_varied.wf``) and on a mixed one
  (``workflows/coord_mixed.wf``: a parallel pair, then a closer);
* rollout wall time of one batch, lockstep vs streaming scheduler, on the same server;
* reward against steps and against wall-clock time for the three modes (mean over seeds, with a
  95% t interval when there are >= 2 seeds), drawn to ``docs/img/async_reward.png``;
* learning (``--learn-seeds``, a second server; ``--learn-only`` runs just this part): the tiny
  model above learns nothing in a few dozen steps, so the same question -- does overlap change
  learning per step? -- is asked where learning is measured: ``workflows/tinymath_routed.wf`` on the
  pre-trained ``tiny-reason`` with the objectives study's budget (benchmarks/study.py: 8 tasks x G =
  8, 2 epochs, lr 1e-4, 40 steps), held-out accuracy (64 held-out problems x 2 samples) every 10
  steps, per mode, each with the configuration's default mismatch correction; the behaviour weight
  (``loss.decoupled_weight``) is compared on ``workflows/tinymath_mixed.wf``, whose sets have K = 2
  (on tinymath_routed every set has one member and the two weights are one). The paired difference
  to each workflow's first mode, seed by seed, with its 95% t interval, the stale gap and the
  weights by set size; drawn to ``docs/img/async_learning.png``, its own section
  (``async-learning``). Each run's record is saved under ``benchmarks/results/async-learning/``
  as it finishes, so an interrupted comparison resumes where it stopped.

Every training run connects to the same server (``rollout.sglang.url``; weights synced through
disk, the fastest route at this size, bench_sync.py) whose weights are put back to the base model
before each run. Writes its section of docs/performance.md and benchmarks/results/async.json.

Usage (the full version, ~1-2 h on 2 free cores)::

    python benchmarks/bench_async.py --seeds 5 --steps 20 --learn-seeds 5

The quick version run for the docs on a loaded machine: ``--seeds 1 --steps 6 --repeats 2``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # tests.support.sglang_servers
from _perfdoc import machine, read_result, write_result, write_section  # noqa: E402

WORKFLOWS = {"multi-turn, varied lengths": HERE / "workloads" / "multiturn_varied.wf",
             "mixed (pair, then closer)": ROOT / "workflows" / "coord_mixed.wf"}
TASKS = HERE / "workloads" / "digits.jsonl"
# two-sided 95% t quantiles by degrees of freedom (n - 1)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t interval (0 with one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, _T95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / len(xs) ** 0.5


def fmt(xs: list[float], digits: int = 2) -> str:
    m, h = interval(xs)
    return f"{m:.{digits}f}" + (f" ± {h:.{digits}f}" if len(xs) > 1 else "")


def client(url: str, model: str):
    from transformers import AutoConfig

    from srpo_graph.backends.sglang import SGLangBackend
    from srpo_graph.models.tiny import load_tokenizer

    return SGLangBackend(
        url, load_tokenizer(model), sync="disk", vocab_size=AutoConfig.from_pretrained(model).vocab_size
    )


def reset(url: str, model: str) -> None:
    """Put the server's weights back to the base model (version 0) before a run."""
    backend = client(url, model)
    try:
        backend.sync_weights(model, 0)
    finally:
        backend.close()


def train_once(wf: Path, url: str, model: str, k: int, seed: int, steps: int, args, root: Path) -> list[dict]:
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.observe.metrics import read_metrics
    from srpo_graph.train.trainer import train

    reset(url, model)
    run = root / f"{wf.stem}-k{k}-s{seed}"
    cfg = load_config(
        None,
        [
            f"steps={steps}",
            f"seed={seed}",
            f"run_dir={json.dumps(str(run))}",
            "rollout.backend=sglang",
            f"rollout.sglang.url={json.dumps(url)}",
            "rollout.sglang.sync=disk",
            "rollout.sglang.update_connected=true",
            f"rollout.sglang.weight_dir={json.dumps(str(root / 'w'))}",
            f"rollout.tasks={json.dumps(str(TASKS))}",
            f"rollout.max_staleness={k}",
            f"rollout.tasks_per_step={args.tasks}",
            f"rollout.samples={args.samples}",
            f"optim.lr={args.lr}",
            "eval.every=0",
            "checkpoint.every=0",
            "checkpoint.keep_last=1",
            "logging.tensorboard=false",
            "logging.progress=false",
            "logging.plots=false",
            "logging.traces_every=0",
            "overwrite=true",
        ],
    )
    train(wf, cfg)
    return read_metrics(run / "metrics.jsonl")


LEARN_WF = "tinymath_routed"
# modes: [workflow/]max_staleness[:decoupled_weight]; the workflow is LEARN_WF unless named. tinymath_routed's
# active sets all have one member, where the two behaviour weights are one weight (docs/algorithm.md), so
# the weight choice is measured on tinymath_mixed (a pair of solvers: sets of K = 2), paired to each other
LEARN_MODES = "0,1:normalized,2:normalized,tinymath_mixed/2:normalized,tinymath_mixed/2:joint"
LEARN_RUNS = HERE / "results" / "async-learning"  # one record per (mode, seed), saved as it finishes: a rerun resumes
# the metrics a learning record keeps per step: reward, clock, staleness, the stale gap, the loss's clip and
# behaviour-weight statistics (overall and by set size, last epoch)
LOGGED = re.compile(
    r"^(step|reward|time/clock|staleness/mean|mismatch/(stale_)?(mean|max)_abs|loss/(epoch2/clip_frac|mismatch_weight_mean|"
    r"is_weight_max|clip_frac|sets_clipped_share|tokens_clipped_share|mismatch_masked_share|"
    r"(is_weight_mean|is_weight_std|is_truncated|events)/k\d+))$"
)
LEARN_MODEL = "tiny-reason"


def learn_once(url: str | None, model: str, mode: str, seed: int, args, root: Path) -> dict:
    """One run of the learning comparison: the objectives study's budget on the mode's workflow,
    sampled on the server at ``url`` (None: transformers in its rollout worker) in ``mode`` (``"0"``
    synchronous, ``"1:joint"`` max_staleness 1 with that ``loss.decoupled_weight``; the mismatch
    correction is the configuration's default: ``tis`` synchronous on SGLang, none synchronous on
    transformers, ``decoupled`` overlapped); its logged rows and held-out accuracy by step."""
    sys.path.insert(0, str(HERE))
    from study import _tasks_of

    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.observe.metrics import read_metrics
    from srpo_graph.train.trainer import train

    wf, k, weight = parse_mode(mode)
    if url is None:  # the rollout worker samples beside the update, so the loop can overlap (every mode alike)
        backend = ["rollout.backend=transformers", "rollout.worker=true"]
    else:
        reset(url, model)
        backend = [
            "rollout.backend=sglang",
            f"rollout.sglang.url={json.dumps(url)}",
            "rollout.sglang.sync=disk",
            "rollout.sglang.update_connected=true",
            f"rollout.sglang.weight_dir={json.dumps(str(root / 'w-learn'))}",
        ]
    run = root / f"learn-{mode_file(mode)}-s{seed}"
    cfg = load_config(
        None,
        [
            f"steps={args.learn_steps}",
            f"seed={seed}",
            f"run_dir={json.dumps(str(run))}",
            *backend,
            f"rollout.max_staleness={k}",
            "rollout.tasks_per_step=8",
            "rollout.samples=8",
            f"rollout.eval_tasks={json.dumps(str(_tasks_of(wf)[1]))}",
            "optim.epochs=2",
            "optim.lr=1e-4",
            "eval.every=10",
            "eval.mode=sampled",
            "eval.samples=2",
            "eval.num_tasks=64",
            "checkpoint.every=0",
            "checkpoint.keep_last=1",
            "logging.tensorboard=false",
            "logging.progress=false",
            "logging.plots=false",
            "logging.traces_every=0",
            "overwrite=true",
            *([f"loss.decoupled_weight={weight}"] if weight else []),
        ],
    )
    summary = train(ROOT / "workflows" / f"{wf}.wf", cfg)
    rows = [{key: v for key, v in r.items() if LOGGED.match(key)} for r in read_metrics(run / "metrics.jsonl")]
    return {"rows": rows, "eval": [[int(s), float(v)] for s, v in summary.eval_rewards],
            "mismatch": cfg.loss.mismatch.value, "decoupled_weight": cfg.loss.decoupled_weight.value}


def base_accuracy(wf: str, seed: int) -> float:
    """Held-out accuracy of the pre-trained model (step 0, the same for every mode), as the study
    measures it: the same 64 problems x 2 samples, in process."""
    sys.path.insert(0, str(HERE))
    from study import PLANS, held_out_accuracy

    return held_out_accuracy(wf, PLANS["learn"], seed)["all"]


def parse_mode(mode: str) -> tuple[str, str, str]:
    """``"tinymath_mixed/2:joint"`` -> (workflow, max_staleness, decoupled_weight); workflow LEARN_WF
    unless named, weight "" unless named."""
    wf, _, rest = mode.rpartition("/")
    k, _, weight = rest.partition(":")
    return wf or LEARN_WF, k, weight


def mode_file(mode: str) -> str:
    wf, k, weight = parse_mode(mode)
    return ("" if wf == LEARN_WF else f"{wf}-") + k + (f"-{weight}" if weight else "")


def mode_name(mode: str) -> str:
    _, k, weight = parse_mode(mode)
    return "synchronous" if k == "0" else f"k = {k}" + (f", {weight}" if weight else "")


def _mean_of(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if key in r]
    return statistics.fmean(xs) if xs else None


def learning_section(learn: dict[str, list[dict]], before: dict | None, backend: str,
                     name: str | None = None) -> tuple[str, dict]:
    """The learning table (held-out accuracy by workflow and mode, the paired difference to the
    workflow's first mode: synchronous, or the first weight), the stale gap and the behaviour weights
    by set size beside it, and its record. ``learn[mode]`` holds the runs of the seeds every mode has
    finished, in seed order (so the differences are paired)."""
    modes = list(learn)
    runs0 = learn[modes[0]]
    steps = sorted({s for r in runs0 for s, _ in r["eval"]})
    last = steps[-1]
    ref = {}  # each workflow's reference mode: its first
    for mode in modes:
        ref.setdefault(parse_mode(mode)[0], mode)

    def at(r: dict, step: int) -> float:
        return dict((s, v) for s, v in r["eval"])[step]

    head = (
        f"| workflow | mode | held-out, step 0 | held-out, step {last} | gain | vs the workflow's first row at step "
        f"{last} (paired) | mean of steps {steps[1]}-{last} vs the first row's (paired) | step time (s) | "
        f"step time / first row's (paired) | wall time to step {last} (min) |"
        "\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines, rec = [], {}
    for mode in modes:
        runs = learn[mode]
        first, final = [at(r, steps[0]) for r in runs], [at(r, last) for r in runs]
        gain = [b - a for a, b in zip(first, final)]
        wf = parse_mode(mode)[0]
        diff = [at(r, last) - at(s, last) for r, s in zip(runs, learn[ref[wf]])]
        # every evaluation after step 0 (the area under the curve): less eval noise than the last one alone
        later = steps[1:]
        diff_mean = [statistics.fmean(at(r, t) for t in later) - statistics.fmean(at(s, t) for t in later)
                     for r, s in zip(runs, learn[ref[wf]])]
        st = [statistics.median(step_times(r["rows"])) for r in runs]
        wall = [r["rows"][-1]["time/clock"] / 60 for r in runs]
        st_ref = [statistics.median(step_times(r["rows"])) for r in learn[ref[wf]]]
        st_ratio = [a / b for a, b in zip(st, st_ref)]
        lines.append(
            f"| {wf} | {mode_name(mode)} | {fmt(first, 3)} | {fmt(final, 3)} | {fmt(gain, 3)} | "
            f"{'-' if mode == ref[wf] else fmt(diff, 3)} | {'-' if mode == ref[wf] else fmt(diff_mean, 3)} | "
            f"{fmt(st)} | {'-' if mode == ref[wf] else fmt(st_ratio)} | "
            f"{fmt(wall)} |"
        )
        rec[mode] = {"seeds": [r["seed"] for r in runs], "mismatch": runs[0]["mismatch"], "first": first,
                     "final": final, "gain": gain, "diff_vs_ref": diff, "diff_mean_vs_ref": diff_mean, "ref": ref[wf],
                     "step_s": st,
                     "step_ratio": st_ratio, "wall_min": wall}
    # the stale gap and the weights: per run the mean over its steps, then mean ± interval over seeds
    sizes = sorted({int(key.rsplit("/k", 1)[1]) for r in runs0 + [x for m in modes for x in learn[m]]
                    for row in r["rows"] for key in row if key.startswith("loss/is_weight_mean/k")})
    whead = ("| workflow | mode | mismatch | staleness | stale gap (nats/token) | behaviour weight mean | "
             "clipped (epoch 2) | "
             + " | ".join(f"K = {k}: weight mean, std, truncated" for k in sizes)
             + " |\n|" + "---|" * (7 + len(sizes)) + "\n")
    wlines = []
    for mode in modes:
        runs = learn[mode]

        def per_run(key: str) -> list[float]:
            return [v for v in (_mean_of(r["rows"], key) for r in runs) if v is not None]

        cells = [parse_mode(mode)[0], mode_name(mode), runs[0]["mismatch"]]
        for key, d in (("staleness/mean", 2), ("mismatch/stale_mean_abs", 3), ("loss/mismatch_weight_mean", 3),
                       ("loss/epoch2/clip_frac", 3)):
            xs = per_run(key)
            cells.append(fmt(xs, d) if xs else "-")
            rec[mode][key] = xs
        for k in sizes:
            m, sd, tr = (per_run(f"loss/{n}/k{k}") for n in ("is_weight_mean", "is_weight_std", "is_truncated"))
            cells.append(f"{fmt(m, 3)}, {fmt(sd, 3)}, {fmt(tr, 3)}" if m else "-")
            rec[mode][f"weight/k{k}"] = {"mean": m, "std": sd, "truncated": tr}
        wlines.append("| " + " | ".join(cells) + " |")
    n = ", ".join(f"{wf} {len(learn[m])}" for wf, m in ref.items())
    minutes = sum(r["minutes"] for m in modes for r in learn[m])
    body = (
        f"### Learning per step: {LEARN_WF} on {LEARN_MODEL}"
        + (" (real SGLang server)" if backend == "sglang" else "")
        + ("" if last == 40 else f", {last} steps")
        + "\n\nThe tiny model of the section above learns nothing "
        f"in a few dozen steps, so learning is compared where it is measured: `workflows/{LEARN_WF}.wf` (every "
        "active set has one member, where `decoupled_weight`'s two choices are one weight)"
        + (" and, for the weight choice, `workflows/tinymath_mixed.wf` (two solvers consumed together: sets of K = 2)"
           if any(wf != LEARN_WF for wf in ref) else "")
        + f", on the pre-trained `{LEARN_MODEL}`, "
        + ("served by a real SGLang CPU server (weights reset to the base model before each run)" if backend == "sglang"
           else "sampled by the transformers backend in its rollout worker (`rollout.worker = true`, in every mode: "
           "the worker samples while the trainer updates, so the loop can overlap)")
        + f", with the objectives study's budget (8 tasks x G = 8 per step, 2 epochs, lr 1e-4, {last} steps), "
        f"held-out accuracy = mean reward of 64 held-out problems x 2 sampled episodes every 10 steps (step 0: the "
        f"pre-trained model, measured once per seed in process, as the study does). Each mode trains with the "
        "configuration's default correction (synchronous: `tis` on SGLang, none on transformers; overlapped: "
        "`decoupled`) and the "
        f"behaviour weight named (`loss.decoupled_weight`). Seeds per mode: {n}, interleaved (seed by seed, every "
        f"mode), mean ± 95% t interval; the paired columns are the per-seed differences to the workflow's first "
        f"row (same seed: same tasks and the same first rollout) of the final held-out accuracy (the measure "
        f"chosen first) and of the mean over every evaluation after step 0 (one held-out evaluation is 128 "
        f"episodes, ± ~0.04 of sampling noise, which the mean over several averages down). "
        f"{minutes:.0f} min of training in all; "
        f"machine: {machine()}, shared.\n\n"
        + head + "\n".join(lines)
        + "\n\nBeside it, per run the mean over its steps, then over seeds: staleness (versions behind), the stale "
        "gap |log π_prox − log μ| on the tokens sampled by an older version (`mismatch/stale_mean_abs`), the "
        "behaviour weight's mean over items (`loss/mismatch_weight_mean`; with `tis` the event weight against the "
        "sampler), the share of tokens clipped in epoch 2, and per set size K the weight's mean, its spread (std "
        "over the step's items) and the share truncated at C = 2 (`loss/is_weight_*/kK`):\n\n"
        + whead + "\n".join(wlines)
        + f"\n\nHeld-out accuracy by step and by wall-clock: `docs/img/{learning_names(name or backend)[1]}`. "
        f"Records: `benchmarks/results/async-learning/{name or backend}/` (one per mode and seed; a rerun resumes). "
        "Command: `python "
        f"benchmarks/bench_async.py --learn-only --learn-seeds {max(len(r) for r in learn.values())} "
        f"--learn-backend {backend}{'' if last == 40 else f' --learn-steps {last}'}"
        f"{'' if set(modes) == set(LEARN_MODES.split(',')) else ' --learn-modes ' + ','.join(modes)}` "
        "(seeds split over processes with `--learn-seed-list`).\n"
    )
    if before:
        body += (
            "\nBefore overlapped rollouts defaulted to `decoupled` (issue 36 item 1), every mode ran SGLang's `tis`: "
            + ", ".join(f"{mode_name(m)} {fmt(v['diff_vs_sync'], 3)}" for m, v in before.items()
                        if m != "0" and "diff_vs_sync" in v)
            + " vs synchronous at the last step (same budget, 5 seeds).\n"
        )
    return body, rec


def run_learning(args, root: Path, modes: list[str]) -> dict[str, list[dict]]:
    """Run (or resume) the learning comparison: seed by seed, every mode, each run's record saved under
    ``LEARN_RUNS`` as it finishes; returns the runs of the seeds every mode has, by mode."""
    from srpo_graph.models.recipes import ensure_recipe_model
    from tests.support.sglang_servers import start_real_server

    runs_dir = LEARN_RUNS / learn_key(args)
    runs_dir.mkdir(parents=True, exist_ok=True)

    def path(mode: str, seed: int) -> Path:
        return runs_dir / f"{mode_file(mode)}-s{seed}.json"

    seeds = ([int(x) for x in args.learn_seed_list.split(",")] if args.learn_seed_list
             else list(range(args.learn_first_seed, args.learn_seeds)))
    todo = [] if args.learn_report else [(s, m) for s in seeds for m in modes if not path(m, s).exists()]
    if todo:
        reason = str(ensure_recipe_model(LEARN_MODEL))
        server = start_real_server(reason, root) if args.learn_backend == "sglang" else None
        t0 = time.perf_counter()
        try:
            for seed, mode in todo:
                if path(mode, seed).exists():  # another process saved it meanwhile (--learn-first-seed)
                    continue
                wf = parse_mode(mode)[0]
                base_path = LEARN_RUNS / (f"base-s{seed}.json" if wf == LEARN_WF else f"{wf}-base-s{seed}.json")
                if not base_path.exists():
                    base_path.write_text(json.dumps({"seed": seed, "accuracy": base_accuracy(wf, seed)}) + "\n")
                base = json.loads(base_path.read_text())["accuracy"]
                print(f"learn: seed {seed} {mode} ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
                t = time.perf_counter()
                got = learn_once(server.url if server else None, reason, mode, seed, args, root)
                got.update(seed=seed, mode=mode, minutes=(time.perf_counter() - t) / 60, eval=[[0, base], *got["eval"]])
                path(mode, seed).write_text(json.dumps(got) + "\n")
        finally:
            if server:
                server.stop()
    # per workflow, the seeds every one of its modes has finished (so its differences are paired)
    done = {m: [s for s in range(args.learn_seeds)
                if all(path(x, s).exists() for x in modes if parse_mode(x)[0] == parse_mode(m)[0])] for m in modes}
    return {m: [json.loads(path(m, s).read_text()) for s in done[m]] for m in modes if done[m]}


def learn_key(args) -> str:
    """The name of a learning comparison: its backend, and its length where that is not the default
    (``sglang``, ``sglang-60steps``): its records' folder, section, plot and summary are named by it."""
    return args.learn_backend + ("" if args.learn_steps == 40 else f"-{args.learn_steps}steps")


def learning_names(key: str) -> tuple[str, str, str]:
    """Where learning comparison ``key`` goes: its docs/performance.md section, its plot and its
    record (one each per backend and length, side by side: the transformers one first, named as before)."""
    if key == "transformers":
        return "async-learning", "async_learning.png", "async_learning"
    return f"async-learning-{key}", f"async_learning_{key}.png", f"async_learning_{key.replace('-', '_')}"


def write_learning(learn: dict[str, list[dict]], backend: str, key: str) -> None:
    """The learning section of docs/performance.md, its plot and its summary record."""
    section, image, result = learning_names(key)
    # the rows measured before the decoupled default (every mode on SGLang's tis), kept beside the new ones
    before = (read_result("async") or {}).get("learning") or (read_result("async_learning") or {}).get("before_tis")
    body, rec = learning_section(learn, {m.removeprefix("k"): v for m, v in before.items()} if before else None,
                                 backend, key)
    plot_learning(learn, ROOT / "docs" / "img" / image)
    # beside its backend's default-length section (the transformers one first)
    write_section(section, body, after=learning_names(backend)[0] if key != backend else "async-learning")
    write_result(result, {"backend": backend, "modes": rec, "before_tis": before})
    print(body)


def plot_learning(learn: dict[str, list[dict]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for mode, runs in learn.items():
        steps = [s for s, _ in runs[0]["eval"]]
        acc = [[dict((s, v) for s, v in r["eval"])[s] for r in runs] for s in steps]
        mean = [interval(a)[0] for a in acc]
        half = [interval(a)[1] for a in acc]
        wf = parse_mode(mode)[0]
        label = mode_name(mode) if wf == LEARN_WF else f"{wf}: {mode_name(mode)}"
        axes[0].errorbar(steps, mean, yerr=half, label=label, capsize=3)
        clock = [
            statistics.fmean(
                next(
                    (x["time/clock"] for x in r["rows"] if x.get("step") == s),
                    r["rows"][max(0, min(s, len(r["rows"])) - 1)]["time/clock"] if s else 0.0,
                )
                for r in runs
            )
            for s in steps
        ]
        axes[1].plot(clock, mean, marker="o", label=label)
    axes[0].set(title="held-out accuracy by step", xlabel="step", ylabel="held-out accuracy")
    axes[1].set(title="by wall-clock", xlabel="seconds", ylabel="held-out accuracy")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def rollout_once(wf_path: Path, url: str, model: str, scheduler: str, seed: int, args) -> float:
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(wf_path)
    tasks = load_tasks(TASKS, wf)[: args.tasks]
    backend = client(url, model)
    try:
        t0 = time.perf_counter()
        run(wf, tasks, {p.name: backend for p in wf.policies}, samples=args.samples, seed=seed, scheduler=scheduler)
        return time.perf_counter() - t0
    finally:
        backend.close()


def step_times(rows: list[dict]) -> list[float]:
    """Wall seconds per step from the loop's clock, the first step (start-up, first batch) left out."""
    clock = [r["time/clock"] for r in rows]
    return [b - a for a, b in zip(clock, clock[1:])]


def plot(curves: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(curves), 2, figsize=(10, 3.4 * len(curves)), squeeze=False)
    for row, (name, modes) in enumerate(curves.items()):
        for k, runs in modes.items():
            n = min(len(r) for r in runs)
            steps = list(range(1, n + 1))
            reward = [statistics.fmean(r[i]["reward"] for r in runs) for i in range(n)]
            clock = [statistics.fmean(r[i]["time/clock"] for r in runs) for i in range(n)]
            label = "synchronous" if k == 0 else f"k = {k}"
            axes[row][0].plot(steps, reward, label=label)
            axes[row][1].plot(clock, reward, label=label)
        axes[row][0].set(title=f"{name}: reward by step", xlabel="step", ylabel="reward")
        axes[row][1].set(title=f"{name}: reward by wall-clock", xlabel="seconds", ylabel="reward")
        axes[row][0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="0,1,2", help="max_staleness values")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per step")
    ap.add_argument("--samples", type=int, default=4, help="G")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--repeats", type=int, default=3, help="lockstep/streaming rollouts per workflow")
    ap.add_argument("--note", default="", help="a line on the conditions (e.g. a loaded machine)")
    ap.add_argument("--learn-seeds", type=int, default=5, help="seeds of the learning comparison (0: skip it)")
    ap.add_argument("--learn-steps", type=int, default=40)
    ap.add_argument("--learn-modes", default=LEARN_MODES, help="max_staleness[:decoupled_weight], comma-separated")
    ap.add_argument("--learn-only", action="store_true", help="only the learning comparison (resumes its records)")
    ap.add_argument("--learn-backend", choices=("sglang", "transformers"), default="sglang",
                    help="where the learning runs sample: a real SGLang CPU server, or transformers' rollout worker")
    ap.add_argument("--learn-seed-list", default="", help="these learning seeds (comma-separated), in this order")
    ap.add_argument("--learn-report", action="store_true", help="run nothing: write the section from the records")
    ap.add_argument("--learn-first-seed", type=int, default=0,
                    help="run the learning seeds from this one on (a second process beside a first)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    learn_modes = args.learn_modes.split(",")
    if args.learn_only:
        with tempfile.TemporaryDirectory() as tmp:
            write_learning(run_learning(args, Path(tmp), learn_modes), args.learn_backend, learn_key(args))
        return
    from srpo_graph.models.tiny import ensure_tiny_model
    from tests.support.sglang_servers import start_real_server

    modes = [int(x) for x in args.modes.split(",")]
    model = str(ensure_tiny_model())
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = start_real_server(model, root)
        try:
            sched: dict[str, dict[str, list[float]]] = {}
            for name, wf in WORKFLOWS.items():
                reset(server.url, model)
                rollout_once(wf, server.url, model, "streaming", 999, args)  # warm-up
                sched[name] = {"lockstep": [], "streaming": []}
                print(f"rollouts: {name}", flush=True)
                for i in range(args.repeats):
                    for mode in ("lockstep", "streaming"):
                        sched[name][mode].append(rollout_once(wf, server.url, model, mode, 1000 + i, args))
            runs: dict[str, dict[int, list[list[dict]]]] = {}
            for name, wf in WORKFLOWS.items():
                runs[name] = {k: [] for k in modes}
                for seed in range(args.seeds):
                    for k in modes:  # interleaved, so a change of load hits every mode alike
                        print(
                            f"train: {name} seed {seed} k={k} ({(time.perf_counter() - t_start) / 60:.1f} min)",
                            flush=True,
                        )
                        runs[name][k].append(train_once(wf, server.url, model, k, seed, args.steps, args, root))
        finally:
            server.stop()
        if args.learn_seeds:
            write_learning(run_learning(args, root, learn_modes), args.learn_backend, learn_key(args))
    total = time.perf_counter() - t_start
    plot(runs, ROOT / "docs" / "img" / "async_reward.png")
    head = (
        "| workflow | mode | step time (s) | speed-up vs sync | trainer waits for rollout (s/step) | "
        "update + sync (s/step) | staleness mean | reward, last half of steps |\n|---|---|---|---|---|---|---|---|\n"
    )
    lines, result = [], {}
    for name, modes_runs in runs.items():
        base = statistics.fmean(statistics.median(step_times(r)) for r in modes_runs[modes[0]])
        for k, rs in modes_runs.items():
            st = [statistics.median(step_times(r)) for r in rs]
            wait = [statistics.fmean(x["time/rollout_wait"] for x in r[1:]) for r in rs]
            upd = [
                statistics.fmean(
                    x.get("time/update", 0)
                    + x.get("time/sync", 0)
                    + x.get("time/old_logprobs", 0)
                    + x.get("time/compile", 0)
                    for x in r[1:]
                )
                for r in rs
            ]
            stale = [statistics.fmean(x.get("staleness/mean", 0) for x in r) for r in rs]
            late = [statistics.fmean(x["reward"] for x in r[len(r) // 2 :]) for r in rs]
            mode = "synchronous" if k == 0 else f"k = {k}"
            lines.append(
                f"| {name} | {mode} | {fmt(st)} | {base / statistics.fmean(st):.2f}x | {fmt(wait)} | "
                f"{fmt(upd, 3)} | {fmt(stale)} | {fmt(late)} |"
            )
            result[f"{name}/k{k}"] = {
                "step_s": st,
                "wait_s": wait,
                "update_s": upd,
                "staleness": stale,
                "reward_late": late,
            }
    sched_lines = []
    for name, d in sched.items():
        lo, st = d["lockstep"], d["streaming"]
        sched_lines.append(f"| {name} | {fmt(lo)} | {fmt(st)} | {statistics.fmean(lo) / statistics.fmean(st):.2f}x |")
        result[f"{name}/rollout"] = d
    body = (
        f"One real SGLang CPU server (tiny model), every run connected to it (weights reset to the base "
        f"model before each). {args.seeds} seed(s) x {args.steps} steps per mode, {args.tasks} tasks x G = "
        f"{args.samples} per step; step time = median seconds between consecutive steps (the loop's "
        f"`time/clock`, first step left out), then mean over seeds"
        f"{' ± a 95% t interval' if args.seeds > 1 else ''}. Machine: {machine()}; the whole run took "
        f"{total / 60:.1f} min. {args.note}\n\n"
        + head
        + "\n".join(lines)
        + f"\n\nRollout wall time of one batch ({args.tasks} tasks x G = {args.samples}, base weights), "
        f"{args.repeats} repeat(s) each, alternating:\n\n| workflow | lockstep (s) | streaming (s) | speed-up |\n"
        "|---|---|---|---|\n"
        + "\n".join(sched_lines)
        + "\n\nReward by step and by wall-clock: `docs/img/async_reward.png`. Command: `python "
        f"benchmarks/bench_async.py --seeds {args.seeds} --steps {args.steps} --repeats {args.repeats} "
        f"--learn-seeds {args.learn_seeds} --learn-steps {args.learn_steps}`.\n"
    )
    write_section(
        "async", "## Overlapped rollouts: synchronous vs k = 1 vs k = 2 (benchmarks/bench_async.py)\n\n" + body
    )
    write_result("async", {"seeds": args.seeds, "steps": args.steps, "minutes": total / 60, **result})
    print(body)


if __name__ == "__main__":
    main()
