"""The regime study's pure logic (benchmarks/study_regime.py, issue 38): what a record says by set size,
the choice of settings to compare, the paired contrasts and their replication, the records' keys, and
the report on a handful of fake records. No training runs here (the plan's runs are results:
``python benchmarks/study.py --plan regime``)."""

from __future__ import annotations

import doctest
import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there; study_regime imports study by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rg():
    _load("study")
    return _load("study_regime")


def test_doctests(rg):
    assert doctest.testmod(rg, optionflags=doctest.ELLIPSIS).failed == 0


def _rec(obj, seed, clip_k, rms_k, evals, cv=0.5):
    diag = {}
    for k, (up, lo) in clip_k.items():
        diag[f"loss/clip_upper/k{k}"] = up
        diag[f"loss/clip_lower/k{k}"] = lo
        diag[f"loss/epoch2/clip_upper/k{k}"] = 0.9  # a per-epoch key: never read as the run's share
    for k, v in rms_k.items():
        diag[f"loss/log_ratio_rms/k{k}"] = v
    return {
        "objective": obj,
        "seed": seed,
        "seconds": 10.0,
        "diagnostics": diag,
        "eval": [[20 * (i + 1), v] for i, v in enumerate(evals)],
        "grad_norm_cv": cv,
        "grad_norm": [0.5, 1.5, 2.0, 0.9],
    }


def test_record_by_size_and_the_setting_summary(rg):
    d = _rec("srpo", 0, {2: (0.1, 0.05), 1: (0.0, 0.01)}, {2: 0.2, 1: 0.1}, [0.1])["diagnostics"]
    assert rg.clip_share(d) == pytest.approx({1: 0.01, 2: 0.15})
    # the summed log-ratio's spread: the logged (normalised) one times K^alpha
    assert rg.raw_spread(d, "srpo")[2] == pytest.approx(0.2 * math.sqrt(2))
    assert rg.raw_spread(d, "srpo_sum")[2] == pytest.approx(0.2)
    assert rg.raw_spread(d, "srpo_mean")[2] == pytest.approx(0.4)
    assert rg.raw_spread(d, "grpo")[2] == pytest.approx(0.2)
    s = rg.Setting("coord_par2", 4, 1e-3)
    recs = [
        _rec("srpo", 0, {2: (0.1, 0.1)}, {2: 0.1}, [0.2, 0.4, 0.6]),
        _rec("srpo", 1, {2: (0.0, 0.1)}, {2: 0.3}, [0.2, 0.2, 0.2]),
        _rec("grpo", 0, {2: (0.0, 0.0)}, {2: 0.3}, [0.1, 0.1, 0.1]),
    ]
    row = rg.summarize(s, recs)
    assert row["k"] == 2 and set(row["objectives"]) == {"srpo", "grpo"}
    o = row["objectives"]["srpo"]
    assert o["seeds"] == [0, 1] and o["clip"] == pytest.approx(0.15)
    assert o["spread"] == pytest.approx(0.2 * math.sqrt(2))
    assert o["area"] == pytest.approx((0.4 + 0.2) / 2) and o["final"] == pytest.approx((0.5 + 0.2) / 2)
    assert o["grad_clipped"] == pytest.approx(0.5)  # two of the four steps over optim.grad_clip = 1
    # the slope of the spread against K: 0.5 for a sum of K independent log-ratios
    assert rg.spread_slope({k: 0.3 * k**0.5 for k in (2, 3, 5, 8)}) == pytest.approx(0.5)
    assert math.isnan(rg.spread_slope({2: 0.1}))


def test_the_settings_compared(rg):
    def row(wf, e, clip, area, stale=0):
        return {
            "setting": rg.Setting(wf, e, 1e-3, stale),
            "objectives": {"srpo": {"clip": clip, "area": 0.1}, "grpo": {"clip": 0.0, "area": area}},
        }

    rows = [
        row("a", 2, 0.05, 0.6),
        row("a", 4, 0.12, 0.6),
        row("a", 8, 0.3, 0.6),  # a: e8 clips most
        row("b", 8, 0.5, 0.12),  # clips most of all, but nothing learns: no contrast in learning to find
        row("c", 2, 0.9, 0.9, stale=1),  # staleness is scanned, not compared
        row("d", 4, 0.2, 0.3),
        row("e", 4, 0.11, 0.3),
    ]
    got = rg.select(rows)
    assert [(s.workflow, s.epochs) for s in got] == [("a", 8), ("d", 4)]  # the two that clip most, one per workflow
    assert [s.workflow for s in rg.select(rows, most=3)] == ["a", "d", "e"]
    assert rg.select(rows, bar=0.6) == []


def test_contrasts_pair_by_seed_and_replication(rg):
    s = rg.Setting("coord_par2", 8, 1e-3)
    recs = []
    for seed in range(8):
        recs.append(_rec("srpo", seed, {2: (0.1, 0.1)}, {2: 0.1}, [0.5 + 0.01 * seed] * 3))
        recs.append(_rec("srpo_sum", seed, {2: (0.1, 0.1)}, {2: 0.1}, [0.3 + 0.01 * seed + 0.005 * (seed % 2)] * 3))
    rows = rg.contrast_rows(s, recs, list(range(8)))
    assert [(r["a"], r["b"]) for r in rows] == [("srpo", "srpo_sum")]  # the others lack a cell, independent is grpo
    d, lo, hi, p = rows[0]["area"]
    assert d == pytest.approx(0.2 - 0.0025) and lo > 0 and p == pytest.approx(2 / 256)
    assert rows[0]["seeds"] == list(range(8)) and rows[0]["area_needed"] == 6
    assert rg.replicated(rows[0], None) is None
    assert rg.replicated(rows[0], rows[0]) is True
    flipped = {"area": (-d, -hi, -lo, p)}
    assert rg.replicated(rows[0], flipped) is False
    assert rg.replicated({"area": (0.1, -0.1, 0.3, 0.2)}, rows[0]) is None  # not significant at first


def test_keys_tell_settings_apart_and_keep_old_records(rg):
    study = sys.modules["study"]
    plan = study.PLANS["coord"]
    # a plan without overrides keys as before the field existed (the saved records stay valid)
    assert study.replace(plan, overrides=()).key("coord_par2") == plan.key("coord_par2")
    keys = {s.plan().key(s.workflow) for s in rg.SCAN if s.workflow == "coord_par3"}
    assert len(keys) == len([s for s in rg.SCAN if s.workflow == "coord_par3"])
    stale = rg.Setting("coord_par3", 2, 1e-3, 1).plan()
    assert "rollout.max_staleness=1" in stale.overrides and "rollout.worker=true" in stale.overrides
    off = rg.Setting("coord_par8", 8, 1e-3, grad_clip=0.0)
    assert off.name == "e8-lr0.001-s0-gc0" and off.plan().overrides == ("optim.grad_clip=0",)
    assert off.plan().key("coord_par8") != rg.Setting("coord_par8", 8, 1e-3).plan().key("coord_par8")
    # the per-member objectives run once where they coincide
    assert rg.Setting("coord_par5", 2, 1e-3).cells() == ("srpo_sum", "srpo", "srpo_mean", "grpo")
    assert rg.Setting("coord_mixed", 2, 1e-3).cells() == ("srpo_sum", "srpo", "srpo_mean", "grpo", "independent")
    assert rg.Setting("coord_par8", 2, 1e-3).k == 8


def test_the_report_from_a_few_records(rg, tmp_path):
    report = _load("study_regime_report")
    s = rg.SCAN[0]
    recs = [_rec(o, seed, {2: (0.01, 0.01)}, {2: 0.1}, [0.1, 0.2, 0.3]) for o in s.cells() for seed in range(2)]
    data = {
        "scan": [rg.summarize(x, recs if x == s else []) for x in rg.SCAN],
        "chosen": [],
        "compare": [],
        "todo": [(x.workflow, x.name, "srpo", 0) for x in rg.SCAN[1:]],
        "records": {(x.workflow, x.name): (recs if x == s else []) for x in rg.SCAN},
    }
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("# Results\n\nbefore\n", encoding="utf-8")
    report.write(data, tmp_path / "records", page, "python benchmarks/study.py --plan regime")
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Results\n\nbefore\n") and text.count("<!-- study:regime -->") == 1
    assert "PARTIAL" in text and "| coord_par2 (2) | 1 | 0.001 | 0 | 2.0% / 2.0% / 2.0% / 2.0% |" in text
    assert (tmp_path / "docs" / "img" / "study_regime_scan.png").is_file()
    report.write(data, tmp_path / "records", page, "python benchmarks/study.py --plan regime")  # replaced, not added
    assert page.read_text(encoding="utf-8").count("<!-- study:regime -->") == 1


def test_the_report_states_only_replicated_contrasts(rg, tmp_path):
    report = _load("study_regime_report")
    s = rg.Setting("coord_par2", 8, 1e-3)
    gap = {"srpo": 0.3, "srpo_sum": 0.2, "srpo_mean": 0.1, "grpo": 0.2}  # the paper's order, by wide margins
    recs = [
        _rec(o, seed, {2: (0.1, 0.05)}, {2: 0.2}, [gap[o] + 0.01 * (seed % 3) + 0.002 * (seed % 2) * (o == "srpo")] * 3)
        for o in s.cells()
        for seed in [*range(rg.COMPARE_SEEDS), *range(rg.REPLICATION_OFFSET, rg.REPLICATION_OFFSET + rg.COMPARE_SEEDS)]
    ]
    first = rg.contrast_rows(s, recs, list(range(rg.COMPARE_SEEDS)))
    rep = list(range(rg.REPLICATION_OFFSET, rg.REPLICATION_OFFSET + rg.COMPARE_SEEDS))
    again = {(c["a"], c["b"]): c for c in rg.contrast_rows(s, recs, rep)}
    data = {
        "scan": [rg.summarize(x, recs if x == s else []) for x in rg.SCAN],
        "chosen": [s],
        "compare": [
            {**c, "again": again[(c["a"], c["b"])] if (c["a"], c["b"]) != ("srpo", "grpo") else None} for c in first
        ],
        "todo": [],
        "records": {(x.workflow, x.name): (recs if x == s else []) for x in rg.SCAN},
    }
    off = rg.Setting(s.workflow, s.epochs, s.lr, grad_clip=0.0)
    data["ablation"] = [
        {**r, "of": s.name, "records": recs}
        for r in rg.contrast_rows(off, recs, list(range(rg.COMPARE_SEEDS)))
        if (r["a"], r["b"]) == ("srpo", "srpo_sum")
    ]
    page = tmp_path / "results.md"
    report.write(data, tmp_path / "records", page, "python benchmarks/study.py --plan regime")
    text = page.read_text(encoding="utf-8")
    assert "PARTIAL" not in text
    assert "Replicated: sqrt K (alpha 1/2) learns faster than sum (alpha 0)" in text
    assert "Replicated: sum (alpha 0) learns faster than mean (alpha 1)" in text
    assert "GRPO per member on" not in text  # significant once, never replicated: not stated
    assert "Both of its steps replicated as contrasts in coord_par2 e8-lr0.001-s0" in text
    assert "Without the grad-norm clip (`optim.grad_clip=0`, the same seeds) the gap is +0.101" in text
    assert "Its run without the grad-norm clip is not saved yet." in text  # sum - mean: no ablation record
