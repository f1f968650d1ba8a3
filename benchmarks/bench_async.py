"""Overlapped rollouts (issue 26 item 5), side by side in one run on ONE real SGLang CPU server:

* training step time, synchronous (``rollout.max_staleness=0``) vs k = 1 vs k = 2, on a multi-turn
  workflow with outputs of varied length (``workloads/multiturn_varied.wf``) and on a mixed one
  (``workflows/coord_mixed.wf``: a parallel pair, then a closer);
* rollout wall time of one batch, lockstep vs streaming scheduler, on the same server;
* reward against steps and against wall-clock time for the three modes (mean over seeds, with a
  95% t interval when there are >= 2 seeds), drawn to ``docs/img/async_reward.png``;
* learning (``--learn-seeds``, a second server): the tiny model above learns nothing in a few dozen
  steps, so the same question -- does overlap change learning per step? -- is asked where learning
  is measured: ``workflows/tinymath_routed.wf`` on the pre-trained ``tiny-reason`` with the objectives
  study's budget (benchmarks/study.py: 8 tasks x G = 8, 2 epochs, lr 1e-4, 40 steps), held-out
  accuracy (64 held-out problems x 2 samples) every 10 steps, per mode; the paired difference to
  synchronous, seed by seed, with its 95% t interval; drawn to ``docs/img/async_learning.png``.

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
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # tests.support.sglang_servers
from _perfdoc import machine, write_result, write_section  # noqa: E402

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
LEARN_MODEL = "tiny-reason"


def learn_once(url: str, model: str, k: int, seed: int, args, root: Path) -> dict:
    """One run of the learning comparison: the objectives study's budget on ``LEARN_WF``, sampled on
    the server in mode ``max_staleness = k``; its metrics rows and held-out accuracy by step."""
    sys.path.insert(0, str(HERE))
    from study import _tasks_of

    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.observe.metrics import read_metrics
    from srpo_graph.train.trainer import train

    reset(url, model)
    run = root / f"learn-k{k}-s{seed}"
    cfg = load_config(
        None,
        [
            f"steps={args.learn_steps}",
            f"seed={seed}",
            f"run_dir={json.dumps(str(run))}",
            "rollout.backend=sglang",
            f"rollout.sglang.url={json.dumps(url)}",
            "rollout.sglang.sync=disk",
            "rollout.sglang.update_connected=true",
            f"rollout.sglang.weight_dir={json.dumps(str(root / 'w-learn'))}",
            f"rollout.max_staleness={k}",
            "rollout.tasks_per_step=8",
            "rollout.samples=8",
            f"rollout.eval_tasks={json.dumps(str(_tasks_of(LEARN_WF)[1]))}",
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
        ],
    )
    summary = train(ROOT / "workflows" / f"{LEARN_WF}.wf", cfg)
    return {"rows": read_metrics(run / "metrics.jsonl"), "eval": [[int(s), float(v)] for s, v in summary.eval_rewards]}


def base_accuracy(seed: int) -> float:
    """Held-out accuracy of the pre-trained model (step 0, the same for every mode), as the study
    measures it: the same 64 problems x 2 samples, in process."""
    sys.path.insert(0, str(HERE))
    from study import PLANS, held_out_accuracy

    return held_out_accuracy(LEARN_WF, PLANS["learn"], seed)["all"]


def learning_section(learn: dict[int, list[dict]], minutes: float, args) -> tuple[str, dict]:
    """The learning table (held-out accuracy by mode, the paired difference to synchronous) and its record."""
    modes = sorted(learn)
    steps = sorted({s for r in learn[modes[0]] for s, _ in r["eval"]})
    last = steps[-1]

    def at(r: dict, step: int) -> float:
        return dict((s, v) for s, v in r["eval"])[step]

    head = (
        "| mode | held-out, step 0 | held-out, step " + str(last) + " | gain | vs synchronous at step "
        f"{last} (paired) | step time (s) | wall time to step {last} (min) |\n|---|---|---|---|---|---|---|\n"
    )
    lines, rec = [], {}
    for k in modes:
        runs = learn[k]
        first, final = [at(r, steps[0]) for r in runs], [at(r, last) for r in runs]
        gain = [b - a for a, b in zip(first, final)]
        diff = [at(r, last) - at(s, last) for r, s in zip(runs, learn[modes[0]])]
        st = [statistics.median(step_times(r["rows"])) for r in runs]
        wall = [r["rows"][-1]["time/clock"] / 60 for r in runs]
        mode = "synchronous" if k == 0 else f"k = {k}"
        lines.append(
            f"| {mode} | {fmt(first, 3)} | {fmt(final, 3)} | {fmt(gain, 3)} | "
            f"{'-' if k == modes[0] else fmt(diff, 3)} | {fmt(st)} | {fmt(wall)} |"
        )
        rec[f"k{k}"] = {
            "first": first,
            "final": final,
            "gain": gain,
            "diff_vs_sync": diff,
            "step_s": st,
            "wall_min": wall,
            "eval": [r["eval"] for r in runs],
            "reward": [[x["reward"] for x in r["rows"]] for r in runs],
        }
    body = (
        f"\n\n### Learning per step: {LEARN_WF} on {LEARN_MODEL}\n\nThe tiny model above learns nothing in "
        f"{args.steps} steps (its reward stays at chance in every mode), so learning is compared where it is "
        f"measured: `workflows/{LEARN_WF}.wf` on the pre-trained `{LEARN_MODEL}` served by a second real "
        f"SGLang CPU server, with the objectives study's budget (8 tasks x G = 8 per step, 2 epochs, lr 1e-4, "
        f"{args.learn_steps} steps), held-out accuracy = mean reward of 64 held-out problems x 2 sampled "
        f"episodes every 10 steps (step 0: the pre-trained model, measured once per seed in process, as the study "
        f"does), {len(learn[modes[0]])} seeds per mode (interleaved), mean ± 95% t interval; "
        f'"vs synchronous" is the per-seed difference of the final held-out accuracy (same seed: same tasks '
        f"and the same first rollout). {minutes:.0f} min in all.\n\n"
        + head
        + "\n".join(lines)
        + "\n\nHeld-out accuracy by step and by wall-clock: `docs/img/async_learning.png`."
    )
    return body, rec


def plot_learning(learn: dict[int, list[dict]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, runs in sorted(learn.items()):
        steps = [s for s, _ in runs[0]["eval"]]
        acc = [[dict((s, v) for s, v in r["eval"])[s] for r in runs] for s in steps]
        mean = [interval(a)[0] for a in acc]
        half = [interval(a)[1] for a in acc]
        label = "synchronous" if k == 0 else f"k = {k}"
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
    axes[0].set(title=f"{LEARN_WF}: held-out accuracy by step", xlabel="step", ylabel="held-out accuracy")
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
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
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
        learn: dict[int, list[dict]] = {k: [] for k in modes}
        t_learn = time.perf_counter()
        if args.learn_seeds:
            from srpo_graph.models.recipes import ensure_recipe_model

            reason = str(ensure_recipe_model(LEARN_MODEL))
            server = start_real_server(reason, root)
            try:
                for seed in range(args.learn_seeds):
                    base = base_accuracy(seed)
                    for k in modes:
                        print(f"learn: seed {seed} k={k} ({(time.perf_counter() - t_start) / 60:.1f} min)", flush=True)
                        got = learn_once(server.url, reason, k, seed, args, root)
                        got["eval"] = [[0, base], *got["eval"]]
                        learn[k].append(got)
            finally:
                server.stop()
        learn_min = (time.perf_counter() - t_learn) / 60
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
    if args.learn_seeds:
        plot_learning(learn, ROOT / "docs" / "img" / "async_learning.png")
        learn_body, result["learning"] = learning_section(learn, learn_min, args)
        body = body.rstrip("\n") + learn_body + "\n"
    write_section(
        "async", "## Overlapped rollouts: synchronous vs k = 1 vs k = 2 (benchmarks/bench_async.py)\n\n" + body
    )
    write_result("async", {"seeds": args.seeds, "steps": args.steps, "minutes": total / 60, **result})
    print(body)


if __name__ == "__main__":
    main()
