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
from _perfdoc import machine, write_result, write_section  # noqa: E402

from srpo_graph.backends.base import GenerationRequest  # noqa: E402
from srpo_graph.backends.transformers import TransformersBackend  # noqa: E402
from srpo_graph.lang import load_workflow  # noqa: E402
from srpo_graph.runtime.executor import run  # noqa: E402
from srpo_graph.runtime.tasks import load_tasks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = [("coord_seq", "coord"), ("coord_par5", "coord"), ("coord_mixed", "coord"), ("coord_routed", "routed")]
# plus one workflow with multi-token outputs (up to 48), a stop string and a tool: fewer tasks
LONG = [("search", "search", 8)]


def interleaved(fns: dict[str, object], repeats: int) -> dict[str, float]:
    """Best CPU time of each function over ``repeats`` rounds, the functions alternating within a
    round. CPU time (``process_time``: this process, all threads) rather than wall time: the
    cores are shared, and other jobs stretch wall time but not the CPU time a run needs."""
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.process_time()
            fn()  # type: ignore[operator]
            times[key].append(time.process_time() - t0)
    return {k: min(v) for k, v in times.items()}


def bench(name: str, task_file: str, backend: TransformersBackend, n_tasks: int, samples: int, repeats: int) -> dict:
    wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
    tasks = load_tasks(ROOT / "workflows" / "tasks" / f"{task_file}.jsonl", wf)[:n_tasks]
    backends = {p.name: backend for p in wf.policies}
    res = run(wf, tasks, backends, samples=samples, seed=1)  # also warms caches up, like the repeats below
    episodes = res.episodes
    tokens = sum(len(o.completion_ids) for e in episodes for o in e.outputs)
    rounds: dict[int, list[GenerationRequest]] = defaultdict(list)
    for e in episodes:
        for o in e.outputs:
            rounds[o.step].append(
                GenerationRequest(
                    tuple(o.prompt_ids),
                    max_new_tokens=len(o.completion_ids),
                    temperature=o.temperature,
                    allowed_token_ids=tuple(o.allowed_token_ids) if o.allowed_token_ids else None,
                    seed=len(rounds[o.step]),
                )
            )
    best = interleaved(
        {
            "exec": lambda: run(wf, tasks, backends, samples=samples, seed=1),
            "raw": lambda: [backend.generate(reqs) for _, reqs in sorted(rounds.items())],
        },
        repeats,
    )
    t_seq = interleaved({"seq": lambda: run(wf, tasks, backends, samples=samples, seed=1, max_concurrent=1)}, 1)["seq"]
    return {
        "name": name,
        "episodes": len(episodes),
        "tokens": tokens,
        "batches": res.stats.generate_calls,
        "exec": best["exec"],
        "raw": best["raw"],
        "seq": t_seq,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    backend = TransformersBackend.from_pretrained("tiny")
    rows = [bench(n, t, backend, args.tasks, args.samples, args.repeats) for n, t in WORKFLOWS]
    rows += [bench(n, t, backend, k, args.samples, max(1, args.repeats // 2)) for n, t, k in LONG]
    head = (
        "| workflow | episodes | tokens | batches | executor tok/s | raw generate tok/s | executor / raw "
        "| one-at-a-time tok/s | executor / one-at-a-time |"
    )
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
        f"executor and raw generate best of {args.repeats}, measured alternately, in CPU time (the 2 cores were shared "
        f"with other engineers' jobs); one-at-a-time one run; {machine()}.\n"
        "*raw generate* replays the executor's own prompts, grouped per step, with the same token counts: "
        "executor / raw is the share of the backend's batched speed the executor keeps (1.00x = no overhead). "
        "In the coordination workflows each output is 1 token, so the per-output Python work of the executor "
        "(render, request, extract, record, fire) is compared with ~40 us of model time per output: the "
        "worst case. *search* has outputs of up to 48 tokens, a stop string and a tool. The ratio to "
        "one-at-a-time shows what batching across episodes buys.\n\n" + table + "\n\n"
        "Round 2 (round 1 measured 0.43-0.62x on the same four rows): prompts are tokenized in one call per "
        "agent and round, each distinct text once; completions are decoded through a cache; an output's "
        "record is built once, with `model_construct` (validation cost O(tokens): 30 us for a 300+100-token "
        "output vs 8 us), after a cheap check of the backend's log-probs; only transitions consuming an "
        "agent with fresh outputs are tested for readiness; `allow` tokens are looked up once per tokenizer; "
        "per-output seeds use splitmix64 instead of blake2b. Round 3: an output's record skips pydantic's "
        "per-field default handling when every field is given (~4 us of ~27 us per output) and the backend's "
        "vocabulary size is read once per batch. What remains, ~20-25 us of plain Python per 1-token output "
        "against ~45 us of model time, is broken down in the profile section (benchmarks/profile_overheads.py); "
        "with multi-token outputs the model dominates.\n"
    )
    if not args.no_doc:
        write_section("rollout", body)
        write_result(
            "rollout",
            {
                r["name"]: {"ratio": r["raw"] / r["exec"], "tokens": r["tokens"], "episodes": r["episodes"]}
                for r in rows
            },
        )
        print("wrote the rollout section of docs/performance.md")


if __name__ == "__main__":
    main()
