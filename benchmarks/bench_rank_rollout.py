"""Rollout throughput with 1 vs 2 sampling ranks (issue 25 items 3 and 6).

One 2-process torchrun job (gloo, one thread per rank) times the trainer's rollout stage
(``train.rollout_stage.rollout``: sampling, then the episodes shared as JSON with every rank) on
the tiny model with the transformers backend, alternating within the job between

* **1 sampling rank** -- ``rollout.every_rank=false``: rank 0 samples every task and broadcasts the
  episodes (what every run did before);
* **2 sampling ranks** -- ``rollout.every_rank=true``: each rank samples half of the tasks (whole
  groups) and the shares are all-gathered.

Both modes produce the same episodes (checked here on each repeat: same token ids). Reported: the
best wall time of each mode over the repeats (rank 0, from a barrier to the list of episodes on
every rank) and the ratio, measured in the same job. Not a test: nothing here is asserted.

Usage: ``python benchmarks/bench_rank_rollout.py [--repeats 5] [--no-doc]`` (it launches torchrun itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
# (workflow, task file, tasks, samples): 1-token outputs (Python-bound) and outputs of up to 48 tokens;
# coord.jsonl has 40 tasks
WORKLOADS = [("coord_mixed", "coord", 40, 8), ("search", "search", 16, 8)]


def worker(out: Path, repeats: int) -> None:
    import torch

    from srpo_graph.backends import TrainedPolicy, backend_spec
    from srpo_graph.lang import load_workflow
    from srpo_graph.models import resolve_model
    from srpo_graph.models.tiny import load_tokenizer
    from srpo_graph.runtime.tasks import load_tasks
    from srpo_graph.train.config.loading import validate
    from srpo_graph.train.parallel.collectives import init_distributed, shutdown
    from srpo_graph.train.rollout.lockstep import rollout

    torch.set_num_threads(1)
    dist = init_distributed("cpu", timeout=600)
    import torch.distributed as tdist
    from transformers import AutoModelForCausalLM

    path = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = load_tokenizer(path)
    rows = []
    for name, task_file, n_tasks, samples in WORKLOADS:
        wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
        tasks = load_tasks(ROOT / "workflows" / "tasks" / f"{task_file}.jsonl", wf)[:n_tasks]
        trained = [TrainedPolicy(p.name, path, model, tok, "cpu") for p in wf.policies]
        configs = {k: validate({"rollout": {"every_rank": v}}) for k, v in (("one", False), ("two", True))}
        backends = backend_spec("transformers").for_training(trained, configs["one"].rollout.transformers, out)
        slots = [SimpleNamespace(name=p.name, backend=backends[p.name], version=0) for p in trained]
        best = {"one": float("inf"), "two": float("inf")}
        ids = {}
        for r in range(repeats + 1):  # the first round warms up (not counted)
            for mode, config in configs.items():
                tdist.barrier()
                t0 = time.perf_counter()
                episodes, _ = rollout(wf, tasks, slots, config, 7, dist, samples)
                seconds = time.perf_counter() - t0
                if r:
                    best[mode] = min(best[mode], seconds)
                ids[mode] = [o.completion_ids for e in episodes for o in e.outputs]
            assert ids["one"] == ids["two"], "the two modes sampled different episodes"
        tokens = sum(len(c) for c in ids["one"])
        rows.append({"workflow": name, "episodes": len(episodes), "tokens": tokens, **best})
    if dist.is_main:
        (out / "result.json").write_text(json.dumps(rows))
    shutdown(dist)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.repeats)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _perfdoc import machine, write_result, write_section

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        __file__, "--worker", tmp, "--repeats", str(args.repeats)], env=env, check=True, timeout=900)
        rows = json.loads((Path(tmp) / "result.json").read_text())
    lines = [
        "| workflow | episodes | tokens | 1 sampling rank tok/s | 2 sampling ranks tok/s | 2 / 1 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workflow']} | {r['episodes']} | {r['tokens']} | {r['tokens'] / r['one']:,.0f} | "
            f"{r['tokens'] / r['two']:,.0f} | {r['one'] / r['two']:.2f}x |"
        )
    table = "\n".join(lines)
    print(table)
    write_result("rank_rollout", {"rows": rows})
    if args.no_doc:
        return
    write_section(
        "rank_rollout",
        (
            "## Rollouts on every rank: 1 vs 2 sampling ranks (benchmarks/bench_rank_rollout.py)\n\n"
            "One 2-process torchrun job (gloo, one thread per rank), tiny model, transformers backend; the trainer's "
            "rollout stage (`rollout_stage.rollout`: sampling, then the episodes on every rank as JSON) alternating "
            "between `rollout.every_rank=false` (rank 0 samples every task and broadcasts) and `true` (each rank "
            "samples "
            f"half of the tasks, whole groups, and the shares are all-gathered); best wall time of {args.repeats} "
            "repeats each after a warm-up round, the same episodes in both modes (checked); "
            f"{machine()}. **Measured once on a machine of 2 cores shared with other engineers' jobs**: the second "
            "rank only helps as far as a second core was free, so the ratio is a lower bound of what two "
            "dedicated cores or GPUs give; *coord_mixed* has 1-token outputs (Python-bound: the JSON gather is a "
            "larger share), *search* outputs of up to 48 tokens and a tool.\n\n" + table + "\n"
        ),
    )


if __name__ == "__main__":
    main()
