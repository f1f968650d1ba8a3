"""The ``srpo-graph train`` command as a subprocess: a real run, a resume, errors with exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def _cli(*args, timeout=300):
    return subprocess.run(["srpo-graph", "train", *args], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=timeout)


@pytest.mark.slow
def test_cli_trains_then_resumes(tmp_path, monkeypatch):
    """A run and its resume as processes (the console script, and the module entry point torchrun
    uses); the refusals that follow are about an exit code and a message, so they run in this
    process (click's CliRunner: the same ``app``, no 5-10 s of imports each)."""
    from click.testing import CliRunner

    from srpo_graph.cli import app

    run = tmp_path / "run"
    small = ["rollout.tasks_per_step=4", "rollout.samples=4", "eval.every=2", "logging.tensorboard=false"]
    proc = _cli("workflows/coord_seq.wf", "--steps", "2", "--run-dir", str(run), *small)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trained coord_seq for 2 steps" in proc.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("reward" in r for r in rows)
    assert (run / "config.toml").is_file() and (run / "checkpoints" / "step_2" / "COMPLETE").is_file()
    assert "workflows/tasks/coord.jsonl" in (run / "config.toml").read_text()  # the default task file
    # extend the same run by one step from its checkpoint (the module entry point torchrun uses)
    proc = subprocess.run([sys.executable, "-m", "srpo_graph.train", "workflows/coord_seq.wf", "--resume", str(run),
                           "--steps", "3"], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]

    monkeypatch.chdir(ROOT)

    def cli(*args: str):
        res = CliRunner().invoke(app, ["train", *args])
        assert not isinstance(res.exception, Exception), res.output  # no traceback: a SystemExit or none
        return res

    # another .wf (other task fields too): the run's own workflow is named first, nothing else
    res = cli("workflows/math_pipeline.wf", "--resume", str(run), "--steps", "4")
    assert res.exit_code == 7 and "Traceback" not in res.stderr, res.output[-2000:]
    assert "this run trained workflow 'coord_seq' (file " in res.stderr and "coord_seq.wf" in res.stderr
    assert "task" not in res.stderr.split("this run trained")[0]
    # a fresh run in the used folder is refused and loses nothing; --overwrite replaces it
    before = {p: p.read_bytes() for p in (run / "metrics.jsonl", run / "config.toml")}
    res = cli("workflows/coord_seq.wf", "--steps", "1", "--run-dir", str(run), *small)
    assert res.exit_code == 7 and "--resume" in res.stderr and "Traceback" not in res.stderr
    assert {p: p.read_bytes() for p in before} == before
    res = cli("workflows/coord_seq.wf", "--steps", "1", "--run-dir", str(run), "--overwrite", *small)
    assert res.exit_code == 0, res.output[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and not (run / "checkpoints" / "step_3").exists()


def test_cli_config_errors_exit_7_and_name_the_field(tmp_path):
    from tests.support.cli import invoke

    res = invoke("train", "workflows/coord_seq.wf", "optim.lr=-1", "--run-dir", tmp_path / "x", cwd=ROOT)
    assert res.exit_code == 7
    assert "`optim.lr`" in res.stderr and "fix:" in res.stderr and "Traceback" not in res.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlr = \n")
    res = invoke("train", "workflows/coord_seq.wf", "--config", bad, cwd=ROOT)
    assert res.exit_code == 7 and str(bad) in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x").exists()  # nothing is written for an invalid config


@pytest.mark.slow
@pytest.mark.parametrize("start", ["forkserver", "exec"])
def test_cli_nproc_2_matches_one_process(tmp_path, one_process, start):
    """`--nproc 2` re-launches under torchrun (gloo): every rank samples its share of each step's tasks
    (3 tasks: an uneven split) and of the eval tasks, both ranks update; the traces, metrics and eval
    equal one process's (the session's single-process run of the same arguments:
    tests/support/reference_runs.py) -- with the ranks forked from the preloaded forkserver (the
    default) and started as new interpreters (Note [Ranks forked from a preloaded server],
    train/parallel/forked.py)."""
    from srpo_graph.train.parallel.forked import START_ENV
    from tests.support.reference_runs import COORD_MIXED

    runs = {1: one_process(COORD_MIXED), 2: tmp_path / "n2"}
    assert "rollout.tasks_per_step=3" in COORD_MIXED and "logging.traces_every=1" in COORD_MIXED
    # the launcher under -X importtime (its own imports only: torchrun and the ranks are other interpreters)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "srpo_graph.cli", "train", *COORD_MIXED,
                           "--nproc", "2", "--run-dir", str(runs[2])], capture_output=True, text=True, cwd=ROOT,
                          env={**ENV, START_ENV: start}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # it only starts torchrun: no torch (Note [A table without torch], train/parallel/strategies.py)
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert "srpo_graph.train.config.refusals" in imported and "torch" not in imported, \
        [m for m in imported if m.startswith("torch")][:5]
    rows = {n: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for n, run in runs.items()}
    assert [r["step"] for r in rows[2]] == [1, 2]
    for a, b in zip(rows[1], rows[2]):
        assert a["reward"] == b["reward"] and a["events"] == b["events"] and a["tokens"] == b["tokens"]
        assert a["episodes"] == b["episodes"] == 12
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm/tiny"] == pytest.approx(b["grad_norm/tiny"], rel=1e-5)
    assert rows[1][1]["eval/reward"] == rows[2][1]["eval/reward"]
    for step in (1, 2):  # the same episodes (step 2 samples with the updated weights)
        one, two = ([json.loads(line) for line in (runs[n] / "traces" / f"step_{step}.jsonl").open()]
                    for n in (1, 2))
        assert len(one) == len(two) == 12
        lp1, lp2 = ([lp for ep in eps for o in ep["outputs"] for lp in o.pop("logprobs")] for eps in (one, two))
        assert one == two  # tokens, texts, values, rewards, seeds, versions: exactly
        # log-probs: equal up to float rounding (a forward over another batch of rows; fp32 on CPU)
        assert lp1 == pytest.approx(lp2, abs=1e-5)


@pytest.mark.slow
def test_objective_is_selected_on_the_command_line_and_saved(tmp_path):
    """`objective=dapo` trains with DAPO's loss and compile options; config.toml keeps it for --resume.
    (In this process: the subject is what the command saves and says, tests/support/cli.py.)"""
    import tomllib

    from tests.support.cli import invoke

    run = tmp_path / "run"
    small = ["rollout.tasks_per_step=4", "rollout.samples=4", "eval.every=0", "logging.tensorboard=false",
             "logging.plots=false", "optim.epochs=2"]
    res = invoke("train", "workflows/coord_par2.wf", "--steps", "1", "--run-dir", run, "objective=dapo",
                 "loss.eps_low=0.1", *small, cwd=ROOT)
    assert res.exit_code == 0, res.output[-2000:]
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["objective"]["name"] == "dapo"
    assert saved["loss"]["reduction"] == "token" and saved["loss"]["eps_high"] == 0.28
    assert saved["loss"]["eps_low"] == 0.1  # the explicit setting won over the row
    assert saved["compile"]["drop_zero_variance"] is True and saved["compile"]["advantage"] == "episode"
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "loss/epoch2/clip_frac" in row and "compile/dropped_zero_variance_events" in row
    res = invoke("train", "workflows/coord_par2.wf", "--steps", "1", "--run-dir", tmp_path / "bad", "objective=dapoo",
                 cwd=ROOT)
    assert res.exit_code == 7 and "did you mean 'dapo'" in res.stderr and "Traceback" not in res.stderr
