"""Trainer stage: PNG plots of a run, drawn from ``RUN_DIR/metrics.jsonl`` (matplotlib, Agg).

Consumes the metric records; produces ``RUN_DIR/plots/{reward,transition_rewards,routes,clip,ratio,kl,grad_norm}.png``.
Each plot is declared in :data:`PLOTS` as a title, a y-label and the regular expressions of the
metric names it draws, so a new diagnostic of the objective shows up without code changes
(e.g. every ``loss/clip_frac_upper/k3`` is one line of the clip plot).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from srpo_graph.train.observe.metrics import read_metrics


@dataclass(frozen=True)
class PlotSpec:
    """One figure: lines for every metric name matching one of ``patterns``."""

    filename: str
    title: str
    ylabel: str
    patterns: tuple[str, ...]
    logy: bool = False


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "reward.png",
        "Episode reward (train rollouts and held-out eval)",
        "mean reward",
        (r"^reward$", r"^eval/reward$"),
    ),
    PlotSpec(
        "transition_rewards.png",
        "Reward per transition (and per route label of a router)",
        "mean reward",
        (r"^reward/[^/]+(/[^/]+)?$",),
    ),
    PlotSpec(
        "routes.png",
        "Route choices: share of each router's firings per label",
        "share of firings",
        (r"^route/[^/]+/[^/]+$",),
    ),
    PlotSpec(
        "clip.png", "Clip fraction by set size", "fraction of events clipped", (r"^loss/clip_(upper|lower)/k\d+$",)
    ),
    PlotSpec(
        "clip_epochs.png",
        "Clip fraction per inner epoch (epoch 1 starts at ratio 1)",
        "fraction of items clipped",
        (r"^loss/epoch\d+/clip_frac$",),
    ),
    PlotSpec(
        "clip_agents.png",
        "Clip fraction per agent (share of its tokens whose item was clipped)",
        "fraction of tokens",
        (r"^loss/clip_(upper|lower)/(?!k\d+$)[^/]+$",),
    ),
    PlotSpec(
        "ratio.png",
        "Set ratio statistics (over the step's loss calls)",
        "ratio",
        (r"^loss/ratio_(min|max)$", r"^loss/ratio_mean/k\d+$"),
    ),
    PlotSpec(
        "kl.png",
        "KL and sampler/trainer mismatch",
        "nats",
        (r"^loss/approx_kl_k3$", r"^loss/ref_kl$", r"^mismatch/(mean|max)_abs$"),
        logy=True,
    ),
    PlotSpec(
        "mismatch_agents.png",
        "Sampler/trainer log-prob gap per agent (|old - sampler| per token)",
        "nats",
        (r"^mismatch/[^/]+/(mean|max)_abs$",),
        logy=True,
    ),
    PlotSpec("grad_norm.png", "Gradient norm per policy (before clipping)", "L2 norm", (r"^grad_norm/.*",), logy=True),
)
MAX_LINES = 12  # more lines than this make a plot unreadable: keep the first ones by name


def _series(records: Sequence[dict[str, Any]], patterns: Sequence[str]) -> dict[str, tuple[list[float], list[float]]]:
    regexes = [re.compile(p) for p in patterns]
    names = sorted({k for r in records for k in r if any(rx.search(k) for rx in regexes)})
    out = {}
    for name in names[:MAX_LINES]:
        xs, ys = [], []
        for r in records:
            v = r.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(r["step"])
                ys.append(float(v))
        if xs:
            out[name] = (xs, ys)
    return out


def draw_plots(run_dir: str | Path, specs: Sequence[PlotSpec] = PLOTS) -> list[Path]:
    """Redraw every plot of ``run_dir``; returns the PNG files written (plots with no data skipped).

    Args:
        run_dir: a run folder holding ``metrics.jsonl``.
        specs: the plots to draw.
    Returns:
        Paths of the PNG files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        series = _series(records, spec.patterns)
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        for name, (xs, ys) in series.items():
            marker = "o" if len(xs) < 30 else None
            ax.plot(xs, ys, label=name, marker=marker, markersize=3, linewidth=1.5)
        if spec.logy:
            positive = [y for _, ys in series.values() for y in ys if y > 0]
            if positive and len(positive) == sum(len(ys) for _, ys in series.values()):
                ax.set_yscale("log")
            elif positive:  # zeros present (e.g. an exact mismatch of 0): log scale away from 0
                ax.set_yscale("symlog", linthresh=min(positive))
        ax.set_title(spec.title)
        ax.set_xlabel("step")
        ax.set_ylabel(spec.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = out_dir / spec.filename
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
