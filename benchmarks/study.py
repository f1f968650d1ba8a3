"""The objectives study: objectives x workflows x seeds on the locally pre-trained model, with statistics.

Run: ``python benchmarks/study.py [--quick | --smoke | --plan NAME] [--jobs N] [--seeds N] [--seed-offset N]
[--runs-dir DIR] [--out docs/results.md] [--report]``
(no plan flag: the full study, the plans of ``FULL`` in turn; ``--plan k5``: the paper's K = 5 ablation,
Note [The K = 5 ablation]; ``--seed-offset 100``: the same plan on seeds 100.., a replication).

A results benchmark, not a test (``.ci/run`` runs ``--quick``; the test suite runs ``--smoke`` on a
shrunken model). Every run trains one CPU workflow of
``workflows/tinymath_*.wf`` (policy ``tiny-reason``) / ``tinysearch.wf`` (policy ``tiny-search``), models
pre-trained locally (``srpo-graph init-model --recipe NAME``), under one objective (a row of
``srpo_graph.srpo.objectives.OBJECTIVES``, selected with the trainer's ``objective=NAME``; nothing
else differs: same steps, batch, lr, clip, seeds) and records:

* held-out accuracy (the headline): the mean reward of sampled episodes on the workflow's
  ``*_eval.jsonl`` tasks (problems neither pre-training nor RL saw), at step 0 (the pre-trained
  model, measured once per workflow and seed) and every ``eval_every`` steps;
* the train reward per step, and diagnostics by set size from the loss (clip fraction upper/lower,
  log-ratio mean and |max|), the grad-norm coefficient of variation over the run, and on the
  routed workflows the share of episodes the router sends to each specialist (or subset, or end)
  and, where a ``choices`` router picks the set, that set's mean size per step.

Each run's record is one JSON file under ``--runs-dir`` (``<workflow>/<objective>/seed<k>.json``),
written when the run ends: an interrupted study resumes where it stopped (``--fresh`` reruns). It runs
seed by seed (a seed's evaluations before RL, then its cells), so a study stopped part way has whole
seeds; ``--report`` runs nothing and writes the page from the records saved so far (while a study runs:
its section marked partial, naming the cells and seeds done). A plan with the paper's numbers
(``PAPER``: the k5 plan) puts its table beside them and says, pair by pair, which ordering reproduces.
The analysis reports, per (workflow, objective): mean final held-out accuracy over seeds with a
95% t-interval, and for every objective a paired comparison to ``srpo`` (same seeds, so same initial
sampling and task order: bootstrap interval, exact sign-flip p) with a power estimate (the seeds that would
resolve a 1.5-point gap at the observed spread), then writes ``docs/results.md`` and the plots. Held-out
accuracy is scored by ``srpo-graph eval``'s code (``srpo_graph/eval/score.py``): Avg@k with k =
``eval_samples``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-reason"
PLACEHOLDER = "<!-- study sections: written by benchmarks/study.py -->"


@dataclass(frozen=True)
class Plan:
    """One study's budget: the same for every objective (the coordination tasks' tiny model has its own)."""

    name: str
    workflows: tuple[str, ...]
    objectives: tuple[str, ...]
    seeds: int
    steps: int
    tasks_per_step: int = 8
    samples: int = 8  # G, episodes per task (the group)
    epochs: int = 2
    lr: float = 1e-4  # Note [One learning rate]
    eval_every: int = 10
    eval_tasks: int = 64  # held-out tasks per evaluation
    eval_samples: int = 2  # sampled episodes per held-out task
    # the tiny model's coord_par* workflows (random weights, one-token members, ~0.1 s a step): the
    # trainer's default lr, as benchmarks/bench_objectives.py
    coord_steps: int = 40
    coord_lr: float = 1e-3
    coord_samples: int = 8
    # seeds seed_offset .. seed_offset + seeds - 1 (`--seed-offset`: a replication on disjoint seeds
    # saves its records beside the first ones, seed<k>.json, and writes its own section of the page)
    seed_offset: int = 0
    # `--pool`: every seed with saved records, from all the sets of seeds run so far (a report, never a run)
    pooled: tuple[int, ...] = ()
    # (workflow, objectives) pairs: a workflow run under fewer objectives than the plan's (the K = 1
    # baseline of the k5 plan runs `srpo` alone)
    objectives_on: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # ((workflow, objective), (workflow, objective)) pairs compared seed by seed besides the `vs srpo`
    # columns (K = 5 against K = 1)
    contrasts: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = ()
    # more trainer overrides for every run (the regime plan's `rollout.max_staleness=1`: benchmarks/study_regime.py)
    overrides: tuple[str, ...] = ()

    @property
    def seed_list(self) -> list[int]:
        """The seeds this plan runs (or, pooled, reports)."""
        return list(self.pooled) if self.pooled else list(range(self.seed_offset, self.seed_offset + self.seeds))

    @property
    def section(self) -> str:
        """The name of the plan's section of the results page (a replication's names its seeds)."""
        if self.pooled:
            return f"{self.name}-pooled"
        return self.name if not self.seed_offset else f"{self.name}-seeds{self.seed_offset}-{self.seed_list[-1]}"

    def key(self, workflow: str) -> str:
        """What a saved run of ``workflow`` must match to be reused: everything but the lists of cells,
        and the version of each pre-trained model the workflow runs (a rebuilt model invalidates its records)."""
        from srpo_graph.models.recipes import RECIPES

        d = asdict(self)
        # what selects cells, not how a cell runs (and fields added later: old records stay valid)
        for k in ("name", "workflows", "objectives", "seeds", "seed_offset", "pooled", "objectives_on", "contrasts"):
            d.pop(k)
        if not d["overrides"]:  # added later: the records of plans without overrides stay valid
            d.pop("overrides")
        d["model"] = "+".join(f"{m}-v{RECIPES[m].version}" for m in recipes_of(workflow) or (MODEL,))
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def budget(self, workflow: str) -> tuple[int, float, int]:
        """(steps, lr, samples) of one workflow's runs."""
        if workflow.startswith("coord"):
            return self.coord_steps, self.coord_lr, self.coord_samples
        return self.steps, self.lr, self.samples

    def cells(self, workflow: str) -> tuple[str, ...]:
        """The objectives run on ``workflow``, less those that are the same run as another one there
        (:func:`same_as`): they are not rerun, and the tables say whose run they are."""
        only = dict(self.objectives_on).get(workflow, self.objectives)
        return tuple(o for o in self.objectives if o in only and same_as(workflow, o, self.objectives) is None)


ALL_WORKFLOWS = ("tinymath_pipeline", "tinymath_mixed", "tinymath_routed", "tinymath_select", "tinysearch")
ALL_OBJECTIVES = ("srpo", "srpo_sum", "srpo_mean", "independent", "grpo", "gspo", "dr_mas")
COORD = ("coord_par2", "coord_par3", "coord_par4", "coord_par5")
# every active set has one member: srpo = srpo_sum = srpo_mean = independent there, bit for bit
K1_WORKFLOWS = frozenset({"tinymath_pipeline", "tinymath_routed", "tinysearch"})
SAME_AT_K1 = ("srpo_sum", "srpo_mean", "independent")
PLANS = {
    # the CPU math workflows x 7 objectives x 5 seeds (the select workflow's router picks its sets' sizes)
    "math": Plan(
        "math",
        ("tinymath_mixed", "tinymath_pipeline", "tinymath_routed", "tinymath_select"),
        ALL_OBJECTIVES,
        seeds=5,
        steps=40,
    ),
    # multi-turn search on the word-level searcher (`tiny-search`), the same budget (a run: ~2 min here with
    # --jobs 2)
    "search": Plan("search", ("tinysearch",), ALL_OBJECTIVES, seeds=5, steps=40),
    # the parallel coordination tasks at K = 2..5 on the (untrained) tiny model, x 7 objectives x 10 seeds
    # (cheap: 10-12 s a run, ~26 min with --jobs 2): one set of K members per episode, one-token members
    "coord": Plan("coord", COORD, ALL_OBJECTIVES, seeds=10, steps=40, coord_steps=100, eval_samples=8),
    # the objectives on the mixed workflow alone (set sizes 2 and 1, where alpha matters)
    "mixed": Plan("mixed", ("tinymath_mixed",), ALL_OBJECTIVES, seeds=5, steps=40),
    # the objectives on the routed workflow (every set has size 1)
    "routed": Plan("routed", ("tinymath_routed",), ALL_OBJECTIVES, seeds=5, steps=40),
    # do the math workflows learn given more steps? SRPO alone, 2 seeds, 80 steps
    "long": Plan("long", ("tinymath_pipeline", "tinymath_mixed"), ("srpo",), seeds=2, steps=80, eval_every=20),
    # small (<= 5 min here once the model is built; CI runs it): the mixed workflow, three objectives, 2 seeds
    "quick": Plan(
        "quick",
        ("tinymath_mixed",),
        ("srpo", "srpo_mean", "grpo"),
        seeds=2,
        steps=6,
        eval_every=3,
        eval_tasks=32,
        tasks_per_step=4,
        samples=4,
    ),
    # does RL help at all? SRPO alone on the three math workflows, 3 seeds
    "learn": Plan("learn", ("tinymath_routed", "tinymath_mixed", "tinymath_pipeline"), ("srpo",), seeds=3, steps=40),
    # the paper's K = 5 ablation (Note [The K = 5 ablation]): sqrt K vs sum vs mean, GRPO and Dr. MAS on five
    # searchers consumed together, SRPO on one searcher (K = 1); one budget; Avg@16 on the held-out questions
    "k5": Plan(
        "k5",
        ("tinysearch_k5", "tinysearch"),
        ("srpo", "srpo_sum", "srpo_mean", "grpo", "dr_mas"),
        seeds=10,
        steps=20,
        eval_every=20,
        eval_tasks=64,
        eval_samples=16,
        objectives_on=(("tinysearch", ("srpo",)),),
        contrasts=(
            (("tinysearch", "srpo"), ("tinysearch_k5", "srpo")),
            (("tinysearch_k5", "srpo_mean"), ("tinysearch_k5", "srpo")),
            (("tinysearch_k5", "srpo_sum"), ("tinysearch_k5", "srpo")),
        ),
    ),
    # CI: every code path once (two objectives, one workflow, 2 seeds, 2 steps)
    "smoke": Plan(
        "smoke",
        ("tinymath_mixed",),
        ("srpo", "grpo"),
        seeds=2,
        steps=2,
        tasks_per_step=2,
        samples=2,
        epochs=1,
        eval_every=2,
        eval_tasks=4,
        eval_samples=1,
    ),
}

# the full study (no flag): these plans in turn, each writing its own section of docs/results.md and
# saving its runs under benchmarks/results/study-<plan>/ (rerun to resume; ~110 min in all with --jobs 2 on an idle
# 2-core machine)
FULL = ("math", "coord", "search")

# Note [The K = 5 ablation]. The paper's distinctive claim (Avg@16 on multi-turn search, five searchers
# consumed together: sqrt K 40.1 > sum 38.6 > K = 1 37.2 > mean 34.7) on tinysearch_k5.wf, with the K = 1
# baseline tinysearch.wf, both on `tiny-search`. The budget is the search plan's (8 tasks x G = 8, 2 epochs,
# lr 1e-4: Note [One learning rate], never tuned for one objective) for 20 steps, and one evaluation at the
# end: 64 held-out questions x 16 samples, Avg@16, scored by `srpo-graph eval`'s code (the trainer's
# eval.every); before RL likewise. Sized (not measured: the plan has not run yet) from the search plan's 2
# min per K = 1 run of 40 steps: a K = 5 episode generates ~4x the tokens (five searchers and a reader per
# round), so ~4 min per K = 5 run of 20 steps plus ~1 min per Avg@16 evaluation; 50 K = 5 runs, 10 K = 1
# runs and 20 evaluations before RL: ~2.2 h with --jobs 2. `--seed-offset 100` replicates it on seeds
# 100-109. The power estimate (`seeds_needed`) from the search plan's per-seed differences to srpo (sd
# 0.011-0.023, 5 seeds, docs/results.md) says 7-21 seeds resolve 1.5 points on K = 1 search, so 10 seeds
# resolve gaps of ~1.1-2.3 points there; K = 5's own spread is unknown until the plan runs, and its section
# prints the estimate per comparison.

# Note [One learning rate]. One budget for every objective and math workflow: lr 1e-4, 8 tasks x
# G = 8 samples per step, 2 epochs. It replaced lr 3e-4 with G = 4 (the first study's), under which
# the pipeline and the mixed workflow did not learn in 30 or 80 steps. It was picked once, before
# any run of this study, from probes with `srpo` alone on seed 0 (every objective then gets it):
# a solver-alone workflow rewarded for the right answer stayed flat for 150 steps at 3e-4 / G = 4
# (train reward 0.33, held-out 0.28) while its greedy accuracy fell from 0.56 to 0.27 and its
# arithmetic steps from 65% to 33% right: Adam's lr-sized steps on a 648k-parameter model with a
# noisy 32-episode gradient walk it off its pre-trained arithmetic. At 5e-5 and 1e-4 with G = 8 it
# learned (train 0.31 -> 0.45, held-out 0.39 / 0.43 at step 100), and so did the pipeline (held-out
# 0.28 -> 0.41-0.44 by step 60-80). At 1e-3 (the trainer's default) the pipeline lost accuracy
# within 10 steps (0.28 -> 0.12, an earlier probe). The coordination tasks keep the trainer's
# default, 1e-3, on their random-weight tiny model.

# two-sided 95% t critical values, df = 1..30 (df > 30: 1.96)
T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
# one-sided 80% t quantiles (the power term), df = 1..30 (df > 30: 0.8416)
T80 = (
    1.376,
    1.061,
    0.978,
    0.941,
    0.920,
    0.906,
    0.896,
    0.889,
    0.883,
    0.879,
    0.876,
    0.873,
    0.870,
    0.868,
    0.866,
    0.865,
    0.863,
    0.862,
    0.861,
    0.860,
    0.859,
    0.858,
    0.858,
    0.857,
    0.856,
    0.856,
    0.855,
    0.855,
    0.854,
    0.854,
)
EFFECT = 0.015  # the paper's smallest gap in its K = 5 ablation: sqrt K 40.1 vs sum 38.6 Avg@16 (1.5 points)
# the paper's numbers beside a plan's cells: ((workflow, objective), what the paper calls it, its Avg@16), in the
# paper's order (best first): its K = 5 ablation on multi-turn search (five searchers consumed together)
PAPER = {
    "k5": (
        (("tinysearch_k5", "srpo"), "sqrt K (alpha = 1/2)", 40.1),
        (("tinysearch_k5", "srpo_sum"), "sum (alpha = 0)", 38.6),
        (("tinysearch", "srpo"), "single searcher (K = 1)", 37.2),
        (("tinysearch_k5", "srpo_mean"), "mean (alpha = 1)", 34.7),
    ),
}


# --------------------------------------------------------------------------- statistics


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (nan with one value).

    >>> [round(v, 4) for v in mean_ci([0.2, 0.4])]
    [0.3, 1.2706]
    """
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    t = T975[len(xs) - 2] if len(xs) - 1 <= len(T975) else 1.96
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def _t_quantile(z: float, df: int) -> float:
    """Student's t quantile from the normal one ``z`` (Cornish-Fisher, two terms; |error| < 1e-4
    beyond the tables' 30 degrees of freedom)."""
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def seeds_needed(sd_diff: float, effect: float = EFFECT, max_seeds: int = 10_000) -> int:
    """Seeds a paired comparison needs to resolve a true mean difference ``effect`` (two-sided 5%
    test, 80% power) when per-seed differences spread with standard deviation ``sd_diff``: the
    smallest n with ``n >= ((t_.975,n-1 + t_.80,n-1) * sd / effect)^2`` (the paired t-test's sample
    size, iterated because t depends on n), and at least 6 (the sign-flip test's smallest p with n
    seeds is 2 / 2^n, above 0.05 below 6). ``max_seeds`` when ``effect`` is 0 or the spread nan.

    >>> seeds_needed(0.0), seeds_needed(0.015), seeds_needed(0.03)
    (6, 10, 32)
    """
    if not effect or not math.isfinite(sd_diff):
        return max_seeds
    for n in range(6, max_seeds):
        df = n - 1
        t = (T975[df - 1] if df <= len(T975) else _t_quantile(1.959964, df)) + (
            T80[df - 1] if df <= len(T80) else _t_quantile(0.841621, df)
        )
        if n >= (t * sd_diff / effect) ** 2:
            return n
    return max_seeds


def sign_flip_p(diffs: list[float], n: int = 100_000, seed: int = 0) -> float:
    """Two-sided p of a paired sign-flip (randomization) test of mean(diffs) = 0.

    Under the null each seed's difference is as likely to have either sign, so p is the share of
    the 2^k sign assignments whose mean is at least as far from 0 as the observed one: exact for
    k <= 16 seeds (enumerated), else ``n`` random assignments. No normality assumed; with k seeds
    the smallest p it can give is 2 / 2^k (0.0625 for 5 seeds, 0.002 for 10).

    >>> sign_flip_p([0.1, 0.2, 0.3, 0.1, 0.2])  # every seed better: 2 of 32 assignments as extreme
    0.0625
    >>> sign_flip_p([0.0, 0.0, 0.0])
    1.0
    """
    obs = abs(sum(diffs)) - 1e-12
    k = len(diffs)
    if k <= 16:
        signs = ([1 - 2 * ((m >> i) & 1) for i in range(k)] for m in range(2**k))
        hits = sum(abs(sum(s * d for s, d in zip(sg, diffs))) >= obs for sg in signs)
        return hits / 2**k
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= obs for _ in range(n))
    return (hits + 1) / (n + 1)


def paired_comparison(
    a: list[float], b: list[float], n: int = 10_000, seed: int = 0
) -> tuple[float, float, float, float]:
    """Mean of ``a - b`` over paired seeds, its bootstrap 95% interval, and the sign-flip test's p.

    >>> d, lo, hi, p = paired_comparison([0.5, 0.6, 0.7, 0.6, 0.5, 0.7], [0.1, 0.2, 0.3, 0.2, 0.2, 0.3])
    >>> round(d, 3), lo > 0, p
    (0.383, True, 0.03125)
    """
    diffs = [x - y for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    d = sum(diffs) / len(diffs)
    lo, hi = means[int(0.025 * n)], means[int(0.975 * n) - 1]
    return d, lo, hi, sign_flip_p(diffs)


def seed_ranges(seeds: list[int]) -> str:
    """Seeds as runs of consecutive numbers.

    >>> seed_ranges([0, 1, 2, 100, 101, 105])
    '0..2, 100..101, 105'
    """
    runs: list[list[int]] = []
    for x in sorted(seeds):
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def saved_seeds(plan: Plan, runs_dir: Path) -> list[int]:
    """The seeds whose evaluation before RL is saved, for this plan's budget and inputs (its key), for
    every one of the plan's workflows (``--pool``); a set of seeds run with another budget (``--steps``)
    or an older model is not this plan's, and is left out."""
    have = []
    for wf in plan.workflows:
        key = (plan.key(wf), inputs_digest(wf))
        seeds = set()
        for p in (runs_dir / wf).glob("start-seed*.json"):
            tail = p.stem.removeprefix("start-seed")
            if tail.isdigit() and _load(p, key) is not None:
                seeds.add(int(tail))
        have.append(seeds)
    return sorted(set.intersection(*have)) if have else []


# --------------------------------------------------------------------------- the workflows


@functools.lru_cache(maxsize=None)
def _workflow(workflow: str):
    """The parsed ``workflows/<workflow>.wf`` (parsed once: the plan's rules ask for it per cell)."""
    from srpo_graph.lang import load_workflow

    return load_workflow(ROOT / "workflows" / f"{workflow}.wf")


def recipes_of(workflow: str) -> tuple[str, ...]:
    """The pre-trained recipe models (``models.recipes.RECIPES``) the workflow's policies name."""
    from srpo_graph.models.recipes import RECIPES

    return tuple(sorted({p.model for p in _workflow(workflow).policies if p.model in RECIPES}))


def routers_of(workflow: str) -> tuple[tuple[str, ...], ...]:
    """What the workflow routes on, as paths: ``("router",)`` for ``activate: route router``,
    ``("searcher", "action")`` for ``activate: route searcher.action``."""
    return tuple(tuple(t.activate.on.path) for t in _workflow(workflow).transitions if t.activate.kind == "route")


def fires_once(workflow: str) -> bool:
    """Whether every agent fires exactly once in every episode and only the episode's end is rewarded:
    each transition activates fixed agents or the end (no route, no rounds) and has no reward of its
    own, and each agent is consumed by one transition and activated once (at the start or by one
    transition), every one reachable from the start. Then Dr. MAS's groups (task x agent) hold the
    episode rewards of GRPO's groups (task), so ``dr_mas`` is ``grpo``'s run, bit for bit."""
    wf = _workflow(workflow)
    agents = {a.name for a in wf.agents}
    consumed = [a for t in wf.transitions for a in t.consume]
    activated = [*wf.start, *(a for t in wf.transitions if t.activate.kind == "agents" for a in t.activate.agents)]
    if any(
        t.activate.kind not in ("agents", "end") or t.reward is not None or t.max_rounds is not None
        for t in wf.transitions
    ):
        return False
    if sorted(consumed) != sorted(agents) or sorted(activated) != sorted(agents):
        return False
    reached, todo = set(wf.start), list(wf.start)  # agents reachable from the start
    while todo:
        t = wf.transition_by_name[wf.consumer_of[todo.pop()]]  # consumer_of: agent -> its transition's name
        if t.activate.kind == "agents":
            for a in t.activate.agents:
                if a not in reached:
                    reached.add(a)
                    todo.append(a)
    return reached == agents


def one_token_one_event(workflow: str) -> bool:
    """Whether every episode is one event of one-token members: a single transition consumes every
    agent and ends the episode, and every agent writes one token. Then a member's log-ratio is its
    token's and the transition's return is the episode's, so ``independent`` (member ratio, the
    set's advantage) is ``grpo``'s run (token ratio, the episode's advantage), bit for bit."""
    wf = _workflow(workflow)
    return (
        len(wf.transitions) == 1
        and wf.transitions[0].activate.kind == "end"
        and fires_once(workflow)
        and all(a.sampling.max_tokens == 1 for a in wf.agents)
    )


def same_as(workflow: str, objective: str, objectives: tuple[str, ...]) -> str | None:
    """The objective of ``objectives`` whose run ``objective``'s run is on ``workflow`` (the same loss and
    advantages, so the same numbers bit for bit), or None when it must run itself:

    * every active set has one member (``K1_WORKFLOWS``): ``SAME_AT_K1`` are ``srpo``
      (tests/srpo/test_k1_identities.py);
    * every agent fires once (:func:`fires_once`): ``dr_mas`` is ``grpo``;
    * one event of one-token members (:func:`one_token_one_event`): ``independent`` is ``grpo``
      (tests/e2e/test_cpu_reason.py checks both on real rollouts).
    """
    if objective in SAME_AT_K1 and workflow in K1_WORKFLOWS and "srpo" in objectives:
        return "srpo"
    if objective == "dr_mas" and "grpo" in objectives and fires_once(workflow):
        return "grpo"
    if objective == "independent" and "grpo" in objectives and one_token_one_event(workflow):
        return "grpo"
    return None


def variable_sets_of(workflow: str) -> tuple[str, ...]:
    """The transitions whose active-set size varies from episode to episode (a ``choices`` router's subsets)."""
    return tuple(t.name for t in _workflow(workflow).transitions if len(t.set_sizes) > 1)


# --------------------------------------------------------------------------- one run


def _tasks_of(workflow: str, root: Path = ROOT) -> tuple[Path, Path]:
    stem = workflow.split("_")[0]  # tinymath_*, tinysearch, coord_par* (the tiny model's toy tasks)
    return root / "workflows" / "tasks" / f"{stem}.jsonl", root / "workflows" / "tasks" / f"{stem}_eval.jsonl"


def held_out_accuracy(workflow: str, plan: Plan, seed: int) -> dict[str, float]:
    """Held-out accuracy of the workflow's untrained policies (sampled, as declared): overall and per family."""
    from srpo_graph.backends import load_backend
    from srpo_graph.eval.score import score
    from srpo_graph.lang import load_workflow
    from srpo_graph.models import resolve_model
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(ROOT / "workflows" / f"{workflow}.wf")
    tasks = load_tasks(_tasks_of(workflow)[1], wf)[: plan.eval_tasks]
    backends = {p.name: load_backend("transformers", resolve_model(p.model), device="cpu") for p in wf.policies}
    # the trainer's eval seed rule for step 0 (config.seed * 7919 + step)
    res = run(wf, tasks, backends, samples=plan.eval_samples, seed=seed * 7919)
    # scored by `srpo-graph eval`'s code, as the trainer's evaluations are (Avg@k overall and per family)
    rep = score(wf, res.episodes, tasks, samples=plan.eval_samples, seed=seed * 7919)
    return dict(sorted({"all": rep.overall.avg.value, **{f: g.avg.value for f, g in rep.by_family.items()}}.items()))


def _route_shares(run_dir: Path, route: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per saved trace step: the share of episodes whose first output of the routing agent chose each
    label (``route``: the agent, then the output's field if the route reads one; a ``choices`` router's
    subset is one label, ``careful+quick``)."""
    agent, fields = route[0], route[1:]
    out = {}
    for f in sorted((run_dir / "traces").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1])):
        c: Counter = Counter()
        for line in f.read_text(encoding="utf-8").splitlines():
            ep = json.loads(line)
            picks = [o.get("value") for o in ep["outputs"] if o["agent"] == agent]
            pick = picks[0] if picks else "none"
            for name in fields:
                pick = pick.get(name, "none") if isinstance(pick, dict) else "none"
            c["+".join(pick) if isinstance(pick, list) else str(pick)] += 1
        n = sum(c.values())
        out[f.stem.split("_")[1]] = {k: v / n for k, v in sorted(c.items())}
    return out


def run_one(workflow: str, objective: str, seed: int, plan: Plan, runs_dir: Path) -> dict:
    """Train one cell and return its record (also what is saved as JSON)."""
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.observe.metrics import read_metrics
    from srpo_graph.train.trainer import train

    steps, lr, samples = plan.budget(workflow)
    routers, variable = routers_of(workflow), variable_sets_of(workflow)
    with tempfile.TemporaryDirectory(prefix="study-", dir=runs_dir) as tmp:
        cfg = load_config(
            None,
            [
                f"objective={objective}",
                f"steps={steps}",
                f"seed={seed}",
                f"run_dir={tmp}/run",
                "overwrite=true",
                f"rollout.tasks_per_step={plan.tasks_per_step}",
                f"rollout.samples={samples}",
                "rollout.device=cpu",
                f"rollout.eval_tasks={_tasks_of(workflow)[1]}",
                f"optim.epochs={plan.epochs}",
                f"optim.lr={lr}",
                f"eval.every={plan.eval_every}",
                "eval.mode=sampled",
                f"eval.samples={plan.eval_samples}",
                f"eval.num_tasks={plan.eval_tasks}",
                "checkpoint.every=0",
                "logging.progress=false",
                "logging.tensorboard=false",
                "logging.plots=false",
                f"logging.traces_every={plan.eval_every if routers else 0}",
                *plan.overrides,
            ],
        )
        t0 = time.perf_counter()
        summary = train(ROOT / "workflows" / f"{workflow}.wf", cfg)
        seconds = time.perf_counter() - t0
        rows = read_metrics(Path(summary.run_dir) / "metrics.jsonl")
        routes = _route_shares(Path(summary.run_dir), routers[0]) if routers else {}
    diag_keys = sorted({k for r in rows for k in r if k.startswith("loss/") and re.search(r"/k\d+$", k)})
    # grad_norm is logged per policy (flattened to grad_norm/<policy>); steps without an update have none
    grad = [float(v) for r in rows for k, v in r.items() if k.startswith("grad_norm/") and isinstance(v, (int, float))]
    return {
        "workflow": workflow,
        "objective": objective,
        "seed": seed,
        "seconds": seconds,
        "reward": [r.get("reward") for r in rows],
        "eval": [[int(s), float(v)] for s, v in summary.eval_rewards],
        "grad_norm": grad,
        "grad_norm_cv": statistics.pstdev(grad) / statistics.mean(grad)
        if len(grad) > 1 and statistics.mean(grad)
        else None,
        "diagnostics": {k: statistics.mean(float(r[k]) for r in rows if k in r) for k in diag_keys},
        "events_per_episode": statistics.mean(r["events"] / r["episodes"] for r in rows if r.get("episodes")),
        # mean active-set size per step (members / events): what a multi-choice router's choices do to the sets
        "set_size": [r["compile/members"] / r["compile/events"] for r in rows if r.get("compile/events")],
        "routes": routes,
        # per step, the mean set size of each transition whose size a router chooses (trainer's set_size/<name>)
        "router_set_size": {t: [r[f"set_size/{t}"] for r in rows if f"set_size/{t}" in r] for t in variable},
    }


# --------------------------------------------------------------------------- the study


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)  # atomic: a killed study leaves whole records only


def inputs_digest(workflow: str, root: Path = ROOT) -> str:
    """A digest of what a run of ``workflow`` reads besides the plan and the model: its ``.wf`` file and
    its train and held-out task files. A saved record is reused only under the same digest, so an
    edited workflow (a temperature, a prompt) or task file reruns its cells."""
    h = hashlib.sha256()
    for path in (root / "workflows" / f"{workflow}.wf", *_tasks_of(workflow, root)):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _load(path: Path, key: tuple[str, str]) -> dict | None:
    """The record at ``path`` if it was made under ``key``: (the plan's key, the inputs' digest)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if (data.get("plan"), data.get("inputs")) == key else None


def _start_cell(wf: str, plan: Plan, seed: int, path: Path, key: tuple[str, str]) -> dict:
    """One (workflow, seed)'s held-out accuracy before RL, saved to ``path`` (a worker's job).

    ``key`` is the plan's key as the parent process computed it: the parent decides what a saved
    record must match, whatever a worker's own imports say."""
    import torch

    torch.set_num_threads(1)
    rec = {"plan": key[0], "inputs": key[1], "accuracy": held_out_accuracy(wf, plan, seed)}
    _save(path, rec)
    return rec


def _run_cell(wf: str, obj: str, seed: int, plan: Plan, runs_dir: Path, path: Path, key: tuple[str, str]) -> dict:
    """One cell's run, saved to ``path`` (a worker's job; ``key`` as in :func:`_start_cell`)."""
    import torch

    torch.set_num_threads(1)
    rec = {**run_one(wf, obj, seed, plan, runs_dir), "plan": key[0], "inputs": key[1]}
    _save(path, rec)
    return rec


def _each(jobs: int, calls: list[tuple], log) -> list:
    """Run ``fn(*args)`` for every ``(fn, *args)`` in ``calls``, on ``jobs`` worker processes; results in order.

    ``log(i, result)`` is called as each finishes. Workers are spawned (not forked: a forked torch
    runtime can hang), one torch thread each, so ``jobs`` = the cores to use.
    """
    if jobs <= 1 or len(calls) <= 1:
        out = []
        for i, (fn, *args) in enumerate(calls):
            out.append(fn(*args))
            log(i, out[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # a spawned worker imports this module by name when it was imported as one
        sys.path.insert(0, here)

    results: list = [None] * len(calls)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(fn, *args): i for i, (fn, *args) in enumerate(calls)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            log(i, results[i])
    return results


def run_study(plan: Plan, runs_dir: Path, *, fresh: bool = False, jobs: int = 1, log=print, run: bool = True) -> dict:
    """Run (or resume) every cell of ``plan`` on ``jobs`` processes; returns {"start": ..., "runs": [...],
    "models": {recipe: its build info}, "todo": [cells not run yet]}.

    Every record is saved as it finishes, so a killed study resumes where it stopped. Seed by seed: a seed's
    evaluations before RL, then its runs, so a study stopped part way has whole seeds. ``run=False`` runs
    nothing: what the saved records hold (``--report``, the table of a study still running).
    """
    import torch

    from srpo_graph.models.recipes import default_dir, ensure_recipe_model, is_recipe_dir, recipe_info

    torch.set_num_threads(1)
    runs_dir.mkdir(parents=True, exist_ok=True)
    # built once, before any worker needs them (the coordination tasks' tiny model builds in a second);
    # the parent decides what a saved record must match (keys), whatever a worker's own imports say.
    # A report (run=False) builds nothing: it describes the models already built
    recipes = sorted({m for wf in plan.workflows for m in recipes_of(wf)})
    models = (
        {m: recipe_info(ensure_recipe_model(m, log=log)) for m in recipes}
        if run
        else {m: recipe_info(default_dir(m)) for m in recipes if is_recipe_dir(default_dir(m), m)}
    )
    keys = {wf: (plan.key(wf), inputs_digest(wf)) for wf in plan.workflows}
    start: dict = {}
    for wf in plan.workflows:
        for seed in plan.seed_list:
            rec = None if fresh else _load(runs_dir / wf / f"start-seed{seed}.json", keys[wf])
            if rec is not None:
                start[(wf, seed)] = rec["accuracy"]
    # seed outer, objective inner: machine load drifts over hours and should hit all objectives alike
    cells = [(wf, obj, seed) for seed in plan.seed_list for wf in plan.workflows for obj in plan.cells(wf)]
    saved: dict = {}
    for wf, obj, seed in cells:
        rec = None if fresh else _load(runs_dir / wf / obj / f"seed{seed}.json", keys[wf])
        if rec is not None:
            saved[(wf, obj, seed)] = rec
    if saved or start:
        log(
            f"{len(saved)} of {len(cells)} runs and {len(start)} of {len(plan.workflows) * plan.seeds} evaluations "
            f"before RL reused from {runs_dir}"
        )
    calls: list[tuple] = []  # (what, cell, call), seed by seed
    for seed in plan.seed_list:
        calls += [
            ("start", (wf, seed), (_start_cell, wf, plan, seed, runs_dir / wf / f"start-seed{seed}.json", keys[wf]))
            for wf in plan.workflows
            if (wf, seed) not in start
        ]
        calls += [
            ("run", c, (_run_cell, *c, plan, runs_dir, runs_dir / c[0] / c[1] / f"seed{c[2]}.json", keys[c[0]]))
            for c in cells
            if c[2] == seed and c not in saved
        ]

    def report(i: int, rec: dict) -> None:
        what, cell, _ = calls[i]
        if what == "start":
            start[cell] = rec["accuracy"]
            log(f"seed {cell[1]} {cell[0]:18s} held-out accuracy before RL {rec['accuracy']['all']:.3f}")
            return
        wf, obj, seed = cell
        saved[cell] = rec
        before = start.get((wf, seed), {}).get("all", float("nan"))
        log(
            f"seed {seed} {wf:18s} {obj:12s} held-out {before:.3f} -> {rec['eval'][-1][1]:.3f}  "
            f"({rec['seconds']:.0f} s)"
        )

    if run:
        _each(jobs, [call for _, _, call in calls], report)
    for wf in plan.workflows:
        got = [start[(wf, s)]["all"] for s in plan.seed_list if (wf, s) in start]
        if got:
            log(f"{wf}: held-out accuracy before RL {statistics.mean(got):.3f} ({len(got)} seeds)")
    return {
        "start": {f"{wf}/{s}": v for (wf, s), v in start.items()},
        "runs": [saved[c] for c in cells if c in saved],
        "models": models,
        "todo": [list(c) for c in cells if c not in saved],
    }


def final_accuracy(rec: dict) -> float:
    """The headline per run: the mean of the last two held-out evaluations (one if there is one)."""
    tail = [v for _, v in rec["eval"][-2:]]
    return sum(tail) / len(tail)


def mean_accuracy(rec: dict) -> float:
    """How fast a run learns: the mean of all its held-out evaluations (the area under its curve)."""
    return sum(v for _, v in rec["eval"]) / len(rec["eval"])


def _p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}" if p < 0.01 else f"p={p:.2f}"


def analyze(plan: Plan, data: dict) -> list[dict]:
    """One row per (workflow, objective): accuracy mean and CI, paired comparison to srpo, diagnostics."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in data["runs"]:
        cells[(r["workflow"], r["objective"])].append(r)
    rows = []
    for wf in plan.workflows:
        base_by_seed = {r["seed"]: r for r in cells.get((wf, "srpo"), [])}
        for obj in plan.cells(wf):
            # the seeds with a saved run and a saved evaluation before RL (all of them once the study is done)
            rs = sorted(
                (r for r in cells.get((wf, obj), []) if f"{wf}/{r['seed']}" in data["start"]), key=lambda r: r["seed"]
            )
            if not rs:
                continue
            start = [data["start"][f"{wf}/{r['seed']}"]["all"] for r in rs]
            acc = [final_accuracy(r) for r in rs]
            gain = [a - s for a, s in zip(acc, start)]
            m, ci = mean_ci(acc)
            gm, gci = mean_ci(gain)
            row = {
                "workflow": wf,
                "objective": obj,
                "seeds": len(rs),
                "seed_list": [r["seed"] for r in rs],
                "start": statistics.mean(start),
                "acc": m,
                "acc_ci": ci,
                "gain": gm,
                "gain_ci": gci,
                "per_seed": acc,
                "grad_cv": statistics.mean(r["grad_norm_cv"] for r in rs if r["grad_norm_cv"] is not None)
                if any(r["grad_norm_cv"] is not None for r in rs)
                else None,
                "diag": {
                    k: statistics.mean(r["diagnostics"][k] for r in rs if k in r["diagnostics"])
                    for k in sorted({k for r in rs for k in r["diagnostics"]})
                },
                "events_per_episode": statistics.mean(r["events_per_episode"] for r in rs),
                "set_size": (
                    statistics.mean(statistics.mean(r["set_size"][:5]) for r in rs),
                    statistics.mean(statistics.mean(r["set_size"][-5:]) for r in rs),
                )
                if all(r.get("set_size") for r in rs)
                else None,
                "seconds": statistics.mean(r["seconds"] for r in rs),
            }
            area = [mean_accuracy(r) for r in rs]
            row["area"], row["area_ci"] = mean_ci(area)
            # paired with srpo's run of the same seed (the seeds both have, part way through a study)
            both = [i for i, r in enumerate(rs) if r["seed"] in base_by_seed]
            if obj != "srpo" and both:
                base = [base_by_seed[rs[i]["seed"]] for i in both]
                acc, area = [acc[i] for i in both], [area[i] for i in both]
                base_acc = [final_accuracy(r) for r in base]
                row["vs_srpo"] = paired_comparison(acc, base_acc)
                row["area_vs_srpo"] = paired_comparison(area, [mean_accuracy(r) for r in base])
                row["paired_seeds"] = len(both)
                # the power estimate: seeds that would resolve the paper's 1.5-point gap at this spread
                diffs = [a - b for a, b in zip(acc, base_acc)]
                row["sd_diff"] = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
                row["seeds_needed"] = seeds_needed(row["sd_diff"])
            rows.append(row)
    return rows


def contrasts(plan: Plan, data: dict) -> list[dict]:
    """The plan's extra paired comparisons (``Plan.contrasts``: K = 5 against K = 1), seed by seed:
    B - A in final held-out accuracy, its bootstrap interval, the sign-flip p, and the power estimate."""
    out = []
    by = {(r["workflow"], r["objective"], r["seed"]): r for r in data["runs"]}
    for a, b in plan.contrasts:
        seeds = [s for s in plan.seed_list if (*a, s) in by and (*b, s) in by]
        if not seeds:
            continue
        xa = [final_accuracy(by[(*a, s)]) for s in seeds]
        xb = [final_accuracy(by[(*b, s)]) for s in seeds]
        sd = statistics.stdev([y - x for x, y in zip(xa, xb)]) if len(seeds) > 1 else float("nan")
        out.append(
            {
                "a": list(a),
                "b": list(b),
                "seeds": len(seeds),
                "diff": paired_comparison(xb, xa),
                "sd_diff": sd,
                "seeds_needed": seeds_needed(sd),
            }
        )
    return out


def replication_lines(original: list[dict], rows: list[dict]) -> list[str]:
    """For every comparison the original seeds reported as significant (p < 0.05: final accuracy or area
    vs srpo), whether it held on these (disjoint) seeds: same sign and p < 0.05, or not."""
    new = {(r["workflow"], r["objective"]): r for r in rows}
    lines = []
    for r in original:
        for key, what in (("vs_srpo", "final accuracy"), ("area_vs_srpo", "area")):
            if key not in r or r[key][3] >= 0.05:
                continue
            d0, p0 = r[key][0], r[key][3]
            m = new.get((r["workflow"], r["objective"]), {}).get(key)
            lines.append(
                f"- {r['workflow']} `{r['objective']}` vs `srpo`, {what}: {d0:+.3f}, {_p(p0)} on the first "
                f"seeds; on these seeds {_held(m, d0)}"
            )
    return lines


def _held(m, d0: float) -> str:
    """Whether a first-seeds difference ``d0`` (significant) held on new seeds' (diff, lo, hi, p) ``m``."""
    if m is None:
        return "not rerun here"
    if (m[0] > 0) == (d0 > 0) and m[3] < 0.05:
        return f"**held**: {m[0]:+.3f}, {_p(m[3])}"
    if (m[0] > 0) == (d0 > 0):
        return f"**did not hold** (same sign, not significant): {m[0]:+.3f}, {_p(m[3])}"
    return f"**did not hold** (reversed): {m[0]:+.3f}, {_p(m[3])}"


def replication_pair_lines(original: dict, contrast_rows: list[dict], paper_rows: list[dict] | None) -> list[str]:
    """:func:`replication_lines` for the first seeds' other significant comparisons (``original``: their
    summary): the plan's contrasts (K = 5 - K = 1) and the orderings beside the paper (:func:`beside_paper`)."""
    lines = []
    new_c = {(tuple(c["a"]), tuple(c["b"])): c["diff"] for c in contrast_rows}
    for c in original.get("contrasts") or []:
        d0, p0 = c["diff"][0], c["diff"][3]
        if p0 < 0.05:
            lines.append(
                f"- `{c['b'][1]}` on {c['b'][0]} - `{c['a'][1]}` on {c['a'][0]}: {d0:+.3f}, {_p(p0)} on the first "
                f"seeds; on these seeds {_held(new_c.get((tuple(c['a']), tuple(c['b']))), d0)}"
            )
    new_p = {(q["a"], q["b"]): q.get("ours") for q in paper_rows or []}
    for q in original.get("paper") or []:
        if q.get("ours") is not None and q["ours"][3] < 0.05:
            d0, p0 = q["ours"][0], q["ours"][3]
            lines.append(
                f"- {q['a']} - {q['b']} (points; paper {q['paper']:+.1f}): {d0:+.1f}, {_p(p0)} on the first "
                f"seeds; on these seeds {_held(new_p.get((q['a'], q['b'])), d0)}"
            )
    return lines


def beside_paper(plan: Plan, data: dict) -> list[dict]:
    """Every pair of the paper's settings (``PAPER[plan.name]``, paper order: A above B), paired by seed on
    ours: the paper's gap A - B in Avg@16 points, ours (final held-out accuracy x 100, on the seeds both
    cells have: mean, bootstrap 95% interval, sign-flip p) and the verdict: ``reproduces`` (same sign,
    p < 0.05), ``same sign, not significant``, ``reversed`` (p < 0.05 the other way),
    ``reversed, not significant``, or ``not run yet``."""
    settings = PAPER.get(plan.name, ())
    by = {(r["workflow"], r["objective"], r["seed"]): r for r in data["runs"]}
    out = []
    for i, (a, name_a, paper_a) in enumerate(settings):
        for b, name_b, paper_b in settings[i + 1 :]:
            seeds = [s for s in plan.seed_list if (*a, s) in by and (*b, s) in by]
            row = {"a": name_a, "b": name_b, "paper": round(paper_a - paper_b, 1), "seeds": len(seeds)}
            if seeds:
                d, lo, hi, p = paired_comparison(
                    [100 * final_accuracy(by[(*a, s)]) for s in seeds],
                    [100 * final_accuracy(by[(*b, s)]) for s in seeds],
                )
                same = (d > 0) == (row["paper"] > 0) and d != 0
                row.update(
                    ours=(d, lo, hi, p),
                    verdict=(
                        "reproduces"
                        if same and p < 0.05
                        else "same sign, not significant"
                        if same
                        else "reversed"
                        if p < 0.05
                        else "reversed, not significant"
                    ),
                )
            else:
                row["verdict"] = "not run yet"
            out.append(row)
    return out


def paper_lines(plan: Plan, rows: list[dict], pairs: list[dict]) -> list[str]:
    """The table of our cells beside the paper's numbers, then each pair's ordering (:func:`beside_paper`)."""
    settings = PAPER.get(plan.name, ())
    if not settings:
        return []
    cell = {(r["workflow"], r["objective"]): r for r in rows}
    lines = [
        "",
        "Beside the paper (its Avg@16 on multi-turn search with Qwen2.5 and a real retriever; ours: final "
        "held-out Avg@16 x 100 on `tiny-search`, mean over the seeds done, 95% t-interval; the scales differ, "
        "the orderings are what compare):",
        "",
        "| setting | paper Avg@16 | ours Avg@16 (95% CI) | ours before RL | seeds |",
        "|---|---|---|---|---|",
    ]
    for (wf, obj), name, value in settings:
        r = cell.get((wf, obj))
        ours = (
            (f"{100 * r['acc']:.1f} ± {_fmt(100 * r['acc_ci'], 1)}", f"{100 * r['start']:.1f}", str(r["seeds"]))
            if r
            else ("not run yet", "-", "0")
        )
        lines.append(f"| {name} (`{obj}` on {wf}) | {value:.1f} | {ours[0]} | {ours[1]} | {ours[2]} |")
    lines += [
        "",
        "Each ordering the paper reports, on ours (A - B paired by seed, points; bootstrap 95% interval; sign-flip p):",
        "",
    ]
    for q in pairs:
        if "ours" in q:
            d, lo, hi, p = q["ours"]
            lines.append(
                f"- {q['a']} - {q['b']}: paper {q['paper']:+.1f}; ours {d:+.1f} [{lo:+.1f}, {hi:+.1f}], "
                f"{_p(p)}, {q['seeds']} seeds: **{q['verdict']}**"
            )
        else:
            lines.append(f"- {q['a']} - {q['b']}: paper {q['paper']:+.1f}; ours: {q['verdict']}")
    return lines


def partial_lines(plan: Plan, data: dict) -> list[str]:
    """While a study runs (``data["todo"]`` not empty): which cells and seeds the tables hold, which not yet."""
    if not data.get("todo"):
        return []
    done: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in data["runs"]:
        done[(r["workflow"], r["objective"])].append(r["seed"])
    total = len(data["runs"]) + len(data["todo"])
    lines = [
        f"**PARTIAL: the study is still running.** {len(data['runs'])} of {total} runs done; the tables "
        "below hold only these (a comparison pairs the seeds both cells have):",
        "",
    ]
    for wf in plan.workflows:
        for obj in plan.cells(wf):
            seeds = sorted(done.get((wf, obj), []))
            lines.append(
                f"- {wf} `{obj}`: "
                + (f"seeds {', '.join(map(str, seeds))} done" if seeds else "no seed done")
                + f" (of {plan.seed_list[0]}..{plan.seed_list[-1]})"
            )
        have = [s for s in plan.seed_list if f"{wf}/{s}" in data["start"]]
        lines.append(f"- {wf} before RL: {len(have)} of {plan.seeds} seeds evaluated")
    return lines + [""]


# --------------------------------------------------------------------------- plots + doc


def _grid(n: int, w: float, h: float):
    import matplotlib.pyplot as plt

    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def plot(plan: Plan, data: dict, rows: list[dict], img_dir: Path) -> list[Path]:
    """Held-out accuracy curves with seed bands, and the final table as bars: one panel per workflow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    colour = {obj: f"C{i}" for i, obj in enumerate(plan.objectives)}
    curves = img_dir / f"study_{plan.section}_curves.png"
    fig, axes = _grid(len(plan.workflows), 4.6, 3.6)
    for ax, wf in zip(axes, plan.workflows):
        got = [data["start"][f"{wf}/{s}"]["all"] for s in plan.seed_list if f"{wf}/{s}" in data["start"]]
        for obj in plan.cells(wf):
            rs = [
                r
                for r in data["runs"]
                if r["workflow"] == wf and r["objective"] == obj and f"{wf}/{r['seed']}" in data["start"]
            ]
            if not rs:
                continue
            steps = [0] + [s for s, _ in rs[0]["eval"]]
            ys = [[data["start"][f"{wf}/{r['seed']}"]["all"]] + [v for _, v in r["eval"]] for r in rs]
            mean = [statistics.mean(c) for c in zip(*ys)]
            sd = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in zip(*ys)]
            ax.plot(steps, mean, marker="o", ms=3, lw=1.4, label=obj, color=colour[obj])
            ax.fill_between(
                steps,
                [a - b for a, b in zip(mean, sd)],
                [a + b for a, b in zip(mean, sd)],
                color=colour[obj],
                alpha=0.12,
            )
        if got:
            ax.axhline(statistics.mean(got), color="grey", ls=":", lw=1)
        ax.set_title(wf, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy (sampled)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    done = len({r["seed"] for r in data["runs"]})
    fig.suptitle(
        f"{plan.section} study: mean over {done if data.get('todo') else plan.seeds} seeds"
        + (" (PARTIAL: the study is still running)" if data.get("todo") else "")
        + ", band = ±1 sd over seeds",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(curves, dpi=100)
    plt.close(fig)

    bars = img_dir / f"study_{plan.section}_bars.png"
    fig, axes = _grid(len(plan.workflows), 3.6, 3.2)
    for ax, wf in zip(axes, plan.workflows):
        rs = [r for r in rows if r["workflow"] == wf]
        xs = list(range(len(rs)))
        ax.bar(
            xs,
            [r["acc"] for r in rs],
            yerr=[0 if math.isnan(r["acc_ci"]) else r["acc_ci"] for r in rs],
            color=[colour[r["objective"]] for r in rs],
            capsize=3,
        )
        if rs:
            ax.axhline(rs[0]["start"], color="black", ls="--", lw=1, label="before RL")
        ax.set_xticks(xs, [r["objective"] for r in rs], fontsize=7, rotation=45, ha="right")
        ax.set_title(wf, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("final held-out accuracy (95% CI)", fontsize=8)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(bars, dpi=100)
    plt.close(fig)
    return [curves, bars]


def _num_eval_tasks(workflow: str, plan: Plan) -> int:
    """How many held-out tasks an evaluation uses: the plan's number, or all the file has."""
    with open(_tasks_of(workflow)[1], encoding="utf-8") as f:
        return min(plan.eval_tasks, sum(1 for line in f if line.strip()))


def _clip_ranges(objectives: tuple[str, ...]) -> str:
    """Each objective's clip range, as its row of the objectives table sets it (nothing is tuned here)."""
    from srpo_graph.srpo.objectives import get_objective

    eps = {o: (get_objective(o).loss_config().eps_low, get_objective(o).loss_config().eps_high) for o in objectives}
    common = Counter(eps.values()).most_common(1)[0][0]
    odd = [f"`{o}` {lo:g} / {hi:g}" for o, (lo, hi) in eps.items() if (lo, hi) != common]
    return f"Clip range (eps low / high) as each objective's table row sets it: {common[0]:g} / {common[1]:g}" + (
        f", except {', '.join(odd)} ("
        + ("its paper's values" if len(odd) == 1 else "their papers' values")
        + " for a length-normalized ratio)."
        if odd
        else "."
    )


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _router_lines(plan: Plan, runs: list[dict]) -> list[str]:
    """The routed workflows' router choices (share of episodes per label or subset, first and last saved step)
    and, where a ``choices`` router picks the set, its mean set size over training (the paper's 1.64)."""
    lines: list[str] = []
    for wf in plan.workflows:
        rs_wf = [r for r in runs if r["workflow"] == wf and r.get("routes")]
        if not rs_wf:
            continue
        labels = sorted({k for r in rs_wf for step in r["routes"].values() for k in step})
        route = ".".join(routers_of(wf)[0])
        lines += [
            "",
            f"{wf}: share of episodes per choice of `{route}` (its first output in the episode; first -> "
            "last saved step, mean over seeds):",
            "",
        ]
        for obj in plan.cells(wf):
            rs = [r for r in rs_wf if r["objective"] == obj]
            if rs:
                first = {
                    k: statistics.mean(r["routes"][min(r["routes"], key=int)].get(k, 0) for r in rs) for k in labels
                }
                last = {
                    k: statistics.mean(r["routes"][max(r["routes"], key=int)].get(k, 0) for r in rs) for k in labels
                }
                lines.append(f"- `{obj}`: " + ", ".join(f"{k} {first[k]:.2f} -> {last[k]:.2f}" for k in labels))
        sized = [r for r in rs_wf if any(r.get("router_set_size", {}).values())]
        for t in sorted({t for r in sized for t in r["router_set_size"]}):
            lines += [
                "",
                f"{wf}: mean size of `{t}`'s active set, the subset the router picked (steps 1-5 -> "
                f"last 5, mean over seeds; the paper reports a learned router settling at 1.64):",
                "",
            ]
            for obj in plan.cells(wf):
                xs = [r["router_set_size"][t] for r in sized if r["objective"] == obj and r["router_set_size"].get(t)]
                if xs:
                    a, b = (
                        statistics.mean(statistics.mean(x[:5]) for x in xs),
                        statistics.mean(statistics.mean(x[-5:]) for x in xs),
                    )
                    lines.append(f"- `{obj}`: {a:.2f} -> {b:.2f}")
    return lines


def _identity_lines(plan: Plan) -> list[str]:
    """What the tables leave out because it is another objective's run (:func:`same_as`), and why."""
    why = {
        "srpo": "every active set has one member (tests/srpo/test_k1_identities.py)",
        "grpo": "every agent fires once per episode, so Dr. MAS's task x agent groups hold GRPO's task groups' "
        "rewards (tests/e2e/test_cpu_reason.py)",
        "grpo1": "each episode is one event of one-token members, so the member ratio is the token ratio "
        "(tests/e2e/test_cpu_reason.py)",
    }
    found: dict[tuple[str, str], list[str]] = defaultdict(list)  # (source, objectives) -> workflows
    for wf in plan.workflows:
        by_source: dict[str, list[str]] = defaultdict(list)
        for obj in plan.objectives:
            src = same_as(wf, obj, plan.objectives)
            if src is not None:
                by_source["grpo1" if obj == "independent" and src == "grpo" else src].append(obj)
        for src, objs in by_source.items():
            found[(src, ", ".join(f"`{o}`" for o in objs))].append(wf)
    out = []
    for (src, objs), wfs in found.items():
        verb = "is" if "," not in objs else "are"
        out.append(
            f"On {', '.join(wfs)} {why[src]}: {objs} {verb} `{src.rstrip('1')}`'s run there, bit for bit, "
            "and not rerun."
        )
    return out


def write_doc(
    plan: Plan,
    data: dict,
    rows: list[dict],
    images: list[Path],
    out: Path,
    total_s: float,
    command: str,
    jobs: int = 1,
    contrast_rows: list[dict] = (),
    replication: dict | None = None,  # type: ignore[assignment]
    paper_rows: list[dict] | None = None,
) -> None:
    """The study's section of docs/results.md (everything between the study markers is replaced).

    ``contrast_rows``: :func:`contrasts`; ``replication``: ``{"seeds": "0..9", "lines": replication_lines(...)}``
    when these are disjoint seeds of a plan whose first seeds' summary exists."""
    math_wfs = [wf for wf in plan.workflows if not wf.startswith("coord")]
    coord_wfs = [wf for wf in plan.workflows if wf.startswith("coord")]
    about = []
    for name, model in data["models"].items():
        users = [wf for wf in math_wfs if name in recipes_of(wf)]
        stages = model.get("stages") or [{"steps": model["steps"], "final_loss": model["final_loss"]}]
        sft = (
            " + ".join(f"{st['steps']}" for st in stages)
            + " SFT steps"
            + (f" in {len(stages)} stages, final losses " if len(stages) > 1 else ", final loss ")
            + " / ".join(f"{st['final_loss']:.3f}" for st in stages)
        )
        about.append(
            f"Model `{name}` ({', '.join(users)}): {model['parameters']:,} parameters, pre-trained locally in "
            f"{model['build_seconds']} s ({sft})."
        )
    if math_wfs:
        steps, lr, samples = plan.budget(math_wfs[0])
        about.append(
            f"Budget on these workflows, the same for every objective: {steps} steps of {plan.tasks_per_step} "
            f"tasks x {samples} samples, {plan.epochs} epochs, AdamW lr {lr}."
        )
    if coord_wfs:
        steps, lr, samples = plan.budget(coord_wfs[0])
        about.append(
            f"The coordination tasks run on the tiny model (134k parameters, random weights from a seed): "
            f"{steps} steps of {plan.tasks_per_step} tasks x {samples} samples, {plan.epochs} epochs, AdamW lr {lr}."
        )
    about.append(_clip_ranges(plan.objectives))
    about += _identity_lines(plan)
    counts = {wf: _num_eval_tasks(wf, plan) for wf in plan.workflows}
    held_out = (
        f"{next(iter(counts.values()))} held-out tasks"
        if len(set(counts.values())) == 1
        else "held-out tasks (" + ", ".join(f"{wf} {n}" for wf, n in counts.items()) + ")"
    )
    lines = [
        f"<!-- study:{plan.section} -->",
        f"## The {plan.section} study (`{command}`)",
        "",
        " ".join(about)
        + f" Seeds {seed_ranges(plan.seed_list)}{' (every set of seeds run so far, pooled)' if plan.pooled else ''};"
        " only `objective=NAME` differs. Held-out accuracy: "
        f"{held_out} x {plan.eval_samples} sampled episodes, every {plan.eval_every} steps; "
        f"*final* = mean of the last two evaluations. Machine: {platform.machine()}, {platform.python_version()}, "
        f"1 torch thread per run ({jobs} at a time) on a 2-core machine; training time summed over the "
        f"{len(data['runs'])} runs {sum(r['seconds'] for r in data['runs']) / 60:.1f} min "
        + (
            "(each set of seeds ran in its own invocation; this section is computed from their saved records)."
            if plan.pooled
            else f"(this invocation {total_s / 60:.1f} min wall; runs saved earlier are reused)."
        ),
        "",
        *partial_lines(plan, data),
        "*Area* = the mean of all a run's held-out evaluations (how fast it learns); the `vs srpo` columns "
        "compare each seed's run with SRPO's run of the same seed: the mean difference, its paired bootstrap 95% "
        "interval (10,000 resamples) and the two-sided p of a paired sign-flip test ("
        + (
            f"exact; the smallest p {plan.seeds} seeds can give: {2 / 2**plan.seeds:.3g})."
            if plan.seeds <= 16
            else f"{plan.seeds} seeds: 100,000 random sign assignments, so p >= 1e-5)."
        ),
        "",
        f"*Seeds for {EFFECT:g}* = the power estimate: how many seeds a paired comparison with this seed-to-seed "
        f"spread of differences (sd) needs to resolve a true gap of {EFFECT:g} (the paper's smallest K = 5 gap, "
        "1.5 Avg@16 points) at 5% with 80% power (`seeds_needed`).",
        "",
        "| workflow | objective | before RL | final held-out acc. (95% CI) | gain (95% CI) | per seed | vs `srpo`: "
        "diff [95% CI], p | "
        f"sd of diff; seeds for {EFFECT:g} | area (95% CI) | area vs `srpo`: diff, p | grad-norm CV |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = "-"
        if "vs_srpo" in r:
            d, lo, hi, p = r["vs_srpo"]
            vs = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}], {_p(p)}"
        avs = "-"
        if "area_vs_srpo" in r:
            d, _, _, p = r["area_vs_srpo"]
            avs = f"{d:+.3f}, {_p(p)}"
        lines.append(
            f"| {r['workflow']} | `{r['objective']}` | {_fmt(r['start'])} | {_fmt(r['acc'])} ± "
            f"{_fmt(r['acc_ci'])} | {r['gain']:+.3f} ± {_fmt(r['gain_ci'])} | "
            f"{', '.join(_fmt(a, 2) for a in r['per_seed'])} | "
            f"{vs} | {_fmt(r.get('sd_diff'))}; {r.get('seeds_needed', '-')} | {_fmt(r['area'])} ± "
            f"{_fmt(r['area_ci'])} | {avs} | {_fmt(r['grad_cv'], 2)} |"
        )
    if paper_rows is not None:
        lines += paper_lines(plan, rows, paper_rows)
    for c in contrast_rows:
        d, lo, hi, p = c["diff"]
        lines.append(
            f"\nPaired by seed: `{c['b'][1]}` on {c['b'][0]} - `{c['a'][1]}` on {c['a'][0]}, final held-out "
            f"accuracy over {c['seeds']} seeds: {d:+.3f} [{lo:+.3f}, {hi:+.3f}], {_p(p)}; sd of the "
            f"differences {_fmt(c['sd_diff'])}, seeds for {EFFECT:g}: {c['seeds_needed']}."
        )
    if replication is not None:
        lines += [
            "",
            f"Replication of the comparisons the first seeds ({replication['seeds']}) reported as significant "
            "(p < 0.05), on these disjoint seeds:",
            "",
        ]
        lines += replication["lines"] or ["- none of the first seeds' comparisons was significant"]
    lines += [
        "",
        "Diagnostics by set size (means over steps and seeds). Each objective's clipped items (sets, "
        "members or tokens, as its ratio unit says) are binned by the size `k` of the set they belong to; the "
        "log-ratio is the item's (for a set, the K^-alpha-scaled sum of its members'):",
        "",
        "| workflow | objective | clip upper k1 / kK | clip lower k1 / kK | log-ratio mean k1 / kK | log-ratio abs. "
        "max k1 / kK | events per episode | mean set size, first -> last 5 steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["diag"]
        ks = sorted({int(m.group(1)) for k in d if (m := re.search(r"/k(\d+)$", k))})
        kk = ks[-1] if ks else 1

        def pair(stem: str) -> str:
            a, b = d.get(f"loss/{stem}/k1"), d.get(f"loss/{stem}/k{kk}")
            return f"{_fmt(a)} / {_fmt(b)}" if kk != 1 else _fmt(a)

        sz = r.get("set_size")
        lines.append(
            f"| {r['workflow']} | `{r['objective']}` | {pair('clip_upper')} | {pair('clip_lower')} | "
            f"{pair('log_ratio_mean')} | {pair('log_ratio_absmax')} | {r['events_per_episode']:.2f} | "
            f"{_fmt(sz[0], 2) + ' -> ' + _fmt(sz[1], 2) if sz else '-'} |"
        )
    lines += _router_lines(plan, data["runs"])
    lines += ["", "Held-out accuracy before RL by task family (mean over seeds):", ""]
    for wf in plan.workflows:
        have = [s for s in plan.seed_list if f"{wf}/{s}" in data["start"]]
        if not have:
            lines.append(f"- {wf}: not measured yet")
            continue
        fams = data["start"][f"{wf}/{have[0]}"].keys()
        lines.append(
            f"- {wf}: "
            + ", ".join(f"{f} {statistics.mean(data['start'][f'{wf}/{s}'][f] for s in have):.3f}" for f in fams)
            + (f" (seeds {', '.join(map(str, have))})" if len(have) < plan.seeds else "")
        )
    lines += [""] + [f"![{p.stem}](img/{p.name})" for p in images] + ["", f"<!-- end study:{plan.section} -->", ""]
    put_section(out, plan.section, "\n".join(lines))


def put_section(out: Path, name: str, section: str) -> None:
    """Write ``section`` (from ``<!-- study:NAME -->`` to ``<!-- end study:NAME -->``) into the page ``out``:
    in place of the old one, else where the page keeps new sections, else at its end."""
    text = out.read_text(encoding="utf-8") if out.exists() else "# Results\n\n"
    begin, end = f"<!-- study:{name} -->", f"<!-- end study:{name} -->\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    elif PLACEHOLDER in text:  # new sections go where the page keeps them, in the order they were first run
        text = text.replace(PLACEHOLDER, PLACEHOLDER + "\n\n" + section.rstrip("\n"), 1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    out.write_text(text, encoding="utf-8")


def run_plan(
    plan: Plan, runs_dir: Path, out: Path, command: str, *, fresh: bool = False, jobs: int = 1, run: bool = True
) -> list[dict]:
    """Run (or resume) one plan, then write its section of ``out`` and its plots; returns its table rows.

    ``run=False`` (``--report``): run nothing, write the section from the records saved so far (marked
    partial, naming the cells and seeds done, while any is missing)."""
    t0 = time.perf_counter()
    data = run_study(plan, runs_dir, fresh=fresh, jobs=jobs, run=run)
    total = time.perf_counter() - t0
    rows = analyze(plan, data)
    extra = contrasts(plan, data)
    images = plot(plan, data, rows, out.parent / "img")
    paper = beside_paper(plan, data) if plan.name in PAPER else None
    replication = None
    if plan.seed_offset:  # a replication: compare with the first seeds' summary, when they have run
        first = runs_dir / "summary.json"
        if first.is_file():
            orig = json.loads(first.read_text(encoding="utf-8"))
            lo = orig["plan"].get("seed_offset", 0)
            replication = {
                "seeds": f"{lo}..{lo + orig['plan']['seeds'] - 1}",
                "lines": replication_lines(orig["rows"], rows) + replication_pair_lines(orig, extra, paper),
            }
    name = "summary.json" if plan.section == plan.name else f"summary-{plan.section}.json"
    if data["todo"]:  # a partial table is not the plan's summary (a replication compares with that one)
        name = f"summary-{plan.section}-partial.json"
    _save(
        runs_dir / name,
        {
            "plan": asdict(plan),
            "rows": rows,
            "contrasts": extra,
            "start": data["start"],
            "seconds": total,
            "paper": paper,
            "todo": data["todo"],
        },
    )
    write_doc(plan, data, rows, images, out, total, command, jobs, extra, replication, paper)
    for r in rows:
        print(f"{r['workflow']:18s} {r['objective']:12s} {r['start']:.3f} -> {r['acc']:.3f} ± {_fmt(r['acc_ci'])}")
    print(f"wrote the {plan.section} section of {out} ({total / 60:.1f} min)")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument(
        "--quick",
        action="store_true",
        help="a small study: the mixed workflow x 3 objectives x 2 seeds x 6 "
        "steps (<= 5 min here once the model is built)",
    )
    g.add_argument("--smoke", action="store_true", help="every code path once, for the test suite (~1 min)")
    g.add_argument(
        "--plan",
        choices=sorted([*PLANS, "regime"]),
        help=f"one named plan (default: the full study, the plans {' + '.join(FULL)}; "
        "regime: issue 38's, benchmarks/study_regime.py)",
    )
    ap.add_argument("--seeds", type=int, help="override the plan's number of seeds")
    ap.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        help="run seeds OFFSET..OFFSET+seeds-1 (a replication on "
        "disjoint seeds: its own section of the page, saying which significant comparisons held)",
    )
    ap.add_argument(
        "--steps", type=int, help="override the plan's steps per run (coord_steps on the coordination tasks)"
    )
    ap.add_argument(
        "--workflows",
        nargs="+",
        metavar="NAME",
        help="run only these of the plan's workflows (their "
        "records are the plan's: a later run of the whole plan reuses them)",
    )
    ap.add_argument(
        "--runs-dir",
        type=Path,
        help="where per-run records go (default benchmarks/results/study-<plan>, "
        "committed with the page; runs/study-<plan> for --quick and --smoke; for the full study, DIR/study-<plan>)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md", help="the results page to update")
    ap.add_argument("--fresh", action="store_true", help="ignore saved runs and rerun every cell")
    ap.add_argument(
        "--report",
        action="store_true",
        help="run nothing: write the page from the runs saved so far "
        "(a study still running gets a section marked partial, naming the cells and seeds done)",
    )
    ap.add_argument(
        "--pool",
        action="store_true",
        help="run nothing: one section comparing the objectives over "
        "every seed saved for the plan (all its sets of seeds: the first, and every --seed-offset), paired by seed",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time, one process and one torch thread each "
        "(default 1; 2 on a 2-core machine halves the wall time)",
    )
    args = ap.parse_args(argv)
    if args.pool and (args.seeds or args.seed_offset or args.fresh or args.steps):
        ap.error("--pool reports the saved runs: it takes no --seeds, --seed-offset, --steps or --fresh")
    one = args.plan or ("quick" if args.quick else "smoke" if args.smoke else None)
    if one == "regime":  # issue 38's study: its own stages (scan, compare, replicate), benchmarks/study_regime.py
        if args.pool or args.seeds or args.seed_offset or args.steps or args.workflows:
            ap.error("--plan regime sets its own seeds, steps and workflows: it takes --jobs, --report, --fresh")
        import study_regime

        runs = args.runs_dir or ROOT / "benchmarks/results/study-regime"
        return study_regime.main(runs, args.out, jobs=args.jobs, fresh=args.fresh, run=not args.report)
    flags = (
        (f" --seeds {args.seeds}" if args.seeds else "")
        + (f" --seed-offset {args.seed_offset}" if args.seed_offset else "")
        + (f" --steps {args.steps}" if args.steps else "")
        + (f" --jobs {args.jobs}" if args.jobs > 1 else "")
    )
    if args.workflows:
        known = {w for name in ((one,) if one else FULL) for w in PLANS[name].workflows}
        if unknown := sorted(set(args.workflows) - known):
            ap.error(f"--workflows: {', '.join(unknown)} not in the plan (its workflows: {', '.join(sorted(known))})")
        flags += " --workflows " + " ".join(args.workflows)
    for name in (one,) if one else FULL:
        plan = PLANS[name]
        if args.seeds:
            plan = replace(plan, seeds=args.seeds)
        if args.seed_offset:
            plan = replace(plan, seed_offset=args.seed_offset)
        if args.steps:
            plan = replace(plan, steps=args.steps, coord_steps=args.steps)
        if args.workflows:
            plan = replace(plan, workflows=tuple(w for w in plan.workflows if w in args.workflows))
            if not plan.workflows:
                continue
        if one:
            # a real plan's records are results, kept in the repository (a few KB each; a lost machine
            # loses no run); the quick and smoke plans' are scratch
            default = ROOT / ("runs" if name in ("quick", "smoke") else "benchmarks/results") / f"study-{name}"
            runs_dir = args.runs_dir or default
            command = "python benchmarks/study.py" + {"quick": " --quick", "smoke": " --smoke"}.get(
                name, f" --plan {name}"
            )
        else:
            runs_dir = (args.runs_dir or ROOT / "runs") / f"study-{name}"
            command = "python benchmarks/study.py"
        if args.pool:
            seeds = saved_seeds(plan, runs_dir)
            if not seeds:
                ap.error(f"--pool: no saved runs of {', '.join(plan.workflows)} at this plan's budget in {runs_dir}")
            plan = replace(plan, pooled=tuple(seeds), seeds=len(seeds))
        run_plan(
            plan,
            runs_dir,
            args.out,
            command + flags + (" --pool" if args.pool else ""),
            fresh=args.fresh,
            jobs=args.jobs,
            run=not (args.report or args.pool),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
