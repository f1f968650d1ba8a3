"""Overlapped rollouts are corrected against the behaviour policy by default, on every backend
(issue 36 item 1, ``train/config/defaults.py``).

The rule is checked over every row of ``BACKENDS`` x ``max_staleness`` in {0, 1, 2}: stale runs
resolve ``loss.mismatch`` to ``decoupled``, synchronous ones to their backend's own default; an
explicit ``none`` beside stale samples is one error naming both fields, whichever way the config
was made (validated, copied, resumed). One real 3-step run through the rollout worker (tiny model,
real child process) shows the weight pi_prox / mu at work in metrics.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srpo_graph.backends import BACKENDS
from srpo_graph.errors import ConfigError
from srpo_graph.srpo.options import Mismatch
from srpo_graph.train.config.build import build_config
from srpo_graph.train.config.defaults import with_loss_defaults
from srpo_graph.train.config.loading import validate, write_config
from srpo_graph.train.config.refusals import check_async

ROOT = Path(__file__).resolve().parents[2]
CASES = [(b, k) for b in BACKENDS for k in (0, 1, 2)]


def _rollout(backend: str, k: int) -> dict:
    return {"backend": backend, "max_staleness": k, "worker": BACKENDS[backend].in_process and k >= 1}


@pytest.mark.parametrize("backend,k", CASES)
def test_the_default_corrects_stale_samples_on_every_backend(backend, k):
    got = validate({"rollout": _rollout(backend, k)}).loss.mismatch
    want = Mismatch.DECOUPLED if k >= 1 else Mismatch(BACKENDS[backend].loss_defaults.get("mismatch", "none"))
    assert got is want, (backend, k, got)


@pytest.mark.parametrize("backend,k", [c for c in CASES if c[1] >= 1])
def test_an_explicit_none_with_stale_samples_is_refused_naming_both_fields(backend, k):
    with pytest.raises(ConfigError) as err:
        validate({"rollout": _rollout(backend, k), "loss": {"mismatch": "none"}})
    text = str(err.value)
    assert "`loss.mismatch`" in text and "`rollout.max_staleness`" in text
    assert "rollout.max_staleness = 0" in text and "loss.mismatch = decoupled" in text  # the fixes
    for chosen in ("tis", "mask", "decoupled"):  # every correction the user picks is kept
        assert validate({"rollout": _rollout(backend, k), "loss": {"mismatch": chosen}}).loss.mismatch == chosen


@pytest.mark.parametrize("backend,k", CASES)
def test_a_config_made_by_copy_gets_the_same_rule(backend, k):
    """A config copied with a new rollout section (no validator runs) is resolved by the trainer's
    ``with_loss_defaults`` and refused by ``check_async`` alike."""
    base = validate({})  # loss left unset
    cfg = base.model_copy(update={"rollout": base.rollout.model_copy(update=_rollout(backend, k))})
    want = validate({"rollout": _rollout(backend, k)}).loss.mismatch
    assert with_loss_defaults(cfg).loss.mismatch is want
    explicit = cfg.model_copy(update={"loss": cfg.loss.model_copy(update={"mismatch": Mismatch.NONE})})
    if k >= 1:
        with pytest.raises(ConfigError, match="loss.mismatch"):
            with_loss_defaults(explicit)
        with pytest.raises(ConfigError, match="rollout.max_staleness"):
            check_async(explicit)
    else:
        assert with_loss_defaults(explicit).loss.mismatch is Mismatch.NONE


def test_resume_keeps_the_resolved_correction_and_resolves_older_runs(tmp_path):
    """A run's config.toml holds the resolved value; a run saved before the rule (``none`` written
    beside ``max_staleness = 1``) resumes corrected, not refused: the saved default is not a choice."""
    run = tmp_path / "run"
    run.mkdir()
    write_config(validate({"run_dir": str(run), "rollout": _rollout("transformers", 1)}), run / "config.toml")
    assert 'mismatch = "decoupled"' in (run / "config.toml").read_text()
    assert build_config(None, [], resume=run).loss.mismatch is Mismatch.DECOUPLED
    old = (run / "config.toml").read_text().replace('mismatch = "decoupled"', 'mismatch = "none"')
    (run / "config.toml").write_text(old)
    assert build_config(None, [], resume=run).loss.mismatch is Mismatch.DECOUPLED
    assert build_config(None, ["rollout.max_staleness=0"], resume=run).loss.mismatch is Mismatch.NONE


@pytest.mark.proc  # the rollout worker is a process
def test_a_stale_run_through_the_rollout_worker_trains_with_the_weight_active(tmp_path):
    """3 steps of coord_par2 with ``rollout.worker=true rollout.max_staleness=1`` and nothing else set:
    steps 2 and 3 train on outputs a version old (gap ~0.2 nats per token), and the decoupled
    weight pi_prox / mu of each set is not 1 there."""
    from srpo_graph.train.observe.metrics import read_metrics
    from srpo_graph.train.trainer import train

    data = {"run_dir": str(tmp_path / "run"), "steps": 3, "seed": 0,
            "rollout": {"tasks_per_step": 4, "samples": 8, "worker": True, "max_staleness": 1,
                        "tasks": str(ROOT / "workflows" / "tasks" / "coord.jsonl")},
            "checkpoint": {"every": 0}, "eval": {"every": 0},
            "logging": {"tensorboard": False, "plots": False, "progress": False}}
    train(ROOT / "workflows" / "coord_par2.wf", validate(data))
    assert 'mismatch = "decoupled"' in (tmp_path / "run" / "config.toml").read_text()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    stale = [r for r in rows if r["staleness/max"] >= 1]
    assert len(stale) == 2, json.dumps([r.get("staleness/max") for r in rows])
    for r in stale:
        assert r["mismatch/stale_mean_abs"] > 1e-2  # the samples really are off-policy
        assert abs(r["loss/mismatch_weight_mean"] - 1.0) > 1e-3, r["loss/mismatch_weight_mean"]
        assert r["loss/is_weight_std/k2"] > 1e-3
