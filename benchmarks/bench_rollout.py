"""Rollout throughput on the tiny model: the executor vs the backend's raw batched generate.

For each coordination workflow, three ways to produce the same tokens:

* **executor** -- ``runtime.executor.run`` over all tasks x samples (one batch per round);
* **raw generate** -- ``TransformersBackend.generate`` replaying exactly the prompts the executor
  sent, grouped the same way (one call per step), each request with ``max_new_tokens`` equal to
  the tokens it actually produced: the backend's own speed with no workflow logic;
* **one at a time** -- the executor with ``max_concurrent=1`` (episodes run sequentially).

Ratios are within this run (same machine, same load). Prints a table and writes a section of
docs/performance.md. Not a test: nothing here is asserted.

Usage: ``python benchmarks/bench_rollout.py [--tasks 32] [--samples 8] [--repeats 3] [--no-doc]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_section  # noqa: E402

from srpo_graph.backends.base import GenerationRequest  # noqa: E402
from srpo_graph.backends.transformers import TransformersBackend  # noqa: E402
from srpo_graph.lang import load_workflow  # noqa: E402
from srpo_graph.runtime.executor import run  # noqa: E402
from srpo_graph.runtime.tasks import load_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = [("coord_seq", "coord"), ("coord_par5", "coord"), ("coord_mixed", "coord"), ("coord_routed", "routed")]


def best(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def bench(name: str, task_file: str, backend: TransformersBackend, n_tasks: int, samples: int, repeats: int) -> dict:
    wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
    tasks = load_tasks(ROOT / "workflows" / "tasks" / f"{task_file}.jsonl", wf)[:n_tasks]
    backends = {p.name: backend for p in wf.policies}
    t_exec, res = best(lambda: run(wf, tasks, backends, samples=samples, seed=1), repeats)
    episodes = res.episodes  # type: ignore[attr-defined]
    tokens = sum(len(o.completion_ids) for e in episodes for o in e.outputs)
    rounds: dict[int, list[GenerationRequest]] = defaultdict(list)
    for e in episodes:
        for o in e.outputs:
            rounds[o.step].append(GenerationRequest(
                tuple(o.prompt_ids), max_new_tokens=len(o.completion_ids), temperature=o.temperature,
                allowed_token_ids=tuple(o.allowed_token_ids) if o.allowed_token_ids else None, seed=len(rounds[o.step])))
    t_raw, _ = best(lambda: [backend.generate(reqs) for _, reqs in sorted(rounds.items())], repeats)
    t_seq, _ = best(lambda: run(wf, tasks, backends, samples=samples, seed=1, max_concurrent=1), 1)
    return {"name": name, "episodes": len(episodes), "tokens": tokens, "batches": res.stats.generate_calls,  # type: ignore[attr-defined]
            "exec": t_exec, "raw": t_raw, "seq": t_seq}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    backend = TransformersBackend.from_pretrained("tiny")
    rows = [bench(n, t, backend, args.tasks, args.samples, args.repeats) for n, t in WORKFLOWS]
    head = ("| workflow | episodes | tokens | batches | executor tok/s | raw generate tok/s | executor / raw "
            "| one-at-a-time tok/s | executor / one-at-a-time |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['episodes']} | {r['tokens']} | {r['batches']} | {r['tokens'] / r['exec']:,.0f} | "
            f"{r['tokens'] / r['raw']:,.0f} | {r['raw'] / r['exec']:.2f}x | {r['tokens'] / r['seq']:,.0f} | "
            f"{r['seq'] / r['exec']:.1f}x |"
        )
    table = "\n".join(lines)
    print(table)
    body = (
        "## Runtime: rollout throughput (benchmarks/bench_rollout.py)\n\n"
        f"Tiny model, {args.tasks} tasks x {args.samples} samples per workflow, transformers backend on CPU; "
        f"executor and raw generate best of {args.repeats}, one-at-a-time one run; {machine()}.\n"
        "*raw generate* replays the executor's own prompts, grouped per step, with the same token counts: "
        "executor / raw is the share of the backend's batched speed the executor keeps (1.00x = no overhead). "
        "Each output is 1 token here, so per-call overhead dominates; the ratio to one-at-a-time shows what "
        "batching across episodes buys.\n\n" + table + "\n"
    )
    if not args.no_doc:
        write_section("rollout", body)
        print("wrote the rollout section of docs/performance.md")


if __name__ == "__main__":
    main()
