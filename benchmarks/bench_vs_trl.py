"""P6 / P7 / batch scaling: a srpo-graph training step vs TRL's ``GRPOTrainer`` on the same work.

The work (both tools): the tiny local model (``~/.cache/srpo-graph/tiny``, fp32, CPU, one
thread), prompts ``<a>{target}`` for the targets of ``benchmarks/workloads/digits.jsonl``, 16 prompts
x G = 8 completions of up to 16 tokens per step (temperature 1, full vocabulary), the reward
``benchmarks/workloads/bench_rewards.digit_share`` (the same Python function), 2 epochs over
each step's rollouts with one optimizer step per epoch (TRL: ``num_iterations=2``, the whole
generation batch in one optimizer step), Adam lr 1e-3, grad clip 1, no KL (``beta=0``), no
evaluation, no checkpoints, no logging but each tool's own metrics. srpo-graph trains
``benchmarks/workloads/single16.wf`` with ``srpo-graph train``'s loop (``trainer.train``);
TRL runs ``GRPOTrainer.train``.

*Step* = one rollout + its 2 optimizer steps (2 TRL optimizer steps). Times are per step (wall
time, and the process's CPU time, which other jobs on shared cores do not inflate), the
first step (warm-up) left out, measured inside each process from hooks on the step (srpo-graph:
``trainer._train_step``; TRL: ``on_step_begin`` callbacks). Stage shares: srpo-graph's own
``time/*`` metrics; TRL's from timing its ``_generate`` (rollout), the rest of
``_generate_and_score_completions`` (rewards, advantages, old log-probs), and the remainder of
the step (the update: forward, backward, optimizer). Peak memory: the child process's peak RSS.

Whole processes alternate A B A B (``--runs`` each); the ratio srpo-graph / TRL is reported as
the median of the per-pair ratios with their min-max. Rows:

* **P6**: step time at 1x (16 prompts) -- target <= 0.7x;
* **P7**: peak RSS at 4x the rollout batch (64 prompts) at a fixed micro-batch budget -- srpo-graph
  ``compile.micro_batch_tokens`` 8192, TRL ``per_device_train_batch_size`` 128 completions with
  ``gradient_accumulation_steps`` 4 -- target <= 1.1x; and each tool's growth 1x -> 4x;
* **scaling**: time per step at 1x, 2x, 4x, 8x prompts per step (fewer steps at larger sizes).

Usage: ``python benchmarks/bench_vs_trl.py [--runs 5] [--steps 20] [--no-doc]``; needs TRL
(``pip install -e ".[bench]" -c benchmarks/constraints.txt``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "single16.wf"
TASKS = ROOT / "benchmarks" / "workloads" / "digits.jsonl"  # 160 tasks: 8x = 128 distinct prompts per step
G, PROMPTS, MAX_TOKENS, LR, EPOCHS = 8, 16, 16, 1e-3, 2
MICRO_TOKENS, TRL_MICRO = 8192, 128  # the fixed micro-batch budgets (tokens / completions)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- srpo-graph


def run_srpo(steps: int, scale: int, layout: str) -> dict:
    """Train the workload for ``steps`` steps in this process; per-step seconds and stage times."""
    import torch

    torch.set_num_threads(1)
    import srpo_graph.train.trainer as trainer
    from srpo_graph.train.config.loading import validate
    from srpo_graph.train.observe.metrics import read_metrics

    starts: list[float] = []
    cpu: list[float] = []
    real_step = trainer._train_step

    def timed_step(*a, **kw):
        starts.append(time.perf_counter())
        cpu.append(time.process_time())
        try:
            return real_step(*a, **kw)
        finally:
            cpu_end[0] = time.process_time()

    cpu_end = [0.0]

    trainer._train_step = timed_step
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as tmp:
        cfg = validate({
            "steps": steps, "seed": 1, "run_dir": str(Path(tmp) / "run"),
            "rollout": {"tasks": str(TASKS), "tasks_per_step": PROMPTS * scale, "samples": G},
            "optim": {"lr": LR, "epochs": EPOCHS, "mini_batches": 1, "grad_clip": 1.0, "layout": layout},
            "loss": {"kl_coef": 0.0},
            "compile": {"micro_batch_tokens": MICRO_TOKENS},
            "eval": {"every": 0}, "checkpoint": {"every": 0},
            "logging": {"progress": False, "plots": False, "tensorboard": False, "traces_every": 0},
        })
        t_begin = time.perf_counter()
        trainer.train(WORKLOAD, cfg)
        rows = read_metrics(Path(tmp) / "run" / "metrics.jsonl")
    # the last step ends where the final checkpoint begins: use the trainer's own step time there
    step_s = [b - a for a, b in zip(starts[:-1], starts[1:])] + [rows[-1]["time/step"]]
    cpu_s = [b - a for a, b in zip(cpu[:-1], cpu[1:])] + [cpu_end[0] - cpu[-1]]
    stages = {
        s: [r.get(f"time/{s}", 0.0) for r in rows[1:]] for s in ("rollout", "compile", "old_logprobs", "update", "sync")
    }
    return {
        "tool": "srpo-graph",
        "step_s": step_s[1:],
        "cpu_s": cpu_s[1:],
        "stages": stages,
        "rss_mb": _rss_mb(),
        "tokens": statistics.mean(r["tokens"] for r in rows),
        "wall_s": time.perf_counter() - t_begin,
    }


# --------------------------------------------------------------------------- TRL


def run_trl(steps: int, scale: int) -> dict:
    """Train the same work with TRL's GRPOTrainer for ``steps`` rollouts (2 optimizer steps each)."""
    import torch

    torch.set_num_threads(1)
    import datasets
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(WORKLOAD.parent))
    from bench_rewards import digit_share

    from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer

    path = ensure_tiny_model()
    tok = load_tokenizer(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    targets = [json.loads(line)["target"] for line in TASKS.read_text().splitlines() if line.strip()]
    n_prompts = PROMPTS * scale
    rows = [targets[i % len(targets)] for i in range(n_prompts * steps)]
    data = datasets.Dataset.from_dict({"prompt": [f"<a>{t}" for t in rows], "target": rows})

    def reward(completions, target, **_):
        return [digit_share(c, t) for c, t in zip(completions, target)]

    accum = max(1, (n_prompts * G) // TRL_MICRO)
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=10**6,
            disable_tqdm=True,
            seed=1,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            num_generations=G,
            max_completion_length=MAX_TOKENS,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_iterations=EPOCHS,
            per_device_train_batch_size=min(TRL_MICRO, n_prompts * G),
            gradient_accumulation_steps=accum,
            max_steps=steps * EPOCHS,
            dataloader_num_workers=0,
            shuffle_dataset=False,
            gradient_checkpointing=False,  # TRL turns it on by default; off is faster here (nothing to save)
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
        marks: list[float] = []
        cpu: list[float] = []
        gen_s: list[float] = []
        prep_s: list[float] = []

        class Marks(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                if state.global_step % EPOCHS == 0:
                    marks.append(time.perf_counter())
                    cpu.append(time.process_time())

            def on_train_end(self, args, state, control, **kw):
                marks.append(time.perf_counter())
                cpu.append(time.process_time())

        real_gen, real_prep = trainer._generate, trainer._generate_and_score_completions

        def timed_gen(*a, **kw):
            t0 = time.perf_counter()
            try:
                return real_gen(*a, **kw)
            finally:
                gen_s.append(time.perf_counter() - t0)

        def timed_prep(*a, **kw):
            t0 = time.perf_counter()
            try:
                return real_prep(*a, **kw)
            finally:
                prep_s.append(time.perf_counter() - t0)

        trainer._generate, trainer._generate_and_score_completions = timed_gen, timed_prep
        trainer.add_callback(Marks())
        t_begin = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t_begin
    step_s = [b - a for a, b in zip(marks[:-1], marks[1:])]
    cpu_s = [b - a for a, b in zip(cpu[:-1], cpu[1:])]
    stages = {"rollout": gen_s[1:], "rewards+old log-probs": [p - g for p, g in zip(prep_s[1:], gen_s[1:])]}
    stages["update"] = [s - sum(v[i] for v in stages.values()) for i, s in enumerate(step_s[1:])]
    return {
        "tool": "TRL",
        "step_s": step_s[1:],
        "cpu_s": cpu_s[1:],
        "stages": stages,
        "rss_mb": _rss_mb(),
        "wall_s": wall,
        "optimizer_steps": trainer.state.global_step,
    }


# --------------------------------------------------------------------------- driver


def child(tool: str, steps: int, scale: int, layout: str) -> dict:
    cmd = [sys.executable, __file__, "--one", tool, "--steps", str(steps), "--scale", str(scale), "--layout", layout]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} x{scale} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternate(runs: int, steps: int, scale: int, layout: str) -> tuple[list[dict], list[dict]]:
    """``runs`` srpo-graph and TRL processes, alternated (A B A B ...)."""
    ours, theirs = [], []
    for i in range(runs):
        order = ("srpo", "trl") if i % 2 == 0 else ("trl", "srpo")
        for tool in order:
            r = child(tool, steps, scale, layout)
            (ours if tool == "srpo" else theirs).append(r)
            print(
                f"  x{scale} run {i + 1} {r['tool']}: {1000 * statistics.median(r['step_s']):.0f} ms/step, "
                f"{r['rss_mb']:.0f} MB",
                flush=True,
            )
    return ours, theirs


def _med(r: dict) -> float:
    return statistics.median(r["step_s"])


def _cpu(r: dict) -> float:
    """Median CPU time (this process, all threads) per step: what the step costs, whatever else
    ran on the shared cores meanwhile."""
    return statistics.median(r["cpu_s"])


def _ratio(xs: list[float]) -> str:
    return f"**{statistics.median(xs):.2f}x** ({min(xs):.2f}-{max(xs):.2f})"


def _shares(results: list[dict]) -> str:
    total = sum(sum(r["step_s"]) for r in results)
    names = list(results[0]["stages"])
    parts = [f"{n} {100 * sum(sum(r['stages'][n]) for r in results) / total:.0f}%" for n in names]
    other = 100 - sum(100 * sum(sum(r["stages"][n]) for r in results) / total for n in names)
    return ", ".join(parts) + (f", other {other:.0f}%" if abs(other) >= 0.5 else "")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="processes per tool at 1x (alternated)")
    ap.add_argument("--steps", type=int, default=20, help="steps per process at 1x (fewer at larger batches)")
    ap.add_argument("--scales", default="1,2,4,8")
    ap.add_argument("--layout", default="auto", help="srpo-graph's optim.layout")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--one", choices=("srpo", "trl"), help=argparse.SUPPRESS)  # child process mode
    ap.add_argument("--scale", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        out = run_srpo(args.steps, args.scale, args.layout) if args.one == "srpo" else run_trl(args.steps, args.scale)
        print(json.dumps(out))
        return out
    scales = [int(s) for s in args.scales.split(",")]
    res: dict[int, tuple[list[dict], list[dict]]] = {}
    for scale in scales:
        runs = args.runs if scale == 1 else max(2, args.runs // 2)
        steps = max(4, args.steps // scale) if scale > 1 else args.steps
        res[scale] = alternate(runs, steps, scale, args.layout)
    ours1, theirs1 = res[1]
    p6 = [_med(a) / _med(b) for a, b in zip(ours1, theirs1)]
    p6_cpu = [_cpu(a) / _cpu(b) for a, b in zip(ours1, theirs1)]
    sys.path.insert(0, str(Path(__file__).parent))
    import trl
    from _perfdoc import machine, write_result, write_section

    lines = [
        "## P6 / P7: a training step vs TRL's GRPOTrainer (benchmarks/bench_vs_trl.py)",
        "",
        f"Same work in both: the tiny model, {PROMPTS} prompts x G={G} completions of up to {MAX_TOKENS} tokens per "
        f"step, "
        f"the same Python reward, {EPOCHS} epochs with one optimizer step each, Adam lr {LR:g}, no KL, fp32, one "
        f"thread; "
        f"srpo-graph trains `benchmarks/workloads/single16.wf` (`optim.layout={args.layout}`), TRL {trl.__version__} "
        f"runs "
        f"`GRPOTrainer` (`num_iterations={EPOCHS}`, `beta=0`). Median step time per process (first step left out), "
        f"wall and CPU (the process's own CPU time, all threads: "
        f"robust to the other jobs on the shared cores); "
        f"whole processes alternated A B A B, {len(ours1)} per tool at 1x; ratio = median of the per-pair ratios "
        f"(min-max); {machine()}; **the 2 cores were shared with other engineers' jobs**, so absolute times are noisy.",
        "",
        "| quantity | srpo-graph | TRL | srpo-graph / TRL (min-max) |",
        "|---|---|---|---|",
        f"| P6: step time, 1x ({PROMPTS * G} completions) | {1000 * statistics.median(map(_med, ours1)):.0f} ms | "
        f"{1000 * statistics.median(map(_med, theirs1)):.0f} ms | {_ratio(p6)} |",
        f"| P6: CPU time per step, 1x | {1000 * statistics.median(map(_cpu, ours1)):.0f} ms | "
        f"{1000 * statistics.median(map(_cpu, theirs1)):.0f} ms | {_ratio(p6_cpu)} |",
        f"| peak RSS, 1x | {statistics.median(r['rss_mb'] for r in ours1):.0f} MB | "
        f"{statistics.median(r['rss_mb'] for r in theirs1):.0f} MB | "
        f"{_ratio([a['rss_mb'] / b['rss_mb'] for a, b in zip(ours1, theirs1)])} |",
    ]
    if 4 in res:
        ours4, theirs4 = res[4]
        p7 = [a["rss_mb"] / b["rss_mb"] for a, b in zip(ours4, theirs4)]
        grow_o = statistics.median(r["rss_mb"] for r in ours4) / statistics.median(r["rss_mb"] for r in ours1)
        grow_t = statistics.median(r["rss_mb"] for r in theirs4) / statistics.median(r["rss_mb"] for r in theirs1)
        lines.append(
            f"| P7: peak RSS, 4x rollout batch, fixed micro-batch budget | "
            f"{statistics.median(r['rss_mb'] for r in ours4):.0f} MB ({grow_o:.2f}x of 1x) | "
            f"{statistics.median(r['rss_mb'] for r in theirs4):.0f} MB ({grow_t:.2f}x of 1x) | {_ratio(p7)} |"
        )
    lines += [
        "",
        "Stage shares of the step time (1x, all runs):",
        "",
        f"* srpo-graph: {_shares(ours1)}",
        f"* TRL: {_shares(theirs1)}",
        "",
    ]
    if max(res) > 1:
        lines += [
            f"At {max(res)}x:",
            "",
            f"* srpo-graph: {_shares(res[max(res)][0])}",
            f"* TRL: {_shares(res[max(res)][1])}",
            "",
        ]
    lines += [
        "CPU time per step as the rollout batch grows (prompts per step x G=8; median over processes; "
        "per-completion time relative to 1x in brackets: 1.00 = linear), and the ratios:",
        "",
        "| batch | completions | srpo-graph CPU / step | TRL CPU / step | CPU: srpo-graph / TRL (min-max) "
        "| wall: srpo-graph / TRL (min-max) |",
        "|---|---|---|---|---|---|",
    ]
    base_o, base_t = statistics.median(map(_cpu, ours1)), statistics.median(map(_cpu, theirs1))
    for scale, (ours, theirs) in res.items():
        mo, mt = statistics.median(map(_cpu, ours)), statistics.median(map(_cpu, theirs))
        ratio = [_med(a) / _med(b) for a, b in zip(ours, theirs)]
        ratio_cpu = [_cpu(a) / _cpu(b) for a, b in zip(ours, theirs)]
        lines.append(
            f"| {scale}x | {PROMPTS * G * scale} | {1000 * mo:.0f} ms ({mo / base_o / scale:.2f}) | "
            f"{1000 * mt:.0f} ms ({mt / base_t / scale:.2f}) | {_ratio(ratio_cpu)} | {_ratio(ratio)} |"
        )
    text = "\n".join(lines)
    print(text)
    compile_share = sum(sum(r["stages"]["compile"]) for r in ours1) / sum(sum(r["step_s"]) for r in ours1)
    summary = {
        "p6": p6,
        "p6_cpu": p6_cpu,
        "p7": p7 if 4 in res else None,
        "compile_share": compile_share,
        "layout": args.layout,
        "step_ms": {
            "srpo-graph": 1000 * statistics.median(map(_med, ours1)),
            "TRL": 1000 * statistics.median(map(_med, theirs1)),
        },
        "cpu_ms": {
            "srpo-graph": 1000 * statistics.median(map(_cpu, ours1)),
            "TRL": 1000 * statistics.median(map(_cpu, theirs1)),
        },
        "scaling": {str(s): [_med(a) / _med(b) for a, b in zip(*r)] for s, r in res.items()},
        "scaling_cpu": {str(s): [_cpu(a) / _cpu(b) for a, b in zip(*r)] for s, r in res.items()},
    }
    if not args.no_doc:
        write_section("vs_trl", text)
        write_result("vs_trl", summary)
        write_result("vs_trl_runs", {str(s): {"srpo-graph": r[0], "TRL": r[1]} for s, r in res.items()})
    return summary


if __name__ == "__main__":
    main()
