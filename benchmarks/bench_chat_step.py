"""A chat workflow's training step on CPU by stage, on one torch thread vs torch's default (issue 39.3).

Run: ``python benchmarks/bench_chat_step.py [--steps 2] [--model qwen3-test]``. Each configuration
is one ``srpo-graph train workflows/chat_search_qwen3.wf`` of ``--steps`` steps (8 tasks x 4
samples, one epoch, no evaluation) in its own subprocess with ``OMP_NUM_THREADS`` set to the
thread count (so ``models.cpu_threads`` leaves it: Note [Threads for small models]); the table
gives each stage's seconds from the run's metrics.jsonl, the last step's (the first includes
warm-up). Ratios are within one run of this script, on the same machine and load. Writes its
section of docs/performance.md and benchmarks/results/chat_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("rollout", "old_logprobs", "update", "step")


def one(model: str, threads: int, steps: int, run_dir: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "srpo_graph.cli", "train", "workflows/chat_search_qwen3.wf", "--steps", str(steps),
           "--run-dir", str(run_dir), "--overwrite", f'rollout.models={{"*"="{model}"}}', "rollout.tasks_per_step=8",
           "rollout.samples=4", "optim.epochs=1", "eval.every=0", "logging.tensorboard=false"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{model} on {threads} thread(s) failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    return {"model": model, "threads": threads, "tokens": last["tokens"],
            **{s: last[f"time/{s}"] for s in STAGES}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--model", action="append", help="models to time (default qwen3-test)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (the first is the baseline)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _perfdoc import machine, write_result, write_section

    res = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.model or ["qwen3-test"]:
            for i, threads in enumerate(int(t) for t in args.threads.split(",")):
                r = one(model, threads, args.steps, Path(tmp) / f"run{i}")
                print(json.dumps(r), flush=True)
                res.append(r)
    lines = [
        "## Chat step on CPU: one thread vs torch's default (benchmarks/bench_chat_step.py)",
        "",
        f"`python benchmarks/bench_chat_step.py --steps {args.steps}` ({machine()}, the load of a shared 2-core "
        "machine): `workflows/chat_search_qwen3.wf`, 8 tasks x 4 samples, one epoch, step "
        f"{args.steps} of a run (seconds by stage, from metrics.jsonl). `train` and `run` now take one thread "
        "for small models (models/__init__.py, Note [Threads for small models]).",
        "",
        "| model | threads | tokens | rollout | old log-probs | update | step | step vs 1 thread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = {r["model"]: r for r in res if r["threads"] == int(args.threads.split(",")[0])}
    for r in res:
        ratio = r["step"] / base[r["model"]]["step"]
        lines.append(f"| {r['model']} | {r['threads']} | {r['tokens']:,} | {r['rollout']:.1f} s | "
                     f"{r['old_logprobs']:.1f} s | {r['update']:.1f} s | {r['step']:.1f} s | {ratio:.2f}x |")
    write_section("chat_step", "\n".join(lines))
    write_result("chat_step", {"runs": res})


if __name__ == "__main__":
    main()
