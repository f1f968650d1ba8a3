"""Trainer stage: evaluation metrics of a workflow's episodes (``srpo-graph eval``, ``eval.every``, the study).

Consumes :class:`~srpo_graph.runtime.trace.Episode` objects (G samples of each problem, task-major,
as :func:`srpo_graph.runtime.executor.run` returns them) and the tasks; produces an
:class:`EvalReport`: per problem its G rewards, then

* **Avg@k** — the mean episode reward over the k = G samples of each problem, averaged over
  problems (the paper's Avg@16 is this with G = 16);
* **Pass@k** — the unbiased estimator of Chen et al. (2021), per problem
  ``1 - C(n-c, k) / C(n, k)`` with n samples of which c are *correct* (reward >= ``threshold``),
  averaged over problems, for each k <= n asked for;
* a 95% percentile-bootstrap interval for each, resampling **problems** (the unit a held-out set
  samples; the G samples of a problem stay together), from one seeded generator;
* the same per task family (the task's ``family`` or ``kind`` field), per **route** (the
  transitions an episode fired, in order) and per **answering agent** (the agents whose outputs the
  reward read: the terminal reward's agent arguments, and the agents consumed by a transition that
  gave a reward); the mean terminal reward and each declared transition reward.

:func:`compare` pairs two reports of the same problems, samples and seed (so the same per-request
seeds) and gives B - A with a paired bootstrap interval and a sign-flip p over problems.
Knows nothing of models, checkpoints or servers (``train/eval_command.py`` loads those).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from srpo_graph.fmt import fixed
from srpo_graph.workflow import Ref, Workflow

LEVEL = 0.95
NUM_BOOT = 2000


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased Pass@k of one problem: ``1 - C(n-c, k) / C(n, k)`` (n samples, c correct, k <= n).

    Computed as the stable product ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (Chen et al. 2021).

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2)
    (0.25, 1.0, 0.0)
    >>> round(pass_at_k(5, 2, 2), 6)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    0.7
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def bootstrap_indices(num: int, *, seed: int, num_boot: int = NUM_BOOT) -> np.ndarray:
    """``[num_boot, num]`` resampled indices of ``num`` units (with replacement), from ``seed``.

    Row b is the b-th draw of ``numpy.random.default_rng(seed).integers(0, num, num)``, so a plain
    loop drawing one row at a time from the same generator gets the same rows.
    """
    return np.random.default_rng(seed).integers(0, num, size=(num_boot, num))


def ratio_interval(sums: Sequence[float], counts: Sequence[float], idx: np.ndarray,
                   level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of ``sum(sums) / sum(counts)`` over resampled units (rows of ``idx``).

    A unit is a problem: ``sums`` its total, ``counts`` how many values it holds (the mean of a
    subgroup -- a route, an agent -- pools its episodes of the resampled problems). Resamples whose
    units hold no value are left out; nan when none is left.
    """
    s, c = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    num, den = s[idx].sum(axis=1), c[idx].sum(axis=1)
    ok = den > 0
    if not ok.any():
        return float("nan"), float("nan")
    stats = num[ok] / den[ok]
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_ci(values: Sequence[float], *, seed: int, num_boot: int = NUM_BOOT,
                 level: float = LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (one per unit).

    >>> lo, hi = bootstrap_ci([0.0, 1.0] * 20, seed=0)
    >>> 0.3 < lo < 0.5 < hi < 0.7
    True
    """
    return ratio_interval(
        values, [1.0] * len(values), bootstrap_indices(len(values), seed=seed, num_boot=num_boot), level
    )


class Estimate(_Frozen):
    """A mean and its 95% bootstrap interval over problems."""

    value: float
    low: float
    high: float

    def fmt(self, digits: int = 3) -> str:
        if math.isnan(self.low):
            return fixed(self.value, digits)
        return f"{fixed(self.value, digits)} [{fixed(self.low, digits)}, {fixed(self.high, digits)}]"


# --------------------------------------------------------------------------- per-episode facts


def route_of(ep: Any) -> str:
    """The transitions an episode fired, in order, repeats folded: ``"step x3"``, ``"search > read"``.

    An episode that fired nothing (failed before its first transition) is ``"(none)"``.
    """
    names = [t.name for t in sorted(ep.transitions, key=lambda t: t.step)]
    if not names:
        return "(none)"
    runs: list[list[Any]] = []
    for n in names:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return " > ".join(n if k == 1 else f"{n} x{k}" for n, k in runs)


def answerers_of(wf: Workflow, ep: Any) -> str:
    """The agents whose outputs the episode's reward read, joined with ``+`` (``"(none)"`` if none):
    the agent arguments of the terminal reward that produced an output, and the agents consumed by
    every transition that gave a reward (a router's specialist answering)."""
    agents = {a.name for a in wf.agents}
    by_id = {o.id: o.agent for o in ep.outputs}
    produced = set(by_id.values())
    found: set[str] = set()
    if wf.reward is not None:
        args = [*wf.reward.args, *(e for _, e in wf.reward.kwargs)]
        found |= {e.path[0] for e in args if isinstance(e, Ref) and e.path[0] in agents} & produced
    for t in ep.transitions:
        if t.reward is not None:
            found |= {by_id[c] for c in t.consumed if c in by_id}
    return "+".join(sorted(found)) or "(none)"


def family_of(fields: Mapping[str, Any]) -> str:
    """A task's family: its ``family`` field, else ``kind``, else ``"all"``."""
    return str(fields.get("family") or fields.get("kind") or "all")


# --------------------------------------------------------------------------- the report


class Problem(_Frozen):
    """One problem's samples: rewards, routes and answering agents in sample order."""

    task_id: str
    family: str
    rewards: list[float]
    terminal: list[float]
    routes: list[str]
    answerers: list[str]
    statuses: list[str]


class Group(_Frozen):
    """Metrics of a subset of episodes (a family, a route, an agent); intervals over problems."""

    problems: int
    episodes: int
    share: float = Field(description="The share of all episodes in this group.")
    avg: Estimate = Field(description="Mean episode reward (Avg@k where every problem has its k samples).")
    correct: Estimate = Field(description="Share of episodes with reward >= threshold (Pass@1).")
    pass_at: dict[int, Estimate] = Field(default_factory=dict, description="Pass@k (whole problems only).")


class TransitionReward(_Frozen):
    """One transition's declared reward: how often it fired and what it gave."""

    firings_per_episode: float
    mean_reward: float  # per firing that gave a reward


class EvalReport(_Frozen):
    """Everything one evaluation measured (saved as JSON by ``srpo-graph eval``)."""

    label: str
    workflow: str
    samples: int
    seed: int
    threshold: float
    ks: list[int]
    overall: Group
    by_family: dict[str, Group]
    by_route: dict[str, Group]
    by_agent: dict[str, Group]
    terminal_reward: float
    transition_rewards: dict[str, TransitionReward]
    statuses: dict[str, int]
    problems: list[Problem]
    seconds: float = 0.0

    @property
    def avg(self) -> Estimate:
        return self.overall.avg

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The flat metrics the trainer logs: ``eval/reward`` (Avg@k), ``eval/pass@k``, intervals."""
        o = self.overall
        out = {f"{prefix}reward": o.avg.value, f"{prefix}reward_low": o.avg.low, f"{prefix}reward_high": o.avg.high}
        for k, e in o.pass_at.items():
            out[f"{prefix}pass@{k}"] = e.value
        return out


def default_ks(samples: int) -> list[int]:
    """Pass@k reported by default: 1, 2, 4, ... below ``samples``, and ``samples``.

    >>> default_ks(16), default_ks(5), default_ks(1)
    ([1, 2, 4, 8, 16], [1, 2, 4, 5], [1])
    """
    ks = [k for k in (2**i for i in range(20)) if k < samples]
    return [*ks, samples]


def problems_of(wf: Workflow, episodes: Sequence[Any], tasks: Sequence[Any]) -> list[Problem]:
    """Episodes grouped per task (in the tasks' order), samples in sample order."""
    fields = {t.id: t.fields for t in tasks}
    per: dict[str, list[Any]] = defaultdict(list)
    for ep in episodes:
        per[ep.task_id].append(ep)
    out = []
    for t in tasks:
        eps = sorted(per.get(t.id, []), key=lambda e: e.sample)
        if not eps:
            continue
        out.append(
            Problem(
                task_id=t.id,
                family=family_of(fields[t.id]),
                rewards=[float(e.reward) for e in eps],
                terminal=[float(e.reward) - sum(tr.reward or 0.0 for tr in e.transitions) for e in eps],
                routes=[route_of(e) for e in eps],
                answerers=[answerers_of(wf, e) for e in eps],
                statuses=[e.status for e in eps],
            )
        )
    return out


def _group(problems: list[Problem], keep, idx: np.ndarray, total: int, threshold: float, ks: Sequence[int]) -> Group:
    """A group's metrics: ``keep(problem, sample)`` selects its episodes; ``idx`` the resamples."""
    sums, corr, counts = [], [], []
    flat: list[float] = []
    for p in problems:
        vals = [r for j, r in enumerate(p.rewards) if keep(p, j)]
        flat += vals
        sums.append(sum(vals))
        corr.append(float(sum(r >= threshold for r in vals)))
        counts.append(float(len(vals)))
    n_eps = len(flat)
    # the flat mean (summed in episode order): bit for bit what the trainer logged before as eval/reward
    avg = sum(flat) / n_eps if n_eps else float("nan")
    whole = [p for p, c in zip(problems, counts) if c == len(p.rewards) and c > 0]
    pass_at = {}
    if whole and len(whole) == sum(c > 0 for c in counts):  # every problem of the group whole: Pass@k is defined
        n = min(len(p.rewards) for p in whole)
        for k in ks:
            if k <= n:
                per = [
                    pass_at_k(len(p.rewards), sum(r >= threshold for r in p.rewards), k) if c else 0.0
                    for p, c in zip(problems, counts)
                ]
                lo, hi = ratio_interval(per, [1.0 if c else 0.0 for c in counts], idx)
                pass_at[k] = Estimate(value=sum(per) / len(whole), low=lo, high=hi)
    return Group(
        problems=sum(c > 0 for c in counts),
        episodes=n_eps,
        share=n_eps / total if total else 0.0,
        avg=Estimate(value=avg, low=(ci := ratio_interval(sums, counts, idx))[0], high=ci[1]),
        correct=Estimate(
            value=sum(corr) / n_eps if n_eps else float("nan"),
            low=(cc := ratio_interval(corr, counts, idx))[0],
            high=cc[1],
        ),
        pass_at=pass_at,
    )


def score(
    wf: Workflow,
    episodes: Sequence[Any],
    tasks: Sequence[Any],
    *,
    samples: int,
    seed: int = 0,
    threshold: float = 1.0,
    ks: Iterable[int] | None = None,
    label: str = "",
    num_boot: int = NUM_BOOT,
    seconds: float = 0.0,
) -> EvalReport:
    """The :class:`EvalReport` of ``episodes`` (``samples`` per task of ``tasks``).

    Args:
        wf: the workflow the episodes ran (its reward says which agents answered).
        episodes: the episodes, any order.
        tasks: the tasks they ran (``Task``: ``id``, ``fields``); tasks without episodes are skipped.
        samples: k, the samples per problem (Avg@k).
        seed: the bootstrap's seed (the run's seed: one seed reproduces everything).
        threshold: an episode is correct when its reward >= threshold (Pass@k).
        ks: Pass@k for these k (default :func:`default_ks`; k > samples are dropped).
        num_boot: bootstrap resamples.
    """
    problems = problems_of(wf, episodes, tasks)
    ks = sorted({k for k in (ks or default_ks(samples)) if 1 <= k <= samples})
    idx = bootstrap_indices(max(1, len(problems)), seed=seed, num_boot=num_boot)
    total = sum(len(p.rewards) for p in problems)

    def by(attr: str | None) -> dict[str, Group]:
        if attr is None:
            return {}
        labels = sorted({x for p in problems for x in (getattr(p, attr) if attr != "family" else [p.family])})
        if attr == "family":
            return {f: _group(problems, lambda p, j, f=f: p.family == f, idx, total, threshold, ks) for f in labels}
        return {
            v: _group(problems, lambda p, j, v=v: getattr(p, attr)[j] == v, idx, total, threshold, ks) for v in labels
        }

    rewards: dict[str, list[float]] = defaultdict(list)
    fired: dict[str, int] = defaultdict(int)
    declared = {t.name for t in wf.transitions if t.reward is not None}
    for ep in episodes:
        for t in ep.transitions:
            if t.name in declared:
                fired[t.name] += 1
                if t.reward is not None:
                    rewards[t.name].append(float(t.reward))
    n_eps = max(1, len(episodes))
    statuses: dict[str, int] = defaultdict(int)
    for ep in episodes:
        statuses[ep.status] += 1
    terminal = [x for p in problems for x in p.terminal]
    return EvalReport(
        label=label,
        workflow=wf.name,
        samples=samples,
        seed=seed,
        threshold=threshold,
        ks=ks,
        overall=_group(problems, lambda p, j: True, idx, total, threshold, ks),
        by_family=by("family"),
        by_route=by("routes"),
        by_agent=by("answerers"),
        terminal_reward=sum(terminal) / len(terminal) if terminal else float("nan"),
        transition_rewards={
            n: TransitionReward(
                firings_per_episode=fired[n] / n_eps,
                mean_reward=sum(rewards[n]) / len(rewards[n]) if rewards[n] else 0.0,
            )
            for n in sorted(declared)
        },
        statuses=dict(sorted(statuses.items())),
        problems=problems,
        seconds=seconds,
    )


# --------------------------------------------------------------------------- paired comparison


class Difference(_Frozen):
    """B - A over the same problems: the mean, its paired bootstrap interval and a sign-flip p."""

    value: float
    low: float
    high: float
    p: float

    def fmt(self, digits: int = 3) -> str:
        return (f"{fixed(self.value, digits, signed=True)} [{fixed(self.low, digits, signed=True)}, "
                f"{fixed(self.high, digits, signed=True)}], p={self.p:.3g}")


class Comparison(_Frozen):
    """``compare(a, b)``: per metric, B - A paired over problems (same seeds, same samples)."""

    a: str
    b: str
    problems: int
    diffs: dict[str, Difference]
    by_family: dict[str, Difference]


def sign_flip_p(diffs: Sequence[float], *, seed: int, num: int = 20_000) -> float:
    """Two-sided p of a paired sign-flip test of mean(diffs) = 0: exact over the 2^n sign
    assignments for n <= 16, else ``num`` random ones (``(hits + 1) / (num + 1)``).

    >>> sign_flip_p([0.1, 0.2, 0.3], seed=0)  # all positive: 2 of 8 assignments as extreme
    0.25
    """
    d = np.asarray(diffs, dtype=np.float64)
    if not len(d) or not d.any():
        return 1.0
    obs = abs(d.sum()) - 1e-12
    if len(d) <= 16:
        signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)
        return float((np.abs(signs @ d) >= obs).mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(num, len(d)))
    return float(((np.abs(signs @ d) >= obs).sum() + 1) / (num + 1))


def _difference(a: Sequence[float], b: Sequence[float], idx: np.ndarray, seed: int) -> Difference:
    d = [y - x for x, y in zip(a, b)]
    lo, hi = ratio_interval(d, [1.0] * len(d), idx)
    return Difference(value=sum(d) / len(d), low=lo, high=hi, p=sign_flip_p(d, seed=seed))


def compare(a: EvalReport, b: EvalReport, *, num_boot: int = NUM_BOOT) -> Comparison:
    """B - A on the same problems and samples, paired per problem.

    Raises:
        ValueError: the reports are not of the same problems, sample count and seed (a paired
            difference needs the same per-request seeds).
    """
    if (
        [p.task_id for p in a.problems] != [p.task_id for p in b.problems]
        or a.samples != b.samples
        or a.seed != b.seed
        or a.threshold != b.threshold
    ):
        raise ValueError(
            f"cannot pair {a.label!r} with {b.label!r}: evaluate both on the same tasks with the same "
            "--samples, --seed and --threshold"
        )
    idx = bootstrap_indices(len(a.problems), seed=a.seed, num_boot=num_boot)
    k = a.samples

    def per(rep: EvalReport, metric: str) -> list[float]:
        if metric == "avg":
            return [sum(p.rewards) / len(p.rewards) for p in rep.problems]
        kk = int(metric.split("@")[1])
        return [pass_at_k(len(p.rewards), sum(r >= rep.threshold for r in p.rewards), kk) for p in rep.problems]

    metrics = ["avg", *(f"pass@{kk}" for kk in a.ks if kk <= k)]
    diffs = {m: _difference(per(a, m), per(b, m), idx, a.seed) for m in metrics}
    fams: dict[str, Difference] = {}
    for fam in sorted({p.family for p in a.problems}):
        keep = [i for i, p in enumerate(a.problems) if p.family == fam]
        pa, pb = per(a, "avg"), per(b, "avg")
        fidx = bootstrap_indices(len(keep), seed=a.seed, num_boot=num_boot)
        fams[fam] = _difference([pa[i] for i in keep], [pb[i] for i in keep], fidx, a.seed)
    return Comparison(a=a.label, b=b.label, problems=len(a.problems), diffs=diffs, by_family=fams)
