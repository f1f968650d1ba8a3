"""Every command that reads a checkpoint verifies it first (issue 40, item 2; Note [One verified read]).

A real run folder (coord_par2 on the tiny model, 2 steps, a checkpoint each step), then real damage
to a copy of it -- a flipped byte in a weight file, a missing file, a truncated state.json, a file
swapped for another -- read by every reader: ``eval`` on the run, on the step folder and on
the step's policy folder used as a model, ``consolidate`` on the run and on the step folder, and a
frozen policy pointing into the checkpoint. Each must stop with a located error (exit 7) naming the
file, and write nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from srpo_graph.cli import app

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_par2.wf"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readers") / "run"
    res = CliRunner().invoke(app, ["train", str(WF), "--steps", "2", "--run-dir", str(d), "checkpoint.every=1",
                                   "checkpoint.keep_last=2", "rollout.tasks_per_step=2", "rollout.samples=2",
                                   "eval.every=0", "logging.progress=false", "logging.tensorboard=false",
                                   "logging.plots=false"])
    assert res.exit_code == 0, res.output
    return d


def _weights(step: Path) -> Path:
    return next(p for p in sorted((step / "policies" / "tiny").iterdir()) if p.suffix == ".safetensors")


def _flip(path: Path) -> str:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return f"{path.parent.name}/{path.name}" if path.parent.name == "tiny" else path.name


DAMAGE = {
    "flipped byte": lambda step: ("policies/tiny/" + _weights(step).name, _flip(_weights(step))),
    "missing file": lambda step: ("policies/tiny/" + _weights(step).name, _weights(step).unlink()),
    "truncated state": lambda step: ("state.json", (step / "state.json").write_text('{"step": 2, "pol')),
    "swapped file": lambda step: ("policies/tiny/config.json",
                                  shutil.copy(step / "policies/tiny/generation_config.json",
                                              step / "policies/tiny/config.json")),
}


def _readers(run: Path, out: Path) -> dict[str, list[str]]:
    step = run / "checkpoints" / "step_2"
    return {
        "eval run --step": ["eval", str(WF), str(run), "--step", "2", "--samples", "1", "--out", str(out)],
        "eval step folder": ["eval", str(WF), str(step), "--samples", "1", "--out", str(out)],
        "eval policy folder": ["eval", str(WF), str(step / "policies" / "tiny"), "--samples", "1", "--out", str(out)],
        "consolidate step folder": ["consolidate", str(step), "--out", str(out)],
        "consolidate run --step": ["consolidate", str(run), "--step", "2", "--out", str(out)],
    }


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_reader_refuses_a_damaged_checkpoint_naming_the_file(run, tmp_path, damage):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    rel, _ = DAMAGE[damage](copy / "checkpoints" / "step_2")
    for name, args in _readers(copy, tmp_path / "out").items():
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 7, (name, res.output)
        assert "step_2" in res.output and (rel in res.output or "state.json" in res.output), (name, res.output)
        assert "Traceback" not in res.output
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.safetensors")), name


def test_the_newest_good_checkpoint_is_taken_when_the_newest_is_damaged(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    _flip(_weights(copy / "checkpoints" / "step_2"))
    res = CliRunner().invoke(app, ["consolidate", str(copy), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "step_1" in res.output


def test_a_good_checkpoint_reads(run, tmp_path):
    for i, (name, args) in enumerate(_readers(run, tmp_path / "out").items()):
        args = [a.replace(str(tmp_path / "out"), str(tmp_path / f"out{i}")) for a in args]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, (name, res.output)


def test_a_frozen_policy_pointing_into_a_damaged_checkpoint_is_refused(run, tmp_path):
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.checkpoint import verified_model_path

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    folder = copy / "checkpoints" / "step_2" / "policies" / "tiny"
    assert verified_model_path(str(folder)) == str(folder)
    _flip(_weights(copy / "checkpoints" / "step_2"))
    with pytest.raises(ConfigError, match="does not match its checksum"):
        verified_model_path(str(folder))


def test_a_reader_keeps_its_snapshot_when_the_checkpoint_is_rotated_away(run, tmp_path):
    """Issue 40, item 6 (Note [Reading beside a training run]): what a reader opened is a snapshot, so
    the checkpoint's rotation (keep_last) mid-read takes nothing from it."""
    from srpo_graph.train.checkpoint import open_checkpoint
    from srpo_graph.train.checkpoint.sharded import consolidate

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    snap = open_checkpoint(copy, reader="consolidate")
    assert snap.name == "step_2" and snap != copy / "checkpoints" / "step_2"
    shutil.rmtree(copy / "checkpoints" / "step_2")  # rotated away while the reader works
    written = consolidate(snap, "tiny", tmp_path / "out")
    assert any(written.glob("*.safetensors"))


def test_a_checkpoint_removed_while_it_is_opened_is_named_or_the_newest_good_one_taken(run, tmp_path, monkeypatch,
                                                                                        capsys):
    """The rotation at the instant the reader links the checkpoint: a test double for that instant
    (``os.link`` removes the folder on its first call, as a rotation would), which a real run cannot
    produce on demand. A run folder's reader takes the newest good checkpoint left and says so; a
    reader of that very checkpoint is told it was rotated away."""
    import os

    from srpo_graph.errors import ConfigError
    from srpo_graph.train.checkpoint import open_checkpoint

    copy = tmp_path / "run"
    real_link = os.link

    def rotating_link(src, dst, *a, **kw):
        step2 = copy / "checkpoints" / "step_2"
        if step2.exists() and str(src).startswith(str(step2)):
            shutil.rmtree(step2)
        return real_link(src, dst, *a, **kw)

    for explicit in (False, True):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(run, copy)
        monkeypatch.setattr(os, "link", rotating_link)
        if explicit:
            with pytest.raises(ConfigError, match="rotated it away"):
                open_checkpoint(copy, 2, reader="evaluate")
        else:
            assert open_checkpoint(copy, reader="evaluate").name == "step_1"
            assert "took step_1: step_2 removed while being opened" in capsys.readouterr().err
        monkeypatch.undo()


@pytest.mark.slow
def test_consolidate_beside_a_real_run_that_rotates_its_checkpoints(tmp_path):
    """A real training process (keep_last=1, a checkpoint every step) and consolidate called over and
    over beside it from its first checkpoint on: every call writes a model or names why, none ends in
    a traceback, and none finds the run without a good checkpoint (the newest is in place before the
    one before it goes). How many calls a rotation catches mid-read is the machine's timing, not a
    property (a CI run under load had 61% of its calls before the first checkpoint): it is not counted.
    After the run the call takes its last step."""
    import subprocess
    import sys

    from tests.support.waiting import wait_for

    run_dir, err = tmp_path / "run", tmp_path / "train.err"
    with open(err, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "srpo_graph.cli", "train", str(WF), "--steps", "12",
                                 "--run-dir", str(run_dir), "checkpoint.every=1", "checkpoint.keep_last=1",
                                 "rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0",
                                 "logging.progress=false", "logging.tensorboard=false", "logging.plots=false"],
                                stdout=subprocess.DEVNULL, stderr=sink)
    outcomes = []
    try:
        wait_for(lambda: any((run_dir / "checkpoints").glob("step_*")), proc=proc, what="the first checkpoint")
        while proc.poll() is None:
            out = tmp_path / f"out{len(outcomes)}"
            res = CliRunner().invoke(app, ["consolidate", str(run_dir), "--out", str(out)])
            outcomes.append((res.exit_code, res.output))
    finally:
        proc.wait(300)
    assert proc.returncode == 0, err.read_text()[-2000:]
    assert outcomes and all(code in (0, 7) for code, _ in outcomes), outcomes
    assert all("Traceback" not in text for _, text in outcomes)
    assert not [text for _, text in outcomes if "(no checkpoint)" in text], "a moment without a good checkpoint"
    assert any(code == 0 for code, _ in outcomes), outcomes
    last = CliRunner().invoke(app, ["consolidate", str(run_dir), "--out", str(tmp_path / "last")])
    assert last.exit_code == 0 and "step_12" in last.output, last.output
