"""Evaluation (``srpo_graph/eval/score.py``, ``train/eval_command.py``, ``srpo-graph eval``).

Numerics against independent references: Pass@k against brute-force enumeration of k-subsets,
the bootstrap intervals against a plain-loop percentile bootstrap on the same generator (and
scipy's, where installed), every table against a plain recount of the episodes. The sources
(a run folder at a chosen step, a LoRA run, a model directory, ``base``) run the real tiny model.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from srpo_graph.eval.score import (
    bootstrap_ci,
    bootstrap_indices,
    compare,
    pass_at_k,
    ratio_interval,
    score,
    sign_flip_p,
)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_brute_force_over_k_subsets(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
            assert abs(pass_at_k(n, c, k) - brute) < 1e-12, (n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in ((3, 4, 1), (3, 1, 4), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def _loop_quantile(xs, q):
    """numpy's default (linear) quantile, written out."""
    xs = sorted(xs)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    return xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def _loop_bootstrap(values, seed, num_boot):
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(num_boot):
        draw = rng.integers(0, len(values), len(values))
        means.append(sum(values[i] for i in draw) / len(values))
    return _loop_quantile(means, 0.025), _loop_quantile(means, 0.975)


@pytest.mark.parametrize("seed", [0, 7])
def test_bootstrap_interval_equals_a_plain_loop_on_the_same_generator(seed):
    values = [float(x) for x in np.random.default_rng(100 + seed).random(23)]
    lo, hi = bootstrap_ci(values, seed=seed, num_boot=500)
    rlo, rhi = _loop_bootstrap(values, seed, 500)
    assert abs(lo - rlo) < 1e-12 and abs(hi - rhi) < 1e-12
    assert lo < sum(values) / len(values) < hi


def test_bootstrap_interval_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    values = np.random.default_rng(3).random(40)
    lo, hi = bootstrap_ci(list(values), seed=0, num_boot=20_000)
    ref = stats.bootstrap(
        (values,), np.mean, n_resamples=20_000, method="percentile", random_state=1
    ).confidence_interval
    # different random streams: the percentile interval agrees to Monte-Carlo error
    assert abs(lo - ref.low) < 0.01 and abs(hi - ref.high) < 0.01


def test_ratio_interval_pools_subgroups_by_resampled_problem():
    # problem 0 holds 2 values of the group (sum 1), problem 1 holds none, problem 2 one (sum 1)
    sums, counts = [1.0, 0.0, 1.0], [2.0, 0.0, 1.0]
    idx = bootstrap_indices(3, seed=0, num_boot=300)
    lo, hi = ratio_interval(sums, counts, idx)
    ref = []
    for row in idx:
        den = sum(counts[i] for i in row)
        if den:
            ref.append(sum(sums[i] for i in row) / den)
    assert (lo, hi) == pytest.approx((_loop_quantile(ref, 0.025), _loop_quantile(ref, 0.975)), abs=1e-12)


def test_sign_flip_p_against_enumeration():
    d = [0.1, -0.05, 0.2, 0.03, -0.01, 0.07]
    brute = sum(
        abs(sum(s * x for s, x in zip(signs, d))) >= abs(sum(d)) - 1e-12
        for signs in itertools.product((1, -1), repeat=len(d))
    ) / 2 ** len(d)
    assert sign_flip_p(d, seed=0) == pytest.approx(brute)
    assert sign_flip_p([0.0, 0.0], seed=0) == 1.0


# --------------------------------------------------------------------------- real episodes


@pytest.fixture(scope="module")
def routed():
    """coord_routed on the tiny model: routes, transition rewards, answering agents vary."""
    from srpo_graph.backends import load_backend
    from srpo_graph.lang import load_workflow
    from srpo_graph.models import resolve_model
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(ROOT / "workflows" / "coord_routed.wf")
    tasks = load_tasks(ROOT / "workflows" / "tasks" / "routed.jsonl", wf)[:8]
    backend = load_backend("transformers", resolve_model("tiny"), device="cpu")
    res = run(wf, tasks, {"tiny": backend}, samples=4, seed=5)
    return wf, tasks, res.episodes


def test_score_against_a_plain_recount(routed):
    wf, tasks, episodes = routed
    rep = score(wf, episodes, tasks, samples=4, seed=5, threshold=1.0, num_boot=200)
    per = {t.id: [e for e in episodes if e.task_id == t.id] for t in tasks}
    assert rep.overall.avg.value == pytest.approx(sum(e.reward for e in episodes) / len(episodes), abs=1e-12)
    assert rep.overall.problems == 8 and rep.overall.episodes == 32
    for k in (1, 2, 4):
        ref = sum(pass_at_k(4, sum(e.reward >= 1.0 for e in eps), k) for eps in per.values()) / 8
        assert rep.overall.pass_at[k].value == pytest.approx(ref, abs=1e-12)
        assert rep.overall.pass_at[k].low <= rep.overall.pass_at[k].value <= rep.overall.pass_at[k].high
    assert rep.overall.pass_at[1].value == pytest.approx(rep.overall.correct.value, abs=1e-12)
    # routes: the transitions fired; answering agents: the rewarded transitions' consumers
    routes = {}
    for e in episodes:
        key = " > ".join(t.name for t in sorted(e.transitions, key=lambda t: t.step)) or "(none)"
        routes.setdefault(key, []).append(e.reward)
    assert set(rep.by_route) == set(routes) and len(routes) >= 2
    for key, rs in routes.items():
        assert rep.by_route[key].episodes == len(rs)
        assert rep.by_route[key].avg.value == pytest.approx(sum(rs) / len(rs), abs=1e-12)
        assert rep.by_route[key].share == pytest.approx(len(rs) / 32)
    for label in rep.by_agent:
        assert "r" in label.split("+")  # the router's dispatch reward read r in every episode
    # the declared transition rewards, and the terminal part (none declared here)
    fired = [t for e in episodes for t in e.transitions if t.name == "dispatch"]
    assert rep.transition_rewards["dispatch"].firings_per_episode == pytest.approx(len(fired) / 32)
    assert rep.transition_rewards["dispatch"].mean_reward == pytest.approx(sum(t.reward for t in fired) / len(fired))
    assert rep.terminal_reward == pytest.approx(0.0, abs=1e-12)


def test_compare_pairs_problems_and_checks_it_can(routed):
    wf, tasks, episodes = routed
    a = score(wf, episodes, tasks, samples=4, seed=5, num_boot=200, label="a")
    assert all(d.value == 0 and d.p == 1.0 for d in compare(a, a, num_boot=200).diffs.values())
    # B: the same problems with every reward of the first four problems raised by 0.5
    up = {t.id for t in tasks[:4]}
    eps_b = [e.model_copy(update={"reward": e.reward + (0.5 if e.task_id in up else 0.0)}) for e in episodes]
    b = score(wf, eps_b, tasks, samples=4, seed=5, num_boot=200, label="b")
    c = compare(a, b, num_boot=200)
    ref = [0.5] * 4 + [0.0] * 4
    assert c.diffs["avg"].value == pytest.approx(sum(ref) / 8)
    assert c.diffs["avg"].low >= 0 and c.diffs["avg"].p == pytest.approx(sign_flip_p(ref, seed=5))
    other = score(wf, episodes, tasks, samples=4, seed=6, num_boot=200)
    with pytest.raises(ValueError, match="same tasks"):
        compare(a, other)


# --------------------------------------------------------------------------- sources


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """coord_par2 trained 2 steps on the tiny model, checkpoints at steps 1 and 2, eval every step."""
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.trainer import train

    d = tmp_path_factory.mktemp("evalrun") / "run"
    cfg = load_config(
        None,
        [
            f"run_dir={d}",
            "steps=2",
            "rollout.tasks_per_step=4",
            "rollout.samples=4",
            "checkpoint.every=1",
            "eval.every=1",
            "eval.mode=sampled",
            "eval.samples=2",
            "eval.num_tasks=6",
            "logging.progress=false",
            "logging.tensorboard=false",
            "logging.plots=false",
            "optim.lr=5e-3",
        ],
    )
    train(ROOT / "workflows" / "coord_par2.wf", cfg)
    return d


def _eval(source, tmp_path, **kw):
    from srpo_graph.train.eval_command import evaluate_source, resolve_source

    kw = {"samples": 2, "seed": 3, "num_tasks": 6, "out": tmp_path, **kw}
    step = kw.pop("step", None)
    return evaluate_source(
        ROOT / "workflows" / "coord_par2.wf", resolve_source(str(source), step), kw.pop("tasks_path", None), **kw
    )[0]


def _numbers(rep):
    return rep.model_dump(exclude={"seconds", "label"})


def test_train_logs_the_eval_code_and_the_command_reproduces_it(run_dir, tmp_path):
    from srpo_graph.train.observe.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all({"eval/reward", "eval/pass@1", "eval/pass@2", "eval/reward_low"} <= set(r) for r in rows)
    # step 1's evaluation ran the step-1 weights with seed 0 * 7919 + 1 on the first 6 held-out tasks
    rep = _eval(run_dir, tmp_path, step=1, seed=1, tasks_path=ROOT / "workflows" / "tasks" / "coord_eval.jsonl")
    assert rep.overall.avg.value == rows[0]["eval/reward"]
    assert rep.overall.pass_at[2].value == rows[0]["eval/pass@2"]
    # without --tasks a run is evaluated on its own held-out file (the one next to its task file)
    assert _numbers(_eval(run_dir, tmp_path, step=1, seed=1)) == _numbers(rep)


def test_sources_a_run_a_checkpoint_a_model_directory_and_base(run_dir, tmp_path):
    from srpo_graph.models import resolve_model

    latest = _eval(run_dir, tmp_path)
    assert _numbers(latest) == _numbers(_eval(run_dir / "checkpoints" / "step_2", tmp_path))
    # the checkpoint's policy folder is a model directory: the same weights, the same numbers
    assert _numbers(latest) == _numbers(_eval(run_dir / "checkpoints" / "step_2" / "policies" / "tiny", tmp_path))
    base = _eval("base", tmp_path)
    assert _numbers(base) == _numbers(_eval(resolve_model("tiny"), tmp_path))
    assert _numbers(base) != _numbers(latest)  # trained weights sample otherwise
    # reproducible for a seed, and another seed samples otherwise
    assert _numbers(base) == _numbers(_eval("base", tmp_path))
    assert _numbers(base) != _numbers(_eval("base", tmp_path, seed=4))


def test_bad_sources_name_what_is_wrong(run_dir, tmp_path):
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.eval_command import resolve_source

    with pytest.raises(ConfigError, match="cannot evaluate step 7"):
        resolve_source(str(run_dir), 7)
    with pytest.raises(ConfigError, match="not a source to evaluate"):
        resolve_source(str(tmp_path))


def test_lora_run_folder(tmp_path):
    """Adapter policies load the way --resume loads them (shared frozen base + adapters)."""
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.eval_command import evaluate_source, resolve_source
    from srpo_graph.train.trainer import train

    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "steps=1",
            "rollout.tasks_per_step=2",
            "rollout.samples=2",
            "eval.every=0",
            "logging.progress=false",
            "logging.tensorboard=false",
            "logging.plots=false",
        ],
    )
    wf = ROOT / "workflows" / "coord_lora2.wf"
    train(wf, cfg)
    rep, eps = evaluate_source(
        wf, resolve_source(str(tmp_path / "run")), None, samples=2, seed=0, num_tasks=3, out=tmp_path / "ev"
    )
    assert rep.overall.episodes == 6 and {o.policy for e in eps for o in e.outputs} == {"role_a", "role_b"}


def test_cli_compare_writes_json_markdown_and_plot(run_dir, tmp_path):
    from tests.support.cli import invoke

    out = tmp_path / "ev"
    proc = invoke("eval", ROOT / "workflows" / "coord_par2.wf", "--samples", "2", "--num-tasks", "4", "--compare",
                  "base", run_dir, "--out", out, "--no-progress", "--pass-k", "1,2")
    assert proc.exit_code == 0, proc.stderr
    data = json.loads((out / "eval.json").read_text())
    assert [r["label"] for r in data["reports"]] == ["base", str(run_dir)]
    (c,) = data["comparisons"]
    a, b = data["reports"]
    per = [sum(q["rewards"]) / 2 - sum(p["rewards"]) / 2 for p, q in zip(a["problems"], b["problems"])]
    assert c["diffs"]["avg"]["value"] == pytest.approx(sum(per) / len(per))
    assert "Paired difference" in (out / "eval.md").read_text() and "| Avg@2 |" in proc.stdout
    assert (out / "eval.png").stat().st_size > 1000 and len((out / "traces" / "1.jsonl").read_text().splitlines()) == 8
    bad = invoke("eval", ROOT / "workflows" / "coord_par2.wf", tmp_path / "nothing-here", "--out", out)
    assert bad.exit_code == 7 and "not a source to evaluate" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.proc  # the rollout worker is a process
@pytest.mark.parametrize("staleness", [0, 1])
def test_eval_on_a_run_that_sampled_in_the_rollout_worker(tmp_path, staleness):
    """Issue 39, item 1: a run trained with ``rollout.worker = true`` (and overlapped rollouts) is
    evaluated in this process (Note [Sampling outside the trainer]), and the command reproduces the
    trainer's own evaluation, which ran in the worker; a training-only setting given to eval is refused."""
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.observe.metrics import read_metrics
    from srpo_graph.train.trainer import train

    d = tmp_path / "run"
    cfg = load_config(None, [f"run_dir={d}", "steps=2", "rollout.tasks_per_step=4", "rollout.samples=4",
                             "checkpoint.every=1", "eval.every=1", "eval.mode=sampled", "eval.samples=2",
                             "eval.num_tasks=6", "logging.progress=false", "logging.tensorboard=false",
                             "logging.plots=false", "optim.lr=5e-3", "rollout.worker=true",
                             f"rollout.max_staleness={staleness}"])
    train(ROOT / "workflows" / "coord_par2.wf", cfg)
    rows = read_metrics(d / "metrics.jsonl")
    rep = _eval(d, tmp_path / "e", step=1, seed=1, tasks_path=ROOT / "workflows" / "tasks" / "coord_eval.jsonl")
    assert rep.overall.avg.value == rows[0]["eval/reward"]
    with pytest.raises(ConfigError, match="rollout.worker.*training setting"):
        _eval(d, tmp_path / "e", overrides=["rollout.worker=true"])


def test_no_printed_number_is_a_negative_zero():
    """Issue 39, item 7: ``eval`` printed ``-0.000``. Intervals and differences that round to zero print
    without a sign (differences with ``+``), through the one formatter (srpo_graph/fmt.py)."""
    from srpo_graph.eval.score import Difference, Estimate

    assert Estimate(value=-1e-9, low=-4e-4, high=3e-4).fmt() == "0.000 [0.000, 0.000]"
    assert Difference(value=-1e-9, low=-2e-4, high=0.25, p=1.0).fmt() == "+0.000 [+0.000, +0.250], p=1"
    assert Estimate(value=-0.5, low=float("nan"), high=float("nan")).fmt() == "-0.500"
