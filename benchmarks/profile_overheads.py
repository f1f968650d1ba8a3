"""Where the Python time of P1 (rollout of 1-token outputs) and P2 (compile) goes: a profile.

* **Rollout**: the executor runs each coordination workflow (32 tasks x 8 samples) with the
  backend's ``generate`` replayed from a cache of its own earlier answers, so what is left is
  the executor's Python only; it is split by wrapping its parts (render, request building +
  batching, the backend answer checks, ``EpisodeRun.add_output`` = extract + record,
  ``advance`` = readiness, firing, rewards, activation, ``to_episode`` = the trace records).
  Compared with the model time per output of the real ``generate`` in the same run. Best of
  ``--repeats`` runs (the wrappers add ~1 us per call, included in the parts).
* **Compile**: ``compile()`` on one step of ``benchmarks/workloads/single16.wf`` (128
  episodes): wall time per episode, and cProfile's own-time shares of its functions.

Writes its section of docs/performance.md. Usage: ``python benchmarks/profile_overheads.py [--repeats 9]``
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _perfdoc import machine, write_result, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = [("coord_seq", "coord"), ("coord_par5", "coord"), ("coord_mixed", "coord"), ("coord_routed", "routed")]
PARTS = ("render", "request+batch", "answer checks", "add_output", "advance", "to_episode")


def profile_rollout(name: str, task_file: str, repeats: int) -> dict:
    import srpo_graph.runtime.episode as episode
    import srpo_graph.runtime.executor as executor
    import srpo_graph.runtime.lockstep as lockstep
    import srpo_graph.runtime.requests as requests
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.tasks import load_tasks

    backend = TransformersBackend.from_pretrained("tiny")
    wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
    tasks = load_tasks(ROOT / "workflows" / "tasks" / f"{task_file}.jsonl", wf)[:32]
    backends = {p.name: backend for p in wf.policies}
    real_generate = backend.generate
    cache: dict = {}
    model_s = [0.0]

    def replay(reqs):
        key = tuple((r.prompt_ids, r.seed, r.max_new_tokens) for r in reqs)
        if key not in cache:
            t0 = time.process_time()
            cache[key] = real_generate(reqs)
            model_s[0] += time.process_time() - t0
        return cache[key]

    executor.run(wf, tasks, backends, samples=8, seed=1)  # warm-up (real generate)
    backend.generate = replay
    res = executor.run(wf, tasks, backends, samples=8, seed=1)  # fills the cache: the real model time
    outputs = sum(len(e.outputs) for e in res.episodes)
    per_output_model = model_s[0] / outputs
    spent: dict[str, float] = collections.defaultdict(float)
    undo = []

    def wrap(owner, attr: str, part: str) -> None:
        fn = getattr(owner, attr)

        def timed(*a, **kw):
            t0 = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[part] += time.process_time() - t0

        setattr(owner, attr, timed)
        undo.append((owner, attr, fn))

    best_total, best_parts = None, None
    for _ in range(repeats):  # plain runs: the executor's whole Python time per output
        t0 = time.process_time()
        executor.run(wf, tasks, backends, samples=8, seed=1)
        total = time.process_time() - t0
        best_total = total if best_total is None else min(best_total, total)
    wrap(requests, "render", "render")
    wrap(requests, "checked_completion", "answer checks")
    wrap(requests, "trim_at_stop", "answer checks")
    wrap(episode.EpisodeRun, "add_output", "add_output")
    wrap(episode.EpisodeRun, "advance", "advance")
    wrap(episode.EpisodeRun, "to_episode", "to_episode")
    wrap(lockstep, "generate_round", "round")
    try:
        for _ in range(repeats):
            spent.clear()
            t0 = time.process_time()
            executor.run(wf, tasks, backends, samples=8, seed=1)
            total = time.process_time() - t0
            if best_parts is None or total < best_parts["total"]:
                best_parts = {**spent, "total": total}
    finally:
        for owner, attr, fn in reversed(undo):
            setattr(owner, attr, fn)
        backend.generate = real_generate
    p = best_parts
    p["request+batch"] = p["round"] - p["render"] - p["answer checks"] - p["add_output"]
    p["loop"] = p["total"] - p["round"] - p["advance"] - p["to_episode"]
    us = {k: 1e6 * p[k] / outputs for k in (*PARTS, "loop")}
    return {"name": name, "outputs": outputs, "python_us": 1e6 * best_total / outputs,
            "model_us": 1e6 * per_output_model, "parts_us": us}


def profile_compile(repeats: int) -> dict:
    from transformers import AutoModelForCausalLM

    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.compiler.compile import CompileConfig, compile
    from srpo_graph.lang import load_workflow
    from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    wf = load_workflow(ROOT / "benchmarks" / "workloads" / "single16.wf")
    tasks = load_tasks(ROOT / "benchmarks" / "workloads" / "digits.jsonl", wf)[:16]
    eps = run(wf, tasks, {"tiny": TransformersBackend(model, load_tokenizer(path))}, samples=8, seed=1).episodes
    compile(eps, CompileConfig())
    times = []
    for _ in range(repeats * 3):
        t0 = time.process_time()
        compile(eps, CompileConfig())
        times.append(time.process_time() - t0)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        compile(eps, CompileConfig())
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, fn): (cc, nc, tottime, cumtime, callers)}
    total = sum(v[2] for v in stats.values())
    own: dict[str, float] = collections.defaultdict(float)
    for (file, _, fn), v in stats.items():
        where = f"{Path(file).stem}.{fn}" if "srpo_graph" in file else ("torch / numpy" if any(
            k in file for k in ("torch", "numpy")) or fn.startswith("<built-in method torch") else "other Python")
        own[where] += v[2]
    top = sorted(own.items(), key=lambda kv: -kv[1])[:6]
    return {"episodes": len(eps), "compile_ms": 1000 * min(times), "per_episode_us": 1e6 * min(times) / len(eps),
            "top": [(k, v / total) for k, v in top]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [profile_rollout(n, t, args.repeats) for n, t in WORKFLOWS]
    comp = profile_compile(args.repeats)
    head = ("| workflow | outputs | executor Python / output | model / output (generate) | " + " | ".join(PARTS)
            + " | loop |")
    lines = [
        "## Profile: the Python of P1 and P2 (benchmarks/profile_overheads.py)",
        "",
        "Rollout of 1-token outputs (32 tasks x 8 samples, the tiny model): the executor with the backend's answers "
        "replayed from a cache, so only its own Python runs, split by part (us of CPU time per output, best of "
        f"{args.repeats}); *model / output* is the real `generate` time per output in the same process. For "
        "executor / raw generate >= 0.90x the executor may spend at most 0.11x the model time per output. "
        f"{machine()}; the 2 cores were shared with other engineers' jobs.",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['outputs']} | {r['python_us']:.1f} us | {r['model_us']:.1f} us | "
            + " | ".join(f"{r['parts_us'][p]:.1f}" for p in (*PARTS, "loop"))
            + " |"
        )
    lines += [
        "",
        f"Compile of one P6 step ({comp['episodes']} episodes of `single16.wf`): {comp['compile_ms']:.2f} ms, "
        f"{comp['per_episode_us']:.0f} us per episode; own-time shares (cProfile): "
        + ", ".join(f"`{k}` {100 * v:.0f}%" for k, v in comp["top"])
        + ".",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_doc:
        write_section("profile", text)
        write_result("profile", {"rollout": rows, "compile": comp})


if __name__ == "__main__":
    main()
