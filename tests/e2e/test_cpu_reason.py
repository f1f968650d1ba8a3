"""The CPU math/search workflows on the locally pre-trained ``tiny-reason`` model, and the study.

The model is the real recipe (built once into the shared cache, a few minutes on one thread the
first time; ``srpo-graph init-model --recipe tiny-reason``). Each workflow checks, runs and
trains one step on it; ``benchmarks/study.py --smoke`` runs every code path of the study
(baseline accuracy, training under two objectives, statistics, plots, the results page) and
resumes from its saved runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

from srpo_graph.lang import load_workflow
from srpo_graph.train.config.loading import load_config
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
CPU_WORKFLOWS = (
    "tinymath_pipeline",
    "tinymath_mixed",
    "tinymath_routed",
    "tinymath_select",
    "tinysearch",
    "tinysearch_k5",
)


@pytest.fixture(scope="module")
def reason_model(tmp_path_factory):
    """The recipes' code and architecture, shrunk (fewer, narrower layers, a short pre-training) and
    built into a temporary home: these tests check the workflows' and the study's mechanics, and a
    fresh machine (CI) must not spend the real builds' minutes here. The real models' numbers come
    from ``srpo-graph init-model --recipe NAME`` and ``benchmarks/study.py`` (docs/results.md).
    Yields {recipe: its directory}."""
    from dataclasses import replace

    from srpo_graph.models import recipes

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SRPO_GRAPH_HOME", str(tmp_path_factory.mktemp("home")))
        for name in ("tiny-reason", "tiny-search"):
            small = replace(
                recipes.RECIPES[name],
                hidden=32,
                intermediate=64,
                layers=1,
                heads=2,
                num_examples=400,
                steps=20,
                batch_size=8,
                version=10_002,
                stages=tuple(replace(s, num_examples=40, steps=3) for s in recipes.RECIPES[name].stages),
            )
            mp.setitem(recipes.RECIPES, name, small)
        yield {name: recipes.ensure_recipe_model(name) for name in ("tiny-reason", "tiny-search")}


@pytest.mark.parametrize("name", CPU_WORKFLOWS)
def test_cpu_workflows_check_with_their_set_sizes(name):
    wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
    assert [p.model for p in wf.policies] == ["tiny-search" if name.startswith("tinysearch") else "tiny-reason"]
    sizes = {t.name: t.set_sizes for t in wf.transitions}
    if name == "tinymath_mixed":
        assert sizes == {"gather": (2,), "decide": (1,)}
    if name == "tinysearch_k5":  # five searchers consumed together, then the reader alone
        assert sizes == {"search": (5,), "read": (1,)}
    if name == "tinymath_select":  # the router picks the set: one solver or both
        assert sizes == {"dispatch": (1,), "gather": (1, 2), "decide": (1,)}


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_WORKFLOWS)
def test_cpu_workflow_trains_one_step_on_the_pretrained_model(name, reason_model, tmp_path):
    import torch
    from safetensors.torch import load_file

    cfg = load_config(
        None,
        [
            "steps=1",
            f"run_dir={tmp_path / 'run'}",
            "rollout.tasks_per_step=3",
            "rollout.samples=2",
            "eval.every=1",
            "eval.num_tasks=3",
            "eval.mode=sampled",
            "logging.progress=false",
            "logging.tensorboard=false",
            "logging.plots=false",
        ],
    )
    summary = train(ROOT / "workflows" / f"{name}.wf", cfg)
    (row,) = read_metrics(Path(summary.run_dir) / "metrics.jsonl")
    # the mean set size of every transition that fired (the trainer's set_size/<transition>)
    wf = load_workflow(ROOT / "workflows" / f"{name}.wf")
    logged = {k.split("/", 1)[1]: v for k, v in row.items() if k.startswith("set_size/")}
    assert logged and set(logged) <= {t.name for t in wf.transitions}
    for t in wf.transitions:
        if t.name in logged:
            assert min(t.set_sizes) <= logged[t.name] <= max(t.set_sizes), (t.name, logged[t.name])
    assert row["episodes"] == 6 and row["episodes_failed"] == 0, row
    assert row["events"] > 0 and math.isfinite(row["loss"]) and row["skipped_updates"] == 0
    assert 0.0 <= row["eval/reward"] <= 1.0
    # multi-token members: the solvers and searchers wrote more than one token each
    assert row["tokens"] > 2 * row["events"] * 3
    after = load_file(str(Path(summary.run_dir) / "checkpoints" / "step_1" / "policies" / "m" / "model.safetensors"))
    model = reason_model["tiny-search" if name.startswith("tinysearch") else "tiny-reason"]
    before = load_file(str(model / "model.safetensors"))
    changed = any(not torch.equal(before[k], after[k]) for k in before if k in after)
    # a group whose rewards all agree has advantage 0 and must not move the weights; any signal must
    assert changed == (row["advantage/max"] - row["advantage/min"] > 0), (row["advantage/min"], row["advantage/max"])


def _study():
    spec = importlib.util.spec_from_file_location("study", ROOT / "benchmarks" / "study.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["study"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_study_statistics():
    study = _study()
    m, ci = study.mean_ci([0.1, 0.2, 0.3])
    assert abs(m - 0.2) < 1e-12 and abs(ci - 4.303 * 0.1 / math.sqrt(3)) < 1e-9
    d, lo, hi, p = study.paired_comparison([0.3, 0.2, 0.4, 0.3], [0.3, 0.25, 0.35, 0.3])
    assert lo <= d <= hi and p > 0.5  # no difference
    better = [0.8, 0.7, 0.9, 0.75, 0.8, 0.85, 0.7, 0.9]
    d, lo, hi, p = study.paired_comparison(better, [0.2, 0.3, 0.25, 0.2, 0.3, 0.25, 0.2, 0.3])
    assert lo > 0.4 and p == 2 / 2**8  # every one of 8 seeds better: only all-signs-kept and all-flipped as extreme
    # the exact sign-flip p against brute force over every sign assignment
    import itertools

    diffs = [0.1, -0.05, 0.2, 0.03, -0.01, 0.07]
    obs = abs(sum(diffs))
    brute = sum(
        abs(sum(s * x for s, x in zip(signs, diffs))) >= obs - 1e-12
        for signs in itertools.product((1, -1), repeat=len(diffs))
    ) / 2 ** len(diffs)
    assert study.sign_flip_p(diffs) == brute
    assert study.PLANS["quick"].key("tinymath_mixed") != study.PLANS["math"].key("tinymath_mixed")
    # a record is tied to the versions of the models its workflow runs, and only to those
    plan = study.PLANS["math"]
    assert study.recipes_of("tinysearch") == ("tiny-search",) and study.recipes_of("coord_par2") == ()
    assert plan.key("tinysearch") != plan.key("tinymath_mixed") == plan.key("tinymath_routed")
    every = {"srpo", "srpo_sum", "srpo_mean", "independent", "grpo", "gspo", "dr_mas"}
    assert all(set(study.PLANS[name].objectives) >= every and study.PLANS[name].seeds >= 5 for name in study.FULL)
    assert {wf for name in study.FULL for wf in study.PLANS[name].workflows} >= {
        "tinymath_pipeline",
        "tinymath_mixed",
        "tinymath_routed",
        "tinymath_select",
        "tinysearch",
        "coord_par2",
        "coord_par3",
        "coord_par4",
        "coord_par5",
    }


def test_study_reuses_a_record_only_for_the_same_workflow_and_task_files(tmp_path):
    """Editing a workflow (a temperature) or a task file reruns its cells: the record's inputs digest."""
    import shutil

    study = _study()
    (tmp_path / "workflows" / "tasks").mkdir(parents=True)
    shutil.copy(ROOT / "workflows" / "tinysearch.wf", tmp_path / "workflows")
    for f in ("tinysearch.jsonl", "tinysearch_eval.jsonl"):
        shutil.copy(ROOT / "workflows" / "tasks" / f, tmp_path / "workflows" / "tasks")
    before = study.inputs_digest("tinysearch", tmp_path)
    assert before == study.inputs_digest("tinysearch", ROOT) != study.inputs_digest("tinymath_mixed", ROOT)
    key = (study.PLANS["search"].key("tinysearch"), before)
    rec = tmp_path / "seed0.json"
    study._save(rec, {"plan": key[0], "inputs": before, "reward": [0.1]})
    assert study._load(rec, key)["reward"] == [0.1]
    wf = tmp_path / "workflows" / "tinysearch.wf"
    edited = re.sub(r"temperature: [0-9.]+", "temperature: 0.9", wf.read_text())
    assert edited != wf.read_text()
    wf.write_text(edited)
    after = study.inputs_digest("tinysearch", tmp_path)
    assert after != before and study._load(rec, (key[0], after)) is None
    tasks = tmp_path / "workflows" / "tasks" / "tinysearch_eval.jsonl"
    tasks.write_text(tasks.read_text().splitlines(keepends=True)[0])
    assert study.inputs_digest("tinysearch", tmp_path) not in (before, after)
    study._save(rec, {"plan": key[0], "reward": [0.1]})  # a record from before digests: rerun
    assert study._load(rec, key) is None


def test_study_skips_only_objectives_that_are_another_ones_run():
    """A workflow is in ``K1_WORKFLOWS`` exactly when every transition consumes one output (no set of
    several members can arise); a plan's cells are its objectives less those ``same_as`` names, and
    those are only the identities it states: ``SAME_AT_K1`` at K = 1 (tests/srpo/test_k1_identities.py),
    ``dr_mas`` where every agent fires once, ``independent`` on one event of one-token members
    (both checked on real rollouts below)."""
    study = _study()
    for wf_file in sorted((ROOT / "workflows").glob("*.wf")):
        if wf_file.stem not in study.ALL_WORKFLOWS + study.COORD:
            continue
        wf = load_workflow(wf_file)
        every_set_one = all(len(t.consume) == 1 for t in wf.transitions)
        assert (wf_file.stem in study.K1_WORKFLOWS) == every_set_one, wf_file.stem
    # the rules, by what each workflow declares: a route, a multi-choice router or a loop means an
    # agent can fire zero times or twice; only the coordination tasks are one event of one-token members
    once = {"tinymath_pipeline", "tinymath_mixed", *study.COORD}
    assert {w for w in study.ALL_WORKFLOWS + study.COORD if study.fires_once(w)} == once
    assert {w for w in study.ALL_WORKFLOWS + study.COORD if study.one_token_one_event(w)} == set(study.COORD)
    for plan in (study.PLANS[name] for name in study.FULL):
        for wf in plan.workflows:
            cells = plan.cells(wf)
            assert {"srpo", "grpo", "gspo"} <= set(cells)
            skipped = {o: study.same_as(wf, o, plan.objectives) for o in plan.objectives if o not in cells}
            assert all(src in cells for src in skipped.values())
            want = {
                **({o: "srpo" for o in study.SAME_AT_K1} if wf in study.K1_WORKFLOWS else {}),
                **({"dr_mas": "grpo"} if wf in once else {}),
                **({"independent": "grpo"} if wf in study.COORD else {}),
            }
            assert skipped == want, wf


def _rollout(workflow: str, reason_model, samples: int = 4):
    """Real episodes of ``workflow``: 4 tasks x ``samples``, sampled by its models (the shrunk recipes)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.models.tiny import ensure_tiny_model
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import load_tasks

    wf = load_workflow(ROOT / "workflows" / f"{workflow}.wf")
    backends = {}
    for p in wf.policies:
        path = str(reason_model.get(p.model) or ensure_tiny_model())
        backends[p.name] = TransformersBackend(
            AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
        )
    tasks = load_tasks(ROOT / "workflows" / "tasks" / f"{workflow.split('_')[0]}.jsonl", wf)[:4]
    return run(wf, tasks, backends, samples=samples, seed=5).episodes


@pytest.mark.parametrize(
    "workflow",
    (
        "tinymath_pipeline",
        "tinymath_mixed",
        "tinymath_routed",
        "tinymath_select",
        "tinysearch",
        "tinysearch_k5",
        "coord_par2",
        "coord_par4",
    ),
)
def test_the_studys_identities_hold_on_real_rollouts(workflow, reason_model):
    """Where the study says an objective is another one's run, the two compile to the same advantages and
    give the same loss and gradient on a real rollout (so training is the same, bit for bit); the
    workflows the rule leaves out really differ, or could (an agent that fires twice or not at all)."""
    import torch

    from srpo_graph.compiler.compile import compile
    from srpo_graph.srpo.loss import loss_denominator, srpo_loss
    from srpo_graph.srpo.objectives import get_objective

    study = _study()
    # the shrunk models rarely earn a reward: the rollouts' structure is real, their rewards are made to vary
    episodes = [
        e.model_copy(update={"reward": float((7 * i) % 5) / 4}) for i, e in enumerate(_rollout(workflow, reason_model))
    ]
    assert all(e.status == "ok" for e in episodes)

    def loss_and_grad(name):
        obj = get_objective(name)
        b = compile(episodes, obj.compile_config())
        new = (
            b.old_logprobs.double()
            + 0.3 * torch.randn(b.num_tokens, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        ).requires_grad_()
        cfg = obj.loss_config()
        loss, _ = srpo_loss(new, b, cfg, denominator=loss_denominator(b, cfg))
        (grad,) = torch.autograd.grad(loss, new)
        return b, loss.detach(), grad

    grpo, loss_g, grad_g = loss_and_grad("grpo")
    assert grpo.member_advantage.abs().sum() > 0  # some group has reward variance: the check can fail
    for name in ("dr_mas", "independent"):
        b, loss, grad = loss_and_grad(name)
        if study.same_as(workflow, name, study.ALL_OBJECTIVES) == "grpo":
            assert torch.equal(b.member_advantage, grpo.member_advantage), name
            torch.testing.assert_close(loss, loss_g, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(grad, grad_g, rtol=1e-12, atol=1e-12)
        elif name == "dr_mas":
            agents = [[o.agent for o in e.outputs] for e in episodes]
            once = all(len(a) == len(set(a)) for a in agents) and len({frozenset(a) for a in agents}) == 1
            if not once:  # this rollout has an agent twice in an episode, or not in every one: they differ
                assert not torch.equal(b.member_advantage, grpo.member_advantage), name


@pytest.mark.proc  # --jobs 2: spawned worker processes
def test_study_runs_in_parallel_as_it_runs_alone(tmp_path):
    """``--jobs 2`` (spawned workers) saves the same records as one process: same seeds, same numbers."""
    study = _study()
    plan = study.Plan(
        "par",
        ("coord_par2",),
        ("srpo", "grpo"),
        seeds=2,
        steps=2,
        coord_steps=3,
        eval_every=3,
        eval_tasks=4,
        tasks_per_step=4,
    )
    one = study.run_study(plan, tmp_path / "one", jobs=1, log=lambda *_: None)
    two = study.run_study(plan, tmp_path / "two", jobs=2, log=lambda *_: None)
    assert one["start"] == two["start"]
    for a, b in zip(one["runs"], two["runs"], strict=True):
        differ = sorted(k for k in a.keys() | b.keys() if k != "seconds" and a.get(k) != b.get(k))
        assert not differ, (a["objective"], a["seed"], differ, [(a.get(k), b.get(k)) for k in differ][:2])
    assert sorted(p.relative_to(tmp_path / "two").as_posix() for p in (tmp_path / "two").rglob("seed*.json")) == [
        "coord_par2/grpo/seed0.json",
        "coord_par2/grpo/seed1.json",
        "coord_par2/srpo/seed0.json",
        "coord_par2/srpo/seed1.json",
    ]


def test_study_runs_seed_by_seed_and_reports_a_partial_table(tmp_path):
    """A study runs seed by seed (a seed's evaluation before RL, then its runs), so one stopped part way has
    whole seeds; ``--report`` (``run=False``) runs nothing and writes the section from the records saved so
    far, marked partial, naming the cells and seeds done, with comparisons on the seeds both cells have."""
    from dataclasses import replace

    study = _study()
    plan = study.Plan(
        "part",
        ("coord_par2",),
        ("srpo", "grpo"),
        seeds=1,
        steps=2,
        coord_steps=2,
        eval_every=2,
        eval_tasks=4,
        tasks_per_step=4,
    )
    logged: list[str] = []
    runs, out = tmp_path / "runs", tmp_path / "results.md"
    study.run_study(plan, runs, log=logged.append)
    assert [m.split()[2:4] for m in logged if m.startswith("seed 0")] == [
        ["coord_par2", "held-out"],
        ["coord_par2", "srpo"],
        ["coord_par2", "grpo"],
    ]
    two = replace(plan, seeds=2)
    assert two.key("coord_par2") == plan.key("coord_par2")  # the same records serve the bigger plan
    before = sorted(p.name for p in runs.rglob("*.json"))
    rows = study.run_plan(two, runs, out, "python benchmarks/study.py --plan part", run=False)
    # ran nothing
    assert sorted(p.name for p in runs.rglob("seed*.json")) == [n for n in before if n.startswith("seed")]
    text = out.read_text()
    assert "**PARTIAL: the study is still running.** 2 of 4 runs done" in text
    assert (
        "- coord_par2 `srpo`: seeds 0 done (of 0..1)" in text
        and "- coord_par2 before RL: 1 of 2 seeds evaluated" in text
    )
    assert [r["seed_list"] for r in rows] == [[0], [0]] and rows[1]["paired_seeds"] == 1
    assert (runs / "summary-part-partial.json").is_file() and not (runs / "summary.json").exists()
    study.run_plan(plan, runs, out, "python benchmarks/study.py --plan part", run=False)  # all done: not partial
    assert "PARTIAL" not in out.read_text() and (runs / "summary.json").is_file()


def test_k5_table_beside_the_papers_numbers():
    """``beside_paper``: every pair of the paper's K = 5 settings, paired by seed on our runs, against a
    hand-computed reference: the paper's gap, ours in points, and the verdict for each case (reproduces,
    same sign not significant, reversed, not run yet)."""
    study = _study()
    plan = study.PLANS["k5"]
    assert [v for _, _, v in study.PAPER["k5"]] == [40.1, 38.6, 37.2, 34.7]
    acc = {
        ("tinysearch_k5", "srpo"): [0.50, 0.52, 0.51, 0.49, 0.50, 0.53],  # sqrt K
        ("tinysearch_k5", "srpo_sum"): [0.40, 0.41, 0.42, 0.40, 0.39, 0.41],  # sum: 10 points below on every seed
        ("tinysearch", "srpo"): [0.51, 0.50, 0.50, 0.52, 0.48, 0.52],
    }  # K = 1: mixed signs vs sqrt K
    runs = [
        {"workflow": wf, "objective": obj, "seed": s, "eval": [[20, v]]}
        for (wf, obj), vs in acc.items()
        for s, v in enumerate(vs)
    ]
    pairs = study.beside_paper(plan, {"runs": runs})
    assert [(q["a"].split()[0], q["b"].split()[0]) for q in pairs] == [
        ("sqrt", "sum"),
        ("sqrt", "single"),
        ("sqrt", "mean"),
        ("sum", "single"),
        ("sum", "mean"),
        ("single", "mean"),
    ]
    by = {(q["a"].split()[0], q["b"].split()[0]): q for q in pairs}
    q = by[("sqrt", "sum")]
    assert q["paper"] == 1.5 and q["seeds"] == 6 and q["verdict"] == "reproduces"
    assert math.isclose(
        q["ours"][0], 100 * (sum(acc[("tinysearch_k5", "srpo")]) - sum(acc[("tinysearch_k5", "srpo_sum")])) / 6
    )
    assert q["ours"][3] == 2 / 2**6  # every seed the same sign: the exact sign-flip test's smallest p
    assert by[("sum", "single")]["paper"] == 1.4 and by[("sum", "single")]["verdict"] == "reversed"
    diffs = [a - b for a, b in zip(acc[("tinysearch_k5", "srpo")], acc[("tinysearch", "srpo")])]
    assert sum(diffs) > 0 and by[("sqrt", "single")]["verdict"] == "same sign, not significant"
    assert by[("sqrt", "mean")] == {
        "a": q["a"],
        "b": "mean (alpha = 1)",
        "paper": 5.4,
        "seeds": 0,
        "verdict": "not run yet",
    }
    rows = [
        {"workflow": "tinysearch_k5", "objective": "srpo", "acc": 0.5083, "acc_ci": 0.015, "start": 0.3, "seeds": 6}
    ]
    lines = study.paper_lines(plan, rows, pairs)
    assert "| sqrt K (alpha = 1/2) (`srpo` on tinysearch_k5) | 40.1 | 50.8 ± 1.5 | 30.0 | 6 |" in lines
    assert "| mean (alpha = 1) (`srpo_mean` on tinysearch_k5) | 34.7 | not run yet | - | 0 |" in lines
    # the replication on fresh seeds names every significant contrast and paper ordering of the first seeds
    first = {
        "contrasts": [
            {"a": ["tinysearch", "srpo"], "b": ["tinysearch_k5", "srpo"], "diff": [0.05, 0.01, 0.09, 0.01]},
            {"a": ["tinysearch_k5", "srpo"], "b": ["tinysearch_k5", "srpo_sum"], "diff": [0.01, -0.1, 0.1, 0.6]},
        ],
        "paper": json.loads(json.dumps(pairs)),
    }  # as the summary saves them
    again = [{"a": ["tinysearch", "srpo"], "b": ["tinysearch_k5", "srpo"], "diff": (-0.02, -0.05, 0.01, 0.3)}]
    new_pairs = [{"a": q["a"], "b": q["b"], "ours": (0.5, -1.0, 2.0, 0.4)} for q in pairs[:1]]
    rep = study.replication_pair_lines(first, again, new_pairs)
    # the contrast with p 0.01, sqrt K - sum and sum - single K (p 0.03125); not the p 0.6 one
    assert len(rep) == 3, rep
    assert rep[0].startswith("- `srpo` on tinysearch_k5 - `srpo` on tinysearch: +0.050") and "(reversed)" in rep[0]
    assert rep[1].startswith("- sqrt K (alpha = 1/2) - sum (alpha = 0)") and "same sign, not significant" in rep[1]
    assert rep[2].startswith("- sum (alpha = 0) - single searcher") and rep[2].endswith("not rerun here")


@pytest.mark.slow
def test_study_smoke_runs_and_resumes(reason_model, tmp_path):
    study = _study()
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    out.write_text("# Results\n\nkept text\n")
    runs = tmp_path / "runs"
    assert study.main(["--smoke", "--runs-dir", str(runs), "--out", str(out)]) == 0
    records = sorted(runs.glob("tinymath_mixed/*/seed*.json"))
    assert [p.relative_to(runs).as_posix() for p in records] == [
        "tinymath_mixed/grpo/seed0.json",
        "tinymath_mixed/grpo/seed1.json",
        "tinymath_mixed/srpo/seed0.json",
        "tinymath_mixed/srpo/seed1.json",
    ]
    rec = json.loads(records[-1].read_text())
    assert [s for s, _ in rec["eval"]] == [2] and len(rec["reward"]) == 2 and isinstance(rec["grad_norm"], list)
    assert all(k.startswith("loss/") and k.rsplit("/k", 1)[1].isdigit() for k in rec["diagnostics"])
    text = out.read_text()
    assert text.startswith("# Results\n\nkept text\n") and "<!-- study:smoke -->" in text
    assert "| tinymath_mixed | `grpo` |" in text and re.search(r", p[=<]\d", text)
    assert (tmp_path / "docs" / "img" / "study_smoke_curves.png").is_file()
    stamps = [p.stat().st_mtime_ns for p in records]
    assert study.main(["--smoke", "--runs-dir", str(runs), "--out", str(out)]) == 0  # resumes: nothing reruns
    assert [p.stat().st_mtime_ns for p in records] == stamps
    assert out.read_text().count("<!-- study:smoke -->") == 1
    # a disjoint set of seeds, then every saved seed pooled (a report: nothing runs)
    assert (
        study.main(["--smoke", "--seed-offset", "5", "--seeds", "1", "--runs-dir", str(runs), "--out", str(out)]) == 0
    )
    summary = (runs / "summary.json").read_text()
    assert study.main(["--smoke", "--pool", "--runs-dir", str(runs), "--out", str(out)]) == 0
    assert [p.stat().st_mtime_ns for p in records] == stamps and (runs / "summary.json").read_text() == summary
    pooled = json.loads((runs / "summary-smoke-pooled.json").read_text())
    assert pooled["plan"]["pooled"] == [0, 1, 5] and not pooled["todo"]
    assert {r["objective"]: r["seeds"] for r in pooled["rows"]} == {"srpo": 3, "grpo": 3}
    text = out.read_text()
    assert "<!-- study:smoke-seeds5-5 -->" in text and "Seeds 0..1, 5 (every set of seeds run so far, pooled)" in text
    with pytest.raises(SystemExit):
        study.main(["--smoke", "--pool", "--seed-offset", "5", "--runs-dir", str(runs), "--out", str(out)])


def test_study_workflows_flag_names_the_plans_workflows(capsys):
    study = _study()
    with pytest.raises(SystemExit) as e:
        study.main(["--plan", "math", "--workflows", "tinymath_select", "nope"])
    assert e.value.code == 2 and "--workflows: nope not in the plan" in capsys.readouterr().err


def test_bench_objectives_writes_only_its_own_section(tmp_path):
    """``benchmarks/bench_objectives.py`` replaces its marked section of the results page and keeps the
    study's and every other section (it used to rewrite the whole page)."""
    spec = importlib.util.spec_from_file_location("bench_objectives", ROOT / "benchmarks" / "bench_objectives.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "results.md"
    page = (
        "# Results\n\n<!-- study:learn -->\nstudy text\n<!-- end study:learn -->\n\n"
        f"{bench.BEGIN}\nold table\n{bench.END}\n\n<!-- lora -->\nlora text\n<!-- end lora -->\n"
    )
    out.write_text(page)
    bench.write_section(out, "new table")
    assert out.read_text() == page.replace("old table", "new table")
    fresh = tmp_path / "fresh.md"
    bench.write_section(fresh, "t")
    assert fresh.read_text() == f"{bench.BEGIN}\nt\n{bench.END}\n"


@pytest.mark.parametrize("name", ["math_routed_qwen3", "search_k5_qwen25"])
def test_paper_scale_workflows_and_configs_check(name):
    """docs/gpu.md's paper-scale runs: the .wf checks (with its set sizes) and the TOML validates."""
    wf = load_workflow(ROOT / "workflows" / "paper" / f"{name}.wf")
    cfg = load_config(ROOT / "workflows" / "paper" / f"{name}.toml")
    assert cfg.rollout.backend == "sglang" and cfg.objective.name == "srpo" and cfg.rollout.dtype == "bfloat16"
    assert (ROOT / cfg.rollout.tasks).is_file() and (ROOT / cfg.rollout.eval_tasks).is_file()
    sizes = {t.name: len(t.consume) for t in wf.transitions}
    assert sizes == ({"dispatch": 1, "gather": 3, "decide": 1} if name.startswith("math") else {"search": 5, "read": 1})


@pytest.mark.slow
def test_k5_search_evaluates_by_route_and_reader(reason_model, tmp_path):
    """``srpo-graph eval``'s code on the K = 5 workflow (the shrunk ``tiny-search``): every episode starts
    with the five searchers' set, then the reader; the reward reads the reader, so it is the answering
    agent; routes count the rounds. (The real model's starting accuracy is measured by the study.)"""
    from srpo_graph.train.eval_command import Source, evaluate_source

    rep, eps = evaluate_source(
        ROOT / "workflows" / "tinysearch_k5.wf",
        Source("base", "base"),
        None,
        samples=2,
        seed=0,
        num_tasks=4,
        out=tmp_path,
    )
    assert rep.overall.episodes == 8 and rep.statuses.get("failed", 0) == 0
    for e in eps:
        first = min(e.transitions, key=lambda t: t.step)
        assert first.name == "search" and len(first.consumed) == 5
    assert all(r.startswith("search > read") for r in rep.by_route), rep.by_route.keys()
    assert set(rep.by_agent) == {"reader"}
    assert sum(g.episodes for g in rep.by_route.values()) == 8


def test_study_replicates_on_disjoint_seeds_with_contrasts_and_power(tmp_path):
    """``--seed-offset``: a replication saves its records beside the first seeds' (disjoint files), writes
    its own section, and says whether each significant comparison held; a plan can run a workflow under
    fewer objectives (``objectives_on``) and compare cells across workflows (``contrasts``), each with
    the power estimate. None of it changes what a saved record must match (``Plan.key``)."""
    from dataclasses import replace

    study = _study()
    plan = study.Plan(
        "rep",
        ("coord_par2", "coord_par3"),
        ("srpo", "grpo"),
        seeds=2,
        steps=2,
        coord_steps=2,
        eval_every=2,
        eval_tasks=4,
        tasks_per_step=4,
        objectives_on=(("coord_par3", ("srpo",)),),
        contrasts=((("coord_par2", "srpo"), ("coord_par3", "srpo")),),
    )
    again = replace(plan, seed_offset=100)
    assert again.seed_list == [100, 101] and again.section == "rep-seeds100-101"
    assert plan.key("coord_par2") == replace(plan, objectives_on=(), contrasts=(), seed_offset=7).key("coord_par2")
    assert plan.cells("coord_par3") == ("srpo",) and plan.cells("coord_par2") == ("srpo", "grpo")
    out, runs = tmp_path / "results.md", tmp_path / "runs"
    study.run_plan(plan, runs, out, "first")
    study.run_plan(again, runs, out, "again")
    assert sorted(p.name for p in (runs / "coord_par2" / "srpo").glob("seed*.json")) == [
        "seed0.json",
        "seed1.json",
        "seed100.json",
        "seed101.json",
    ]
    assert not (runs / "coord_par3" / "grpo").exists()
    text = out.read_text()
    assert text.count("<!-- study:rep -->") == 1 and text.count("<!-- study:rep-seeds100-101 -->") == 1
    second = text[text.index("<!-- study:rep-seeds100-101 -->") :]
    assert "Seeds 100..101" in second and "Paired by seed: `srpo` on coord_par3 - `srpo` on coord_par2" in second
    assert "Replication of the comparisons the first seeds (0..1)" in second
    summary = json.loads((runs / "summary-rep-seeds100-101.json").read_text())
    assert summary["contrasts"][0]["seeds"] == 2 and summary["rows"][1]["seeds_needed"] >= 6
    # the verdicts, on made-up rows: held, same sign but not significant, reversed, not significant at first
    first = [
        {"workflow": "w", "objective": o, "vs_srpo": v}
        for o, v in (
            ("a", (0.1, 0, 0.2, 0.01)),
            ("b", (0.1, 0, 0.2, 0.01)),
            ("c", (-0.1, -0.2, 0, 0.02)),
            ("d", (0.1, 0, 0.2, 0.3)),
        )
    ]
    rerun = [
        {"workflow": "w", "objective": o, "vs_srpo": v}
        for o, v in (
            ("a", (0.05, 0, 0.1, 0.02)),
            ("b", (0.01, -0.1, 0.1, 0.4)),
            ("c", (0.05, 0, 0.1, 0.5)),
            ("d", (0.0, 0, 0, 1.0)),
        )
    ]
    lines = study.replication_lines(first, rerun)
    assert (
        len(lines) == 3
        and "**held**" in lines[0]
        and "same sign, not significant" in lines[1]
        and "reversed" in lines[2]
    )


def test_power_estimate_against_the_t_distribution():
    """``seeds_needed`` against scipy's t quantiles (the tables it uses) and a brute-force search."""
    stats = pytest.importorskip("scipy.stats")
    study = _study()
    for df in range(1, 31):
        assert (
            abs(stats.t.ppf(0.8, df) - study.T80[df - 1]) < 6e-4
            and abs(stats.t.ppf(0.975, df) - study.T975[df - 1]) < 6e-4
        )
    for sd in (0.005, 0.02, 0.05, 0.16):
        n = next(
            n
            for n in range(6, 100_000)
            if n >= ((stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / 0.015) ** 2
        )
        assert abs(study.seeds_needed(sd) - n) <= 1, (sd, n, study.seeds_needed(sd))


@pytest.mark.slow
def test_k5_plan_smoke(reason_model, tmp_path):
    """The k5 ablation plan's every code path once, shrunk (1 seed, 1 step, tiny evaluations) on the shrunk
    ``tiny-search``: five objectives on K = 5, ``srpo`` alone on K = 1, the contrasts, the page section."""
    from dataclasses import replace

    study = _study()
    plan = replace(
        study.PLANS["k5"],
        seeds=1,
        steps=1,
        eval_every=1,
        eval_tasks=2,
        eval_samples=2,
        tasks_per_step=2,
        samples=2,
        epochs=1,
    )
    assert plan.cells("tinysearch") == ("srpo",)
    assert plan.cells("tinysearch_k5") == ("srpo", "srpo_sum", "srpo_mean", "grpo", "dr_mas")
    out = tmp_path / "results.md"
    study.run_plan(plan, tmp_path / "runs", out, "python benchmarks/study.py --plan k5")
    text = out.read_text()
    assert "| tinysearch_k5 | `srpo_mean` |" in text and "| tinysearch | `srpo` |" in text
    assert "Paired by seed: `srpo` on tinysearch_k5 - `srpo` on tinysearch" in text
    assert "| sqrt K (alpha = 1/2) (`srpo` on tinysearch_k5) | 40.1 |" in text and "sqrt K (alpha = 1/2) - sum" in text
    rec = json.loads((tmp_path / "runs" / "tinysearch_k5" / "srpo" / "seed0.json").read_text())
    assert any(k.endswith("/k5") for k in rec["diagnostics"]), sorted(rec["diagnostics"])  # diagnostics by set size


def test_k5_retrieval_pools_the_five_queries_by_summed_score():
    """``workflows/searchpool.py``: the passages are the top k by the sum of their BM25 scores under the five
    queries (``pool="max"``: by the best), against a plain loop over the corpus; an unknown pool is an error."""
    sys.path.insert(0, str(ROOT / "workflows"))
    try:
        import searchpool
    finally:
        sys.path.remove(str(ROOT / "workflows"))
    from srpo_graph.std import DEFAULT_CORPUS, _bm25_index, _norm

    index, docs = _bm25_index(str(DEFAULT_CORPUS))
    queries = ["capital of morte", "flag of teda", "", "capital morte river crop year founder", "morte"]
    scores = [index.get_scores(_norm(q).split()) for q in queries if q]
    for pool, combine in (("sum", sum), ("max", max)):
        total = [combine(float(s[i]) for s in scores) for i in range(len(docs))]
        top = sorted(range(len(docs)), key=lambda i: -total[i])[:3]
        want = "\n".join(f"{docs[i]['title']}: {docs[i]['text']}" for i in top)
        assert searchpool.pooled(*queries, k=3, pool=pool) == want
    assert searchpool.pooled(*queries) == searchpool.pooled(*queries, k=2, pool="sum")
    with pytest.raises(ValueError, match="pool must be"):
        searchpool.pooled(*queries, pool="mean")
