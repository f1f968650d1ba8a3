"""Where a training step's time goes: rollout, compile, old log-probs, update, sync, checkpoint.

Run: ``python benchmarks/bench_train.py [--steps 12 --tasks-per-step 16 --samples 8]``. Trains
``coord_par3.wf`` (one active set of size 3 per episode) and ``coord_mixed.wf`` (a pair, then a
closer that sees both) on the tiny local model with the ``srpo-graph train`` defaults, except:
no evaluation and no plots, and a checkpoint after EVERY step (so its cost is visible; with the
default ``checkpoint.every = 50`` it is 1/50 of that per step). Each workflow runs in its own
subprocess so its peak RSS is its own. The stage times are the trainer's own ``time/*`` metrics;
the checkpoint time is measured around ``checkpoint.save_checkpoint``; "other" is the rest of the
loop (metrics/TensorBoard writing, traces, progress). The first step (warm-up) is left out.
Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ("coord_par3", "coord_mixed")
STAGES = ("rollout", "compile", "old_logprobs", "update", "sync")


def measure(wf: str, args) -> dict:
    """Train ``wf`` in this process; per-step stage seconds and peak RSS."""
    import torch

    torch.set_num_threads(1)
    import srpo_graph.train.checkpoint as ckpt
    import srpo_graph.train.trainer as trainer
    from srpo_graph.train.config.loading import validate
    from srpo_graph.train.observe.metrics import read_metrics

    starts: list[float] = []
    ckpt_s: list[float] = []
    real_step, real_save = trainer._train_step, ckpt.save_checkpoint

    def timed_step(*a, **kw):
        starts.append(time.perf_counter())
        return real_step(*a, **kw)

    def timed_save(*a, **kw):
        t0 = time.perf_counter()
        try:
            return real_save(*a, **kw)
        finally:
            ckpt_s.append(time.perf_counter() - t0)

    trainer._train_step, ckpt.save_checkpoint = timed_step, timed_save
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        cfg = validate({
            "steps": args.steps, "run_dir": str(Path(tmp) / wf),
            "rollout": {"tasks_per_step": args.tasks_per_step, "samples": args.samples},
            "eval": {"every": 0}, "checkpoint": {"every": 1},
            "logging": {"progress": False, "plots": False},
        })
        trainer.train(ROOT / "workflows" / f"{wf}.wf", cfg)
        end = time.perf_counter()
        rows = read_metrics(Path(tmp) / wf / "metrics.jsonl")
    bounds = starts[1:] + [end]
    out = {
        "steps": len(rows) - 1,
        "events": statistics.mean(r["events"] for r in rows),
        "tokens": statistics.mean(r["tokens"] for r in rows),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    out["step_s"] = [b - a for a, b in zip(starts[1:], bounds[1:])]
    for stage in STAGES:
        out[stage] = [r[f"time/{stage}"] for r in rows[1:]]
    out["checkpoint"] = ckpt_s[1:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tasks-per-step", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--one", choices=WORKFLOWS, help=argparse.SUPPRESS)  # child process mode
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args)))
        return
    results = {}
    for wf in WORKFLOWS:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                wf,
                "--steps",
                str(args.steps),
                "--tasks-per-step",
                str(args.tasks_per_step),
                "--samples",
                str(args.samples),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results[wf] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(wf, {k: (round(sum(v) / len(v), 4) if isinstance(v, list) else v) for k, v in results[wf].items()})
    sys.path.insert(0, str(Path(__file__).parent))
    from _perfdoc import machine, write_section

    head = (
        "| workflow | events / tokens per step | step time | "
        + " | ".join(s.replace("old_logprobs", "old log-probs") for s in STAGES)
        + " | checkpoint | other | peak RSS |"
    )
    lines = [
        "## Trainer: a training step by stage (benchmarks/bench_train.py)",
        "",
        f"`srpo-graph train` defaults ({args.tasks_per_step} tasks x {args.samples} samples, 2 epochs, one "
        f"mini-batch) on the "
        f"tiny model, no eval, no plots, a checkpoint after every step (default: every 50 steps); steps 2-{args.steps} "
        f"(step 1 is warm-up); each workflow in its own process; {machine()}; other jobs shared the 2 cores. "
        "Shares of the mean step wall time; *other* = metrics, TensorBoard, traces.",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    largest = []
    for wf, r in results.items():
        total = sum(r["step_s"])
        shares = [sum(r[s]) / total for s in (*STAGES, "checkpoint")]
        other = 1.0 - sum(shares)
        top = sorted(zip(shares, (*STAGES, "checkpoint")), reverse=True)[:2]
        largest.append(f"{wf}: {top[0][1]} {100 * top[0][0]:.0f}%, then {top[1][1]} {100 * top[1][0]:.0f}%")
        lines.append(
            f"| {wf} | {r['events']:.0f} / {r['tokens']:.0f} | {1000 * total / len(r['step_s']):.0f} ms | "
            + " | ".join(f"{100 * x:.1f}%" for x in shares)
            + f" | {100 * other:.1f}% | {r['rss_mb']:.0f} MB |"
        )
    lines += [
        "",
        f"Largest shares: {'; '.join(largest)}. Peak RSS is the whole process (Python, torch, "
        "transformers, the model, optimizer state).",
    ]
    write_section("train", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
