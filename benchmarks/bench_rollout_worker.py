"""Training step time with sampling in the trainer's process vs in a rollout worker process
(``rollout.worker``), on the tiny model: a full policy (coord_par2) and two LoRA adapters on one
base (coord_lora2). Synchronous training: the worker adds a weight push per step and the episodes'
trip back, and (until the overlapped stage uses it) overlaps nothing. Writes its section of
docs/performance.md and benchmarks/results/rollout_worker.json.

Usage: ``python benchmarks/bench_rollout_worker.py [--steps 6]`` (four short training runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _perfdoc import machine, write_result, write_section  # noqa: E402


def run(workflow: str, worker: bool, steps: int, root: Path) -> dict[str, float]:
    from srpo_graph.train.config.loading import validate
    from srpo_graph.train.trainer import train

    run_dir = root / f"{workflow}-{'worker' if worker else 'inproc'}"
    cfg = validate({"run_dir": str(run_dir), "steps": steps, "seed": 0,
                    "rollout": {"tasks_per_step": 8, "samples": 8, "worker": worker},
                    "checkpoint": {"every": 0}, "eval": {"every": 0},
                    "logging": {"tensorboard": False, "plots": False, "progress": False, "traces_every": 0}})
    t0 = time.perf_counter()
    train(ROOT / "workflows" / f"{workflow}.wf", cfg)
    total = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]  # step 1: warm-up
    med = {k: statistics.median(r[f"time/{k}"] for r in rows) for k in ("step", "rollout", "sync")}
    return {**med, "total": total, "rewards": [r["reward"] for r in rows]}  # type: ignore[dict-item]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = ["| workflow | sampling | step (s) | rollout (s) | sync (s) | run incl. start (s) | step vs in-process |",
             "|---|---|---|---|---|---|---|"]
    data = {}
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        for wf in ("coord_par2", "coord_lora2"):
            base = run(wf, False, args.steps, Path(tmp))
            work = run(wf, True, args.steps, Path(tmp))
            assert base.pop("rewards") == work.pop("rewards"), "the worker must give the same rewards"
            data[wf] = {"in_process": base, "worker": work}
            for name, r in (("in process", base), ("worker", work)):
                lines.append(f"| {wf} | {name} | {r['step']:.3f} | {r['rollout']:.3f} | {r['sync']:.3f} | "
                             f"{r['total']:.1f} | {r['step'] / base['step']:.2f}x |")
    body = ("Synchronous training on the tiny model, 8 tasks x 8 samples per step, median over steps 2.."
            f"{args.steps} (step 1 is warm-up); the same rewards per step both ways (asserted). `worker`: "
            "`rollout.worker = true`, sampling in a child process holding its own copies, weights pushed "
            "after every update over a two-rank gloo group (LoRA: adapters only). `run incl. start` adds the "
            f"worker's start (imports, models). Machine: {machine()}; shared with other jobs, so single "
            "runs are noisy.\n\n" + "\n".join(lines))
    write_section("rollout_worker", "## Rollout worker vs in-process sampling (benchmarks/bench_rollout_worker.py)\n\n"
                  + body)
    write_result("rollout_worker", data)
    print(body)


if __name__ == "__main__":
    main()
