"""A trained solver against a frozen verifier (issue 28): the reward curve and the paired held-out gains.

Run (after training the seeds and evaluating them in one ``srpo-graph eval``, docs/results.md
"A trained solver against a frozen verifier" gives the commands):

    python benchmarks/frozen_verifier.py --runs runs/frozen-verifier --eval evals/frozen-verifier \
        --plot docs/img/frozen_verifier_reward.png

Reads each run folder's ``metrics.jsonl`` (``<runs>/seed<k>``) and the eval's ``eval.json`` (sources
``base`` and every run, the same tasks, samples and seed), pairs every run with ``base`` by
``srpo_graph.eval.score.compare`` (``srpo-graph eval --compare``'s code: paired bootstrap over
problems, sign-flip p), and prints a markdown table; draws the train reward per step (each seed, and
the mean over seeds smoothed over 10 steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def reward_curves(runs: Path) -> dict[str, list[float]]:
    """{run folder name: train reward per step} for every ``<runs>/seed*`` with metrics."""
    out = {}
    for d in sorted(runs.glob("seed*")):
        f = d / "metrics.jsonl"
        if f.is_file():
            rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
            out[d.name] = [float(r["reward"]) for r in rows if isinstance(r.get("reward"), (int, float))]
    return out


def smooth(xs: list[float], w: int = 10) -> list[float]:
    """Trailing mean over ``w`` steps (fewer at the start).

    >>> smooth([0.0, 1.0, 2.0, 3.0], 2)
    [0.0, 0.5, 1.5, 2.5]
    """
    return [statistics.mean(xs[max(0, i - w + 1): i + 1]) for i in range(len(xs))]


def table(eval_json: Path) -> list[str]:
    """Markdown rows: each source's Avg@k and Pass@k with 95% intervals, and each run minus ``base``, paired."""
    from srpo_graph.eval.score import EvalReport, compare

    reports = [EvalReport.model_validate(r) for r in json.loads(eval_json.read_text(encoding="utf-8"))["reports"]]
    base = next(r for r in reports if r.label == "base")
    k = base.samples
    lines = [
        f"| source | Avg@{k} (95% CI) | Pass@{k} (95% CI) | Avg@{k} - base, paired [95% CI], p |",
        "|---|---|---|---|",
    ]
    for r in reports:
        avg, pk = r.overall.avg, r.overall.pass_at.get(k)
        diff = "-"
        if r is not base:
            d = compare(base, r).diffs["avg"]
            diff = f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}], p={d.p:.3f}"
        lines.append(
            f"| {r.label} | {avg.value:.3f} [{avg.low:.3f}, {avg.high:.3f}] | "
            + (f"{pk.value:.3f} [{pk.low:.3f}, {pk.high:.3f}]" if pk else "-")
            + f" | {diff} |"
        )
    return lines


def breakdown(eval_dir: Path) -> list[str]:
    """Markdown rows from the eval's traces (``traces/<i>.jsonl``, the i-th report's episodes): how often the
    solver's own solution is right (the same ``solution_correct`` the reward applies to the verifier's; its
    difference to ``base`` paired by problem as ``compare`` pairs Avg@k: bootstrap over problems, sign-flip
    p), how often the frozen verifier copies it word for word, and the verifier's accuracy after a right and
    after a wrong solution: what the verifier passes on of what the solver learned."""
    from srpo_graph.eval.score import bootstrap_indices, ratio_interval, sign_flip_p
    from srpo_graph.models.sft_data import solution_correct

    labels = [r["label"] for r in json.loads((eval_dir / "eval.json").read_text(encoding="utf-8"))["reports"]]
    lines = [
        "| source | solver right (- base, paired [95% CI], p) | verifier right | verifier copies the solver | "
        "verifier right after a right / a wrong solution |",
        "|---|---|---|---|---|",
    ]
    per_problem: dict[str, list[float]] = {}  # base's solver accuracy per problem
    for i, label in enumerate(labels):
        n = sr = vr = copy = 0
        after = {True: [0, 0], False: [0, 0]}
        solver: dict[str, list[float]] = {}
        for line in (eval_dir / "traces" / f"{i}.jsonl").read_text(encoding="utf-8").splitlines():
            ep = json.loads(line)
            text = {o["agent"]: o.get("text") or "" for o in ep["outputs"]}
            s_ok = solution_correct(text.get("solver", ""), _gold(ep["task_id"])) == 1.0
            v_ok = solution_correct(text.get("verifier", ""), _gold(ep["task_id"])) == 1.0
            n, sr, vr, copy = n + 1, sr + s_ok, vr + v_ok, copy + (text.get("solver") == text.get("verifier"))
            after[s_ok][0] += v_ok
            after[s_ok][1] += 1
            solver.setdefault(ep["task_id"], []).append(float(s_ok))
        acc = {t: sum(v) / len(v) for t, v in solver.items()}
        diff = ""
        if label == "base":
            per_problem = acc
        elif per_problem:
            d = [acc[t] - per_problem[t] for t in per_problem]
            lo, hi = ratio_interval(d, [1.0] * len(d), bootstrap_indices(len(d), seed=0))
            diff = f" ({sum(d) / len(d):+.3f} [{lo:+.3f}, {hi:+.3f}], p={sign_flip_p(d, seed=0):.3f})"
        rate = {k: v[0] / v[1] if v[1] else float("nan") for k, v in after.items()}
        lines.append(
            f"| {label} | {sr / n:.3f}{diff} | {vr / n:.3f} | {copy / n:.3f} | {rate[True]:.3f} / {rate[False]:.3f} |"
        )
    return lines


_TASKS: dict[str, str] = {}


def _gold(task_id: str) -> str:
    """The gold answer of a held-out tinymath task (workflows/tasks/tinymath_eval.jsonl)."""
    if not _TASKS:
        path = Path(__file__).resolve().parents[1] / "workflows" / "tasks" / "tinymath_eval.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                t = json.loads(line)
                _TASKS[t["id"]] = t["answer"]
    return _TASKS[task_id]


def plot(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, lw=0.7, alpha=0.35, label=name)
    n = min(len(ys) for ys in curves.values())
    mean = [statistics.mean(ys[i] for ys in curves.values()) for i in range(n)]
    ax.plot(range(1, n + 1), smooth(mean), color="black", lw=2, label="mean over seeds, 10-step mean")
    ax.set_xlabel("step")
    ax.set_ylabel("train reward (verifier's answer right)")
    ax.set_title("tinymath_frozen_verifier: solver trained, verifier frozen", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="folder of run folders seed<k>")
    ap.add_argument("--eval", type=Path, help="an `srpo-graph eval` output folder (its eval.json)")
    ap.add_argument("--plot", type=Path, help="where to draw the reward curve (PNG)")
    args = ap.parse_args(argv)
    curves = reward_curves(args.runs)
    for name, ys in curves.items():
        q = max(1, len(ys) // 4)
        print(
            f"{name}: {len(ys)} steps, train reward first {q} steps {statistics.mean(ys[:q]):.3f}, "
            f"last {q} {statistics.mean(ys[-q:]):.3f}"
        )
    if curves and args.plot:
        plot(curves, args.plot)
        print(f"wrote {args.plot}")
    if args.eval:
        print("\n".join(table(args.eval / "eval.json")))
        print()
        print("\n".join(breakdown(args.eval)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
