"""Regenerate docs/performance.md: every benchmark, then the P1-P7 summary at the top.

Usage: ``python benchmarks/run_all.py [--quick] [--only NAME ...] [--summary-only]``

Runs each benchmark script in its own process (one thread each; they write their own section
of docs/performance.md and their headline numbers to ``benchmarks/results/NAME.json``), then
writes the summary section from those JSON files. ``--summary-only`` rewrites the summary from
the saved results without measuring. ``--quick`` runs fewer repeats (a smoke run, noisier).
``bench_vs_trl.py`` needs TRL: ``pip install -e ".[bench]" -c benchmarks/constraints.txt``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _perfdoc import read_result, write_section  # noqa: E402

# name -> (script, full arguments, quick arguments); run in this order
BENCHES = {
    "compile": ("bench_compile.py", [], ["--repeat", "1"]),
    "loss": ("bench_loss.py", [], ["--repeat", "3"]),
    "memory": ("bench_memory.py", [], []),
    "rollout": ("bench_rollout.py", [], ["--repeats", "2"]),
    "layouts": ("bench_layouts.py", [], ["--rounds", "3"]),
    "train": ("bench_train.py", [], ["--steps", "4"]),
    "vs_trl": ("bench_vs_trl.py", [], ["--runs", "2", "--steps", "8", "--scales", "1,4"]),
    "profile": ("profile_overheads.py", [], ["--repeats", "3"]),
}
COMMANDS = {name: f"python benchmarks/{script}" for name, (script, _, _) in BENCHES.items()}


def _rng(lo: float, hi: float) -> str:
    return f"{lo:.2f}-{hi:.2f}x"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("**met**" if ok else "**missed**")


def summary() -> str:
    """The P1-P7 table from ``benchmarks/results/*.json`` (rows without results say so)."""
    rows = []
    r = read_result("rollout")
    if r:
        one = {k: v["ratio"] for k, v in r.items() if isinstance(v, dict) and k.startswith("coord")}
        many = {k: v["ratio"] for k, v in r.items() if isinstance(v, dict) and not k.startswith("coord")}
        rows.append(
            (
                "P1",
                "rollout: executor / raw batched generate, 1-token outputs (worst case)",
                f"{min(one.values()):.2f}-{max(one.values()):.2f}x over {len(one)} workflows"
                + (
                    f"; multi-token ({', '.join(many)}): {', '.join(f'{v:.2f}x' for v in many.values())}"
                    if many
                    else ""
                ),
                ">= 0.90x",
                _met(min(one.values()) >= 0.90),
                COMMANDS["rollout"],
            )
        )
    c, t = read_result("compile"), read_result("vs_trl")
    if c or t:
        parts = []
        if c:
            parts.append(f"compile / TRL-style padded build {c['ratio']:.2f}x")
        if t and t.get("compile_share") is not None:
            parts.append(f"compile = {100 * t['compile_share']:.1f}% of the P6 step")
        ok = None if not t or t.get("compile_share") is None else t["compile_share"] <= 0.02
        rows.append(
            (
                "P2",
                "compile: traces -> SetBatch",
                "; ".join(parts),
                "<= 2% of a step",
                _met(ok),
                f"{COMMANDS['compile']}; {COMMANDS['vs_trl']}",
            )
        )
    r = read_result("loss")
    if r:
        rows.append(
            (
                "P3",
                "objective: srpo_loss fwd+bwd / plain padded GRPO loss (no model)",
                f"{r['ratio']:.2f}x ({r['ratio_no_diagnostics']:.2f}x without diagnostics)",
                "~1x",
                "-",
                COMMANDS["loss"],
            )
        )
    r = read_result("memory")
    if r:
        rows.append(
            (
                "P4",
                "memory of log-probs + backward, one micro-batch: SetBatch padded layout / TRL-style padded",
                f"{r['padded_layout'] / r['padded_trl']:.2f}x (packed layout: {r['packed'] / r['padded_trl']:.2f}x)",
                "<= 1x",
                _met(r["padded_layout"] <= r["padded_trl"]),
                COMMANDS["memory"],
            )
        )
    r = read_result("layouts")
    if r:
        rows.append(
            (
                "P5",
                f"update fwd+bwd tokens/s, default layout ({r['auto']}) / raw padded fwd+bwd",
                f"{r['p5']:.2f}x ({_rng(r['p5_min'], r['p5_max'])}); packed row: {1 / r['packed_over_auto']:.2f}x of "
                f"it",
                ">= 0.85x",
                _met(r["p5"] >= 0.85),
                COMMANDS["layouts"],
            )
        )
    if t:
        import statistics

        p6, p6c = t["p6"], t.get("p6_cpu") or t["p6"]
        rows.append(
            (
                "P6",
                "training step time, srpo-graph / TRL GRPOTrainer (same work)",
                f"CPU time {statistics.median(p6c):.2f}x ({_rng(min(p6c), max(p6c))}), "
                f"wall {statistics.median(p6):.2f}x ({_rng(min(p6), max(p6))}); "
                f"per step CPU {t['cpu_ms']['srpo-graph']:.0f} vs {t['cpu_ms']['TRL']:.0f} ms, "
                f"wall {t['step_ms']['srpo-graph']:.0f} vs {t['step_ms']['TRL']:.0f} ms",
                "<= 0.70x (CPU time)",
                _met(statistics.median(p6c) <= 0.70),
                COMMANDS["vs_trl"],
            )
        )
        if t.get("p7"):
            p7 = t["p7"]
            rows.append(
                (
                    "P7",
                    "peak RSS at 4x the rollout batch (fixed micro-batch budget), srpo-graph / TRL",
                    f"{statistics.median(p7):.2f}x ({_rng(min(p7), max(p7))})",
                    "<= 1.1x",
                    _met(statistics.median(p7) <= 1.1),
                    COMMANDS["vs_trl"],
                )
            )
    lines = [
        "## Summary: P1-P7 (benchmarks/run_all.py)",
        "",
        "Each row is a ratio measured within one run of its benchmark (the sections below give the details, the "
        "machine and the method). Regenerate everything with `python benchmarks/run_all.py` (TRL: "
        '`pip install -e ".[bench]" -c benchmarks/constraints.txt`). The machine has 2 cores and **was shared with '
        "other engineers' jobs** while these ran (load average 3-12): absolute times are noisy, so ratios come from "
        "alternated runs, and timings are CPU time of the measured process (`process_time`) where the sections say so; "
        "P6 is judged on CPU time, its wall-time ratio is shown beside it.",
        "",
        "| row | quantity | measured (min-max) | target | | command |",
        "|---|---|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} | {e} | `{f}` |" for a, b, c, d, e, f in rows],
    ]
    lines += _why_missed(rows)
    return "\n".join(lines)


def _why_missed(rows: list[tuple]) -> list[str]:
    """For each missed row, the reason as its profile shows it (benchmarks/profile_overheads.py)."""
    missed = {r[0] for r in rows if r[4] == "**missed**"}
    prof, out = read_result("profile"), []
    if "P1" in missed and prof:
        worst = min(prof["rollout"], key=lambda r: r["model_us"] / (r["model_us"] + r["python_us"]))
        parts = sorted(worst["parts_us"].items(), key=lambda kv: -kv[1])
        out.append(
            f"* **P1** (profile): with 1-token outputs the model costs ~{worst['model_us']:.0f} us per output "
            f"({worst['name']}) and the executor's own Python ~{worst['python_us']:.0f} us; >= 0.90x would allow "
            f"{0.11 * worst['model_us']:.0f} us. The Python is spread over every stage of an output's life, none "
            "dominant: " + ", ".join(f"{k} {v:.1f} us" for k, v in parts[:5]) + ". Each part is already one pass "
            "with cached lookups (rounds 2-3); the rest is the per-output objects themselves (a typed record, "
            "a request, a firing with its reward call). Reaching 0.90x needs the per-output work batched across "
            "episodes (columnar records), a redesign of the executor and trace, not a local fix. With "
            "multi-token outputs (search) the model dominates and the ratio is high."
        )
    if "P2" in missed and prof:
        c = prof["compile"]
        out.append(
            f"* **P2** (profile): compile is per-episode Python, {c['per_episode_us']:.0f} us per episode "
            f"({c['compile_ms']:.1f} ms for {c['episodes']}); own time: "
            + ", ".join(f"`{k}` {100 * v:.0f}%" for k, v in c["top"][:4])
            + ". Its share rose because the update got ~8x faster (P5); the step is now ~0.1-0.2 s for "
            "128 short episodes, the worst case for a per-episode cost."
        )
    for row, text in (
        ("P5", "the update's time is in the model's forward and backward (see the P5 table)"),
        ("P6", "see the stage shares in the P6 section"),
        ("P7", "see the P7 section"),
    ):
        if row in missed:
            out.append(f"* **{row}**: {text}.")
    return ["", "Missed targets, and why:", "", *out] if out else []


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", choices=list(BENCHES))
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args(argv)
    if not args.summary_only:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        for name, (script, full, quick) in BENCHES.items():
            if args.only and name not in args.only:
                continue
            print(f"== {name}: {script}", flush=True)
            subprocess.run(
                [sys.executable, str(HERE / script), *(quick if args.quick else full)],
                check=True,
                env=env,
                cwd=HERE.parent,
            )
    text = summary()
    write_section("summary", text, first=True)
    print(text)


if __name__ == "__main__":
    main()
