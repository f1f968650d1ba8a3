"""The regime study (issue 38): where does the set ratio's normalisation K^alpha matter?

Run: ``python benchmarks/study.py --plan regime [--jobs 2] [--report]`` (``study.py`` dispatches here).

Adam cancels a uniform scale of the gradient, so on a workflow whose sets all have one size alpha acts
only through the clip (and, with overlapped rollouts, through the behaviour weight); at the k5 study's
budget the clip touched <= 3% of sets and nothing separated. This plan looks for the regime where the
clip is substantial, then compares the objectives there, in five stages, each resumable seed by seed
(one JSON record per run under ``benchmarks/results/study-regime/<workflow>/<setting>/<objective>/``):

1. **scan** (``SCAN``): every setting (workflow = set size K, epochs per batch, learning rate,
   staleness) x the objectives x ``SCAN_SEEDS`` seeds on the tiny model's coordination tasks. Each run
   records the clipped share of sets by size, the set log-ratio's spread by size (its root mean square,
   ``loss/log_ratio_rms/k<K>``), the grad-norm coefficient of variation and held-out accuracy.
2. **compare**: the settings :func:`select` picks from the scan (clipped share >= ``CLIP_BAR`` under
   ``srpo`` and learning above chance), on seeds ``0 .. COMPARE_SEEDS - 1`` (the scan's seeds reused).
3. **replicate**: every contrast with p < 0.05 there, on the disjoint seeds ``REPLICATION_OFFSET ..``:
   only a contrast that holds there (same sign, p < 0.05) is stated as a finding.
4. **without the grad-norm clip**: each replicated contrast again on the first seeds with
   ``optim.grad_clip=0``: alpha also decides how often the global grad-norm clip rescales a step (the
   set gradient is K^(1-alpha) times the mean member's), so this tells that channel from the set clip.
5. **report**: the ``regime`` section of docs/results.md and its plots, from the records alone.

Statistics, one run and its record are :mod:`study`'s (``run_one`` through ``_run_cell``: a
setting is a :class:`study.Plan` with its epochs, lr and trainer overrides, so its key keeps the
records of different settings apart).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import study
from study import Plan

CHANCE = 0.1  # the coordination tasks: a uniform digit per agent sums to the target mod 10 one time in ten
CLIP_BAR = 0.10  # "substantial": a setting whose srpo runs clip at least this share of the largest sets
LEARN_BAR = 0.05  # "learns": the best objective's held-out area at least this far above chance
SCAN_SEEDS = 2
COMPARE_SEEDS = 8
REPLICATION_OFFSET = 100
GRAD_CLIP = 1.0  # the trainer's default optim.grad_clip (the global grad-norm clip), which every run here uses
MAX_SETTINGS = 2  # settings compared (one per workflow at most): what ~2 h of CPU allows
ALPHA = {"srpo_sum": 0.0, "srpo": 0.5, "srpo_mean": 1.0}  # the set-ratio objectives
OBJECTIVES = ("srpo_sum", "srpo", "srpo_mean", "grpo", "independent", "dr_mas")
LABEL = {
    "srpo_sum": "sum (alpha 0)",
    "srpo": "sqrt K (alpha 1/2)",
    "srpo_mean": "mean (alpha 1)",
    "grpo": "GRPO per member",
    "independent": "independent (K = 1 ratio)",
    "dr_mas": "Dr. MAS",
}
# (a, b): a - b, paired by seed; the paper's ordering is sqrt K > sum > mean
CONTRASTS = (
    ("srpo", "srpo_sum"),
    ("srpo", "srpo_mean"),
    ("srpo_sum", "srpo_mean"),
    ("srpo", "grpo"),
    ("srpo", "independent"),
)
# the budget of every run: the coord plan's tiny model and batch (8 tasks x 8 samples), 60 steps,
# held-out accuracy (64 tasks x 4 samples) at steps 20, 40 and 60
BASE = Plan(
    "regime", (), OBJECTIVES, seeds=SCAN_SEEDS, steps=60, coord_steps=60, eval_every=20, eval_tasks=64, eval_samples=4
)


@dataclass(frozen=True)
class Setting:
    """One point of the scan: a workflow (its set size), epochs per batch, learning rate, staleness."""

    workflow: str
    epochs: int
    lr: float
    staleness: int = 0
    grad_clip: float | None = None  # None: the trainer's default optim.grad_clip (GRAD_CLIP); 0 turns it off

    @property
    def name(self) -> str:
        gc = "" if self.grad_clip is None else f"-gc{self.grad_clip:g}"
        return f"e{self.epochs}-lr{self.lr:g}-s{self.staleness}{gc}"

    @property
    def k(self) -> int:
        """The workflow's largest set size."""
        return max(len(t.consume) for t in study._workflow(self.workflow).transitions)

    def plan(self) -> Plan:
        """The setting as a :class:`study.Plan` (its key tells its records from other settings')."""
        over: tuple[str, ...] = (
            (f"rollout.max_staleness={self.staleness}", "rollout.worker=true") if self.staleness else ()
        )
        if self.grad_clip is not None:
            over += (f"optim.grad_clip={self.grad_clip:g}",)
        return replace(BASE, workflows=(self.workflow,), epochs=self.epochs, coord_lr=self.lr, overrides=over)

    def cells(self) -> tuple[str, ...]:
        """The objectives run here, less those whose run is another's bit for bit (``study.same_as``)."""
        return self.plan().cells(self.workflow)


SCAN_WORKFLOWS = ("coord_par2", "coord_par3", "coord_par5", "coord_par8", "coord_mixed")
SCAN = tuple(
    [Setting(wf, e, 1e-3) for wf in SCAN_WORKFLOWS for e in (1, 2, 4, 8)]
    + [Setting(wf, e, 3e-3) for wf in SCAN_WORKFLOWS for e in (2, 4)]
    + [Setting(wf, 2, 1e-3, s) for wf in ("coord_par3", "coord_par5") for s in (1, 2)]
)


# --------------------------------------------------------------------------- what a record says


def by_size(diagnostics: dict[str, float], stem: str) -> dict[int, float]:
    """A run's ``loss/<stem>/k<K>`` diagnostics (each the mean over steps of the step's value, all epochs
    together; the per-epoch keys ``loss/epoch<E>/...`` are left out) by set size K.

    >>> by_size({"loss/clip_upper/k2": 0.1, "loss/epoch2/clip_upper/k2": 0.3, "loss/clip_upper/k1": 0.0}, "clip_upper")
    {1: 0.0, 2: 0.1}
    """
    out = {}
    for key, v in diagnostics.items():
        m = re.fullmatch(rf"loss/{stem}/k(\d+)", key)
        if m:
            out[int(m.group(1))] = float(v)
    return dict(sorted(out.items()))


def clip_share(diagnostics: dict[str, float]) -> dict[int, float]:
    """The share of items (sets, for the set ratio) the clip touched, by set size: above plus below
    (exclusive: an item is clipped above only with A > 0, below only with A < 0).

    >>> clip_share({"loss/clip_upper/k2": 0.1, "loss/clip_lower/k2": 0.05})
    {2: 0.15000000000000002}
    """
    up, lo = by_size(diagnostics, "clip_upper"), by_size(diagnostics, "clip_lower")
    return {k: up[k] + lo.get(k, 0.0) for k in up}


def raw_spread(diagnostics: dict[str, float], objective: str) -> dict[int, float]:
    """The spread (root mean square) of the set's summed member log-ratio by set size: the logged
    spread of the normalised log-ratio times K^alpha (the per-member objectives' items are members, K^0).

    >>> raw_spread({"loss/log_ratio_rms/k4": 0.1}, "srpo")
    {4: 0.2}
    """
    alpha = ALPHA.get(objective, 0.0)
    return {k: v * k**alpha for k, v in by_size(diagnostics, "log_ratio_rms").items()}


def spread_slope(points: dict[int, float]) -> float:
    """The least-squares slope of log spread against log K (0.5: a sum of K independent log-ratios).

    >>> round(spread_slope({2: 0.2 * 2**0.5, 8: 0.2 * 8**0.5}), 6)
    0.5
    """
    xs = [math.log(k) for k, v in points.items() if v > 0]
    ys = [math.log(v) for v in points.values() if v > 0]
    if len(xs) < 2:
        return float("nan")
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def grad_clipped_share(grad_norms: list[float], clip: float = GRAD_CLIP) -> float:
    """The share of logged step gradient norms (taken before the clip) above the global grad-norm clip.

    >>> grad_clipped_share([0.5, 1.5, 2.0, 0.9])
    0.5
    """
    return sum(g > clip for g in grad_norms) / len(grad_norms) if grad_norms else 0.0


def summarize(setting: Setting, records: list[dict]) -> dict:
    """One setting's runs, per objective (means over seeds): clipped share and spread at the largest set
    size, grad-norm CV, held-out area and final accuracy."""
    k = setting.k
    per: dict[str, dict] = {}
    for obj in setting.cells():
        rs = [r for r in records if r["objective"] == obj]
        if not rs:
            continue
        per[obj] = {
            "seeds": sorted(r["seed"] for r in rs),
            "clip": statistics.mean(clip_share(r["diagnostics"]).get(k, 0.0) for r in rs),
            "clip_by_k": {
                kk: statistics.mean(clip_share(r["diagnostics"]).get(kk, 0.0) for r in rs)
                for kk in sorted({kk for r in rs for kk in clip_share(r["diagnostics"])})
            },
            "spread": statistics.mean(raw_spread(r["diagnostics"], obj).get(k, 0.0) for r in rs),
            "grad_cv": statistics.mean(r["grad_norm_cv"] for r in rs if r["grad_norm_cv"] is not None)
            if any(r["grad_norm_cv"] is not None for r in rs)
            else float("nan"),
            # the share of steps whose gradient norm (before the clip) exceeds the global grad-norm clip:
            # there the clip rescales the step's gradient before Adam, a channel alpha acts through at any epochs
            "grad_clipped": statistics.mean(grad_clipped_share(r["grad_norm"]) for r in rs),
            "area": statistics.mean(study.mean_accuracy(r) for r in rs),
            "final": statistics.mean(study.final_accuracy(r) for r in rs),
            "is_std": statistics.mean(r["diagnostics"].get(f"loss/is_weight_std/k{k}", 0.0) for r in rs),
        }
    return {"setting": setting, "k": k, "objectives": per}


def select(summaries: list[dict], bar: float = CLIP_BAR, learn: float = LEARN_BAR, most: int = MAX_SETTINGS) -> list:
    """The settings to compare: those without staleness whose ``srpo`` runs clip at least ``bar`` of the
    largest sets and whose best objective's held-out area is at least ``learn`` above chance (a contrast in
    learning needs learning); per workflow the one that clips most; then the ``most`` that clip most.

    >>> S = lambda wf, e: Setting(wf, e, 1e-3)
    >>> row = lambda s, clip, area: {"setting": s, "objectives": {"srpo": {"clip": clip, "area": area}}}
    >>> [s.name for s in select([row(S("a", 2), 0.05, 0.5), row(S("a", 4), 0.2, 0.5), row(S("a", 8), 0.3, 0.5),
    ...                          row(S("b", 8), 0.4, 0.11), row(S("c", 4), 0.12, 0.3)])]
    ['e8-lr0.001-s0', 'e4-lr0.001-s0']
    """
    best: dict[str, tuple[float, Setting]] = {}
    for row in summaries:
        s, per = row["setting"], row["objectives"]
        if s.staleness or "srpo" not in per:
            continue
        clip, area = per["srpo"]["clip"], max(o["area"] for o in per.values())
        if clip >= bar and area - CHANCE >= learn and (s.workflow not in best or clip > best[s.workflow][0]):
            best[s.workflow] = (clip, s)
    return [s for _, s in sorted(best.values(), key=lambda cs: -cs[0])][:most]


def contrast_rows(setting: Setting, records: list[dict], seeds: list[int]) -> list[dict]:
    """The plan's contrasts in one setting, paired by seed over ``seeds`` (those both objectives have):
    a - b in held-out area (the primary measure: the mean of the evaluations at 20, 40 and 60 steps) and
    in final accuracy, with bootstrap intervals, sign-flip p and the seeds that would resolve the
    observed difference (``study.seeds_needed`` at effect = the observed mean)."""
    by = {(r["objective"], r["seed"]): r for r in records}
    out = []
    for a, b in CONTRASTS:
        if a not in setting.cells() or b not in setting.cells():
            continue
        both = [s for s in seeds if (a, s) in by and (b, s) in by]
        if len(both) < 2:
            continue
        row: dict = {"setting": setting.name, "workflow": setting.workflow, "a": a, "b": b, "seeds": both}
        for what, f in (("area", study.mean_accuracy), ("final", study.final_accuracy)):
            xa, xb = [f(by[(a, s)]) for s in both], [f(by[(b, s)]) for s in both]
            d = [x - y for x, y in zip(xa, xb)]
            row[what] = study.paired_comparison(xa, xb)
            row[f"{what}_needed"] = study.seeds_needed(statistics.stdev(d), effect=abs(row[what][0]), max_seeds=999)
        out.append(row)
    return out


def replicated(first: dict, again: dict | None) -> bool | None:
    """Whether a contrast significant on the first seeds (area p < 0.05) holds on fresh ones: the same sign
    and p < 0.05 there (None: not significant at first, or the replication not run yet).

    >>> replicated({"area": (0.05, 0.01, 0.09, 0.01)}, {"area": (0.03, 0.0, 0.06, 0.04)})
    True
    >>> replicated({"area": (0.05, 0.01, 0.09, 0.01)}, {"area": (-0.01, -0.04, 0.02, 0.5)})
    False
    """
    if first["area"][3] >= 0.05 or again is None:
        return None
    return again["area"][3] < 0.05 and (again["area"][0] > 0) == (first["area"][0] > 0)


# --------------------------------------------------------------------------- running


def _path(runs_dir: Path, s: Setting, obj: str, seed: int) -> Path:
    return runs_dir / s.workflow / s.name / obj / f"seed{seed}.json"


def _key(s: Setting) -> tuple[str, str]:
    return s.plan().key(s.workflow), study.inputs_digest(s.workflow)


def load(runs_dir: Path, s: Setting, seeds: list[int]) -> list[dict]:
    """The saved records of setting ``s`` on ``seeds`` (made under its key)."""
    key = _key(s)
    out = []
    for obj in s.cells():
        for seed in seeds:
            rec = study._load(_path(runs_dir, s, obj, seed), key)
            if rec is not None:
                out.append(rec)
    return out


def _jobs_for(runs_dir: Path, cells: list[tuple[Setting, str, int]], fresh: bool) -> list[tuple]:
    """The calls that make the missing records of ``cells`` (seed by seed, as given)."""
    calls = []
    for s, obj, seed in cells:
        path = _path(runs_dir, s, obj, seed)
        if fresh or study._load(path, _key(s)) is None:
            calls.append((study._run_cell, s.workflow, obj, seed, s.plan(), runs_dir, path, _key(s)))
    return calls


def _missing(runs_dir: Path, cells: list[tuple[Setting, str, int]]) -> list[tuple[Setting, str, int]]:
    return [c for c in cells if study._load(_path(runs_dir, *c), _key(c[0])) is None]


def _run(runs_dir: Path, cells: list[tuple[Setting, str, int]], jobs: int, fresh: bool, what: str) -> None:
    calls = _jobs_for(runs_dir, cells, fresh)
    print(f"{what}: {len(cells) - len(calls)} of {len(cells)} runs saved, {len(calls)} to run", flush=True)

    def log(i: int, rec: dict) -> None:
        c = calls[i]
        print(
            f"  {c[1]:12s} {c[4].epochs}ep lr{c[4].coord_lr:g} {c[4].overrides[:1]} {c[2]:12s} seed {c[3]}: "
            f"clip {clip_share(rec['diagnostics'])}  area {study.mean_accuracy(rec):.3f}  ({rec['seconds']:.0f} s)",
            flush=True,
        )

    study._each(jobs, calls, log)


def stages(runs_dir: Path, *, jobs: int = 1, fresh: bool = False, run: bool = True) -> dict:
    """Run (``run``) or read the stages; returns what the report needs, with the runs still missing."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    scan_seeds = list(range(SCAN_SEEDS))
    scan_cells = [(s, o, seed) for seed in scan_seeds for s in SCAN for o in s.cells()]
    if run:
        _run(runs_dir, scan_cells, jobs, fresh, "scan")
    scan = [summarize(s, load(runs_dir, s, scan_seeds)) for s in SCAN]
    todo = _missing(runs_dir, scan_cells)
    chosen = select(scan) if not todo else []
    compare_seeds = list(range(COMPARE_SEEDS))
    cmp_cells = [(s, o, seed) for seed in compare_seeds for s in chosen for o in s.cells()]
    if run and chosen:
        _run(runs_dir, cmp_cells, jobs, fresh, f"compare ({', '.join(f'{s.workflow} {s.name}' for s in chosen)})")
    todo += _missing(runs_dir, cmp_cells)
    first = [r for s in chosen for r in contrast_rows(s, load(runs_dir, s, compare_seeds), compare_seeds)]
    rep_seeds = list(range(REPLICATION_OFFSET, REPLICATION_OFFSET + COMPARE_SEEDS))
    significant = [c for c in first if c["area"][3] < 0.05 and len(c["seeds"]) == COMPARE_SEEDS]
    by_name = {s.name + s.workflow: s for s in chosen}
    rep_cells = sorted(
        {
            (by_name[c["setting"] + c["workflow"]], o, seed)
            for c in significant
            for o in (c["a"], c["b"])
            for seed in rep_seeds
        },
        key=lambda c: (c[2], c[0].workflow, c[0].name, c[1]),
    )
    if run and rep_cells:
        _run(runs_dir, rep_cells, jobs, fresh, "replication")
    todo += _missing(runs_dir, rep_cells)
    again = {}
    for s in chosen:
        for c in contrast_rows(s, load(runs_dir, s, rep_seeds), rep_seeds):
            again[(c["workflow"], c["setting"], c["a"], c["b"])] = c
    # 4. each replicated contrast again on the first seeds without the global grad-norm clip: is the set clip
    # the channel, or the grad-norm clip (which alpha also decides, Note in the report's reading)?
    held = [c for c in first if replicated(c, again.get((c["workflow"], c["setting"], c["a"], c["b"])))]
    off = {(c["workflow"], c["setting"]): replace(by_name[c["setting"] + c["workflow"]], grad_clip=0.0) for c in held}
    abl_cells = sorted(
        {
            (off[(c["workflow"], c["setting"])], o, seed)
            for c in held
            for o in (c["a"], c["b"])
            for seed in compare_seeds
        },
        key=lambda c: (c[2], c[0].workflow, c[1]),
    )
    if run and abl_cells:
        _run(runs_dir, abl_cells, jobs, fresh, "without the grad-norm clip")
    todo += _missing(runs_dir, abl_cells)
    ablation = []
    for c in held:
        s_off = off[(c["workflow"], c["setting"])]
        recs = load(runs_dir, s_off, compare_seeds)
        rows = [r for r in contrast_rows(s_off, recs, compare_seeds) if (r["a"], r["b"]) == (c["a"], c["b"])]
        ablation += [{**r, "of": c["setting"], "records": recs} for r in rows]
    return {
        "scan": scan,
        "chosen": chosen,
        "compare": [{**c, "again": again.get((c["workflow"], c["setting"], c["a"], c["b"]))} for c in first],
        "ablation": ablation,
        "todo": [(s.workflow, s.name, o, seed) for s, o, seed in todo],
        "records": {
            (s.workflow, s.name): load(runs_dir, s, sorted(set(scan_seeds + compare_seeds + rep_seeds))) for s in SCAN
        },
    }


def main(runs_dir: Path, out: Path, *, jobs: int = 1, fresh: bool = False, run: bool = True) -> int:
    """``study.py --plan regime``: run (or resume) the stages, then write the page's section and plots."""
    import study_regime_report as report_regime

    t0 = time.perf_counter()
    data = stages(runs_dir, jobs=jobs, fresh=fresh, run=run)
    command = "python benchmarks/study.py --plan regime" + (f" --jobs {jobs}" if jobs > 1 else "")
    report_regime.write(data, runs_dir, out, command)
    study._save(
        runs_dir / "summary.json",
        {
            "chosen": [s.__dict__ for s in data["chosen"]],
            "compare": data["compare"],
            "todo": data["todo"],
            "seconds": time.perf_counter() - t0,
        },
    )
    print(json.dumps({"chosen": [f"{s.workflow} {s.name}" for s in data["chosen"]], "todo": len(data["todo"])}))
    return 0
