"""Overlapped rollouts (issue 26 item 5), side by side in one run on ONE real SGLang CPU server:

* training step time, synchronous (``rollout.max_staleness=0``) vs k = 1 vs k = 2, on a multi-turn
  workflow with outputs of varied length (``workloads/multiturn_varied.wf``) and on a mixed one
  (``workflows/coord_mixed.wf``: a parallel pair, then a closer);
* rollout wall time of one batch, lockstep vs streaming scheduler, on the same server;
* reward against steps and against wall-clock time for the three modes (mean over seeds, with a
  95% t interval when there are >= 2 seeds), drawn to ``docs/img/async_reward.png``.

Every training run connects to the same server (``rollout.sglang.url``; weights synced through
disk, the fastest route at this size, bench_sync.py) whose weights are put back to the base model
before each run. Writes its section of docs/performance.md and benchmarks/results/async.json.

Usage (the full version, ~1-2 h on 2 free cores)::

    python benchmarks/bench_async.py --seeds 5 --steps 20

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
sys.path.insert(0, str(ROOT / "tests" / "backends"))
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

    return SGLangBackend(url, load_tokenizer(model), sync="disk", vocab_size=AutoConfig.from_pretrained(model).vocab_size)


def reset(url: str, model: str) -> None:
    """Put the server's weights back to the base model (version 0) before a run."""
    backend = client(url, model)
    try:
        backend.sync_weights(model, 0)
    finally:
        backend.close()


def train_once(wf: Path, url: str, model: str, k: int, seed: int, steps: int, args, root: Path) -> list[dict]:
    from srpo_graph.train.config import load_config
    from srpo_graph.train.metrics import read_metrics
    from srpo_graph.train.trainer import train

    reset(url, model)
    run = root / f"{wf.stem}-k{k}-s{seed}"
    cfg = load_config(None, [f"steps={steps}", f"seed={seed}", f"run_dir={json.dumps(str(run))}",
                             "rollout.backend=sglang", f"rollout.sglang.url={json.dumps(url)}",
                             "rollout.sglang.sync=disk", "rollout.sglang.update_connected=true",
                             f"rollout.sglang.weight_dir={json.dumps(str(root / 'w'))}",
                             f"rollout.tasks={json.dumps(str(TASKS))}", f"rollout.max_staleness={k}",
                             f"rollout.tasks_per_step={args.tasks}", f"rollout.samples={args.samples}",
                             f"optim.lr={args.lr}", "eval.every=0", "checkpoint.every=0", "checkpoint.keep_last=1",
                             "logging.tensorboard=false", "logging.progress=false", "logging.plots=false",
                             "logging.traces_every=0", "overwrite=true"])
    train(wf, cfg)
    return read_metrics(run / "metrics.jsonl")


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
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from sglang_servers import start_real_server

    from srpo_graph.models.tiny import ensure_tiny_model

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
                        print(f"train: {name} seed {seed} k={k} ({(time.perf_counter() - t_start) / 60:.1f} min)",
                              flush=True)
                        runs[name][k].append(train_once(wf, server.url, model, k, seed, args.steps, args, root))
        finally:
            server.stop()
    total = time.perf_counter() - t_start
    plot(runs, ROOT / "docs" / "img" / "async_reward.png")
    head = ("| workflow | mode | step time (s) | speed-up vs sync | trainer waits for rollout (s/step) | "
            "update + sync (s/step) | staleness mean | reward, last half of steps |\n|---|---|---|---|---|---|---|---|\n")
    lines, result = [], {}
    for name, modes_runs in runs.items():
        base = statistics.fmean(statistics.median(step_times(r)) for r in modes_runs[modes[0]])
        for k, rs in modes_runs.items():
            st = [statistics.median(step_times(r)) for r in rs]
            wait = [statistics.fmean(x["time/rollout_wait"] for x in r[1:]) for r in rs]
            upd = [statistics.fmean(x.get("time/update", 0) + x.get("time/sync", 0) + x.get("time/old_logprobs", 0)
                                    + x.get("time/compile", 0) for x in r[1:]) for r in rs]
            stale = [statistics.fmean(x.get("staleness/mean", 0) for x in r) for r in rs]
            late = [statistics.fmean(x["reward"] for x in r[len(r) // 2:]) for r in rs]
            mode = "synchronous" if k == 0 else f"k = {k}"
            lines.append(f"| {name} | {mode} | {fmt(st)} | {base / statistics.fmean(st):.2f}x | {fmt(wait)} | "
                         f"{fmt(upd, 3)} | {fmt(stale)} | {fmt(late)} |")
            result[f"{name}/k{k}"] = {"step_s": st, "wait_s": wait, "update_s": upd, "staleness": stale,
                                      "reward_late": late}
    sched_lines = []
    for name, d in sched.items():
        lo, st = d["lockstep"], d["streaming"]
        sched_lines.append(f"| {name} | {fmt(lo)} | {fmt(st)} | {statistics.fmean(lo) / statistics.fmean(st):.2f}x |")
        result[f"{name}/rollout"] = d
    body = (f"One real SGLang CPU server (tiny model), every run connected to it (weights reset to the base "
            f"model before each). {args.seeds} seed(s) x {args.steps} steps per mode, {args.tasks} tasks x G = "
            f"{args.samples} per step; step time = median seconds between consecutive steps (the loop's "
            f"`time/clock`, first step left out), then mean over seeds"
            f"{' ± a 95% t interval' if args.seeds > 1 else ''}. Machine: {machine()}; the whole run took "
            f"{total / 60:.1f} min. {args.note}\n\n" + head + "\n".join(lines) +
            f"\n\nRollout wall time of one batch ({args.tasks} tasks x G = {args.samples}, base weights), "
            f"{args.repeats} repeat(s) each, alternating:\n\n| workflow | lockstep (s) | streaming (s) | speed-up |\n"
            "|---|---|---|---|\n" + "\n".join(sched_lines) +
            "\n\nReward by step and by wall-clock: `docs/img/async_reward.png`. Command: `python "
            f"benchmarks/bench_async.py --seeds {args.seeds} --steps {args.steps} --repeats {args.repeats}`.\n")
    write_section("async", "## Overlapped rollouts: synchronous vs k = 1 vs k = 2 (benchmarks/bench_async.py)\n\n" + body)
    write_result("async", {"seeds": args.seeds, "steps": args.steps, "minutes": total / 60, **result})
    print(body)


if __name__ == "__main__":
    main()
