"""A run is never lost or silently changed: damaged checkpoints and config.toml, the run lock,
SIGTERM / Ctrl-C at start-up and a full disk (issue 12, items 1-3, 5 and 21).

Everything is real: one short training run of the tiny model (shared by the tests, copied per
test), real files damaged byte by byte, real processes holding locks, killed by signals and
writing into ``/dev/full`` (the kernel's always-full device: every write fails with ENOSPC).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from srpo_graph.errors import ConfigError, SrpoGraphError
from srpo_graph.train import checkpoint as ck
from srpo_graph.train.checkpoint import layout
from srpo_graph.train.config.build import build_config
from srpo_graph.train.config.loading import load_toml, validate
from srpo_graph.train.observe.metrics import read_metrics
from srpo_graph.train.parallel.launch import _descendants
from srpo_graph.train.run_folder import lock_run_dir
from srpo_graph.train.trainer import train
from tests.support.cli import invoke
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_seq.wf"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
SMALL = {"steps": 2, "seed": 3, "rollout": {"tasks_per_step": 2, "samples": 2}, "eval": {"every": 0},
         "checkpoint": {"every": 1, "keep_last": 3}, "compile": {"micro_batch_tokens": 64},
         "logging": {"tensorboard": False, "plots": False, "progress": False, "traces_every": 0}}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("base") / "run"
    train(WF, validate({**SMALL, "run_dir": str(run)}))
    assert [s for s, _ in ck.checkpoint_dirs(run)] == [1, 2]
    return run


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(base_run, copy)
    return copy


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x40
    path.write_bytes(bytes(data))


def _nan_weights_with_a_consistent_manifest(step: Path) -> None:
    """The worst case: the files match their manifest, but the weights are NaN."""
    wpath = ck.policy_path(step, "tiny") / "model.safetensors"
    tensors = load_file(wpath)
    name = sorted(tensors)[0]
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, wpath, metadata={"format": "pt"})
    marker = json.loads((step / ck.COMPLETE).read_text())
    marker["files"] = layout.manifest(step)
    (step / ck.COMPLETE).write_text(json.dumps(marker))


def _state_with_a_consistent_manifest(path: str, value):
    """state.json with one field of the wrong kind, the manifest updated to match: only a check of
    state.json's fields can tell."""

    def damage(step: Path) -> None:
        state = json.loads((step / "state.json").read_text())
        obj = state
        *parents, last = path.split(".")
        for k in parents:
            obj = obj[k]
        obj[last] = value
        (step / "state.json").write_text(json.dumps(state))
        marker = json.loads((step / ck.COMPLETE).read_text())
        marker["files"] = layout.manifest(step)
        (step / ck.COMPLETE).write_text(json.dumps(marker))

    return damage


# state.json, manifest consistent: each field every reader relies on, of the wrong kind
STATE_DAMAGE = {
    "a string step": ("step", "2", "field `step`: Input should be a valid integer"),
    "a step that is not the folder's": ("step", 7, "field `step` is 7, but the folder is step_2"),
    "a negative cursor": ("cursor", -1, "field `cursor`: Input should be greater than or equal to 0"),
    "policies as one string": ("policies", "tiny", "field `policies`: Input should be a valid array"),
    "frozen pointers as a number": ("extra.frozen", 5, "field `extra.frozen`: Input should be an object"),
    "a version as text": ("extra.versions.tiny", "2", "field `extra.versions.tiny`"),
    "a reward as text": ("extra.rewards", ["a"], "field `extra.rewards.0`"),
    "an eval without its reward": ("extra.evals", [[1]], "field `extra.evals.0.1`"),
    "python RNG state as a number": ("rng.python", 5, "field `rng.python`"),
    "sharded as text": ("sharded", "yes", "field `sharded`: Input should be a valid boolean"),
}

DAMAGE = {
    "byte flip inside the weights": (lambda s: _flip_byte(ck.policy_path(s, "tiny") / "model.safetensors", -100),
                                     "does not match its checksum"),
    "byte flip in the safetensors header": (lambda s: _flip_byte(ck.policy_path(s, "tiny") / "model.safetensors", 20),
                                            "does not match its checksum"),
    "truncated optimizer state": (lambda s: (s / "optim" / "tiny.safetensors").write_bytes(
        (s / "optim" / "tiny.safetensors").read_bytes()[:50]), "optim/tiny.safetensors has 50 bytes"),
    "empty state.json": (lambda s: (s / "state.json").write_text(""), "state.json has 0 bytes"),
    "deleted RNG file": (lambda s: (s / "rng.safetensors").unlink(), "rng.safetensors is missing"),
    "deleted tokenizer file": (lambda s: next(ck.policy_path(s, "tiny").glob("tokenizer*")).unlink(), "is missing"),
    "garbage COMPLETE marker": (lambda s: (s / ck.COMPLETE).write_bytes(b"\xff\x00garbage"), "marker unreadable"),
    "deleted COMPLETE marker": (lambda s: (s / ck.COMPLETE).unlink(), "no COMPLETE marker"),
    "NaN weights, consistent manifest": (_nan_weights_with_a_consistent_manifest, "is not finite"),
    **{f"state.json with {k}, consistent manifest": (_state_with_a_consistent_manifest(path, value), why)
       for k, (path, value, why) in STATE_DAMAGE.items()},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_named_and_skipped(run, kind):
    newest = run / "checkpoints" / "step_2"
    assert ck.verify_checkpoint(newest) is None
    damage, why = DAMAGE[kind]
    damage(newest)
    assert why in ck.verify_checkpoint(newest)
    good, skipped = ck.latest_good_checkpoint(run)
    assert good == run / "checkpoints" / "step_1"
    assert [p for p, _ in skipped] == [newest]


@pytest.mark.parametrize("kind", sorted(STATE_DAMAGE))
def test_every_reader_of_state_json_names_a_field_of_the_wrong_kind(run, kind):
    """The readers besides the verification: `consolidate` on that folder names the checkpoint and
    the field (exit 7, no traceback); the frozen pointers read as absent (the verification reports
    the damage) and the recorded workflow's name is still found, instead of raising."""
    from srpo_graph.train.policies.frozen import saved_pointers
    from srpo_graph.train.run_folder import recorded_workflow

    path, value, why = STATE_DAMAGE[kind]
    newest = run / "checkpoints" / "step_2"
    _state_with_a_consistent_manifest(path, value)(newest)
    res = invoke("consolidate", newest, "--out", run.parent / "out")
    assert res.exit_code == 7 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert str(newest) in res.stderr and why in res.stderr, res.stderr[-2000:]
    assert saved_pointers(newest) is None
    (run / "workflow.json").unlink()  # the recorded workflow now comes from the checkpoints' state.json
    assert recorded_workflow(run) == {"name": "coord_seq"}  # it needs the name only, which is intact


def test_no_module_reads_state_json_but_the_checked_reader():
    """state.json is read in one place (layout.read_state, which checks every field's kind)."""
    import re

    pkg = ROOT / "srpo_graph"
    found = [f"{p.relative_to(pkg)}:{n}" for p in sorted(pkg.rglob("*.py")) if p.name != "layout.py"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"[/(]\s*[\"']state\.json[\"']", line) and "hf_tasks" not in p.name]
    # run_folder.recorded_workflow globs step_*/state.json for the name only, tolerating any damage
    assert not found, found


@pytest.mark.slow
def test_resume_falls_back_to_the_previous_good_checkpoint_and_says_so(run, capsys):
    _flip_byte(ck.policy_path(run / "checkpoints" / "step_2", "tiny") / "model.safetensors", -100)
    cfg = build_config(None, [], steps=3, resume=run)
    summary = train(WF, cfg, resume=True)
    err = capsys.readouterr().err
    assert f"checkpoint {run / 'checkpoints' / 'step_2'} is damaged" in err and "checksum" in err
    assert f"resuming from the previous good checkpoint {run / 'checkpoints' / 'step_1'}" in err
    assert summary.steps_this_run == 2 and summary.steps == 3  # steps 2 and 3 trained again
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
    assert ck.verify_checkpoint(run / "checkpoints" / "step_2") is None  # rewritten, good again


@pytest.mark.slow
def test_every_checkpoint_damaged_is_a_clear_error_naming_each(run):
    for _, step in ck.checkpoint_dirs(run):
        (step / "rng.safetensors").unlink()
    with pytest.raises(ConfigError, match="every checkpoint is damaged") as info:
        train(WF, build_config(None, [], steps=3, resume=run), resume=True)
    assert str(info.value).count("rng.safetensors is missing") == 2


@pytest.mark.slow
@pytest.mark.parametrize("damage, message", [
    (b"", "is empty"),
    (b"steps = 2\nseed = 3\n", "is incomplete (no run_dir, rollout"),
    (b"\xff\xfe\x00binary", "is damaged (not valid TOML: not UTF-8"),
    (b"steps = 2\n[rollout\n", "is damaged (not valid TOML"),
])
def test_a_damaged_config_toml_stops_resume_and_points_at_the_copy(run, damage, message):
    before = (run / "config.toml").read_text()
    (run / "config.toml").write_bytes(damage)
    with pytest.raises(ConfigError) as info:
        build_config(None, [], resume=run)
    text = str(info.value)
    assert message in text and "config.toml" in text
    copy = run / "checkpoints" / "step_2" / "config.toml"
    assert f"cp {copy} {run / 'config.toml'}" in text  # the checkpoint's copy restores it exactly
    assert load_toml(copy) == load_toml(_write(run / "orig.toml", before))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_config_toml_is_written_atomically(tmp_path):
    from srpo_graph.train.config.loading import TrainConfig, write_config

    path = tmp_path / "config.toml"
    write_config(TrainConfig(steps=7), path)
    write_config(TrainConfig(steps=8), path)
    assert load_toml(path)["steps"] == 8 and sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def _holder(run: Path) -> subprocess.Popen:
    """Another real process holding the run folder's lock."""
    code = ("import sys, time; from srpo_graph.train.run_folder import lock_run_dir; "
            "l = lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow
def test_a_second_training_process_in_one_run_folder_is_refused(run):
    holder = _holder(run)
    try:
        with pytest.raises(ConfigError, match=f"in use: process {holder.pid} on"):
            train(WF, build_config(None, [], steps=3, resume=run), resume=True)
        proc = subprocess.run(["srpo-graph", "train", str(WF), "--resume", str(run), "--steps", "3"],
                              capture_output=True, text=True, env=ENV, timeout=120)
        assert proc.returncode == 7 and "the run folder is in use" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        holder.kill()  # kill -9: the kernel drops the lock, nothing stale is left
        holder.wait()
    with lock_run_dir(run):  # free again
        pass
    assert [s for s, _ in ck.checkpoint_dirs(run)] == [1, 2]  # the refused runs touched nothing


def _cli(run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(["srpo-graph", "train", "workflows/coord_seq.wf", "--resume", str(run), *extra],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen, ready, run: Path) -> None:
    """Until ``ready()``, however slow the start here: fails when ``proc`` exits or ``run`` stops changing."""
    metrics = run / "metrics.jsonl"
    wait_for(ready, proc=proc, what="the state",
             progress=lambda: (sorted(map(str, run.rglob("*"))), metrics.stat().st_size if metrics.exists() else 0))


def _steps_logged(run: Path) -> int:
    """Whole lines in metrics.jsonl (a line the trainer is still writing would read as damaged)."""
    return (run / "metrics.jsonl").read_bytes().count(b"\n") if (run / "metrics.jsonl").exists() else 0


@pytest.mark.slow
def test_sigterm_during_the_loop_leaves_a_resumable_run(run):
    proc = _cli(run, "--steps", "40")
    _wait(proc, lambda: _steps_logged(run) >= 4, run)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err and f"--resume {run}" in err
    good, skipped = ck.latest_good_checkpoint(run)
    assert good is not None and not skipped and int(good.name.split("_")[1]) >= 3


@pytest.mark.slow
def test_ctrl_c_during_start_up_says_how_to_resume(run):
    proc = _cli(run, "--steps", "40")

    def locked() -> bool:  # the trainer has started: it (the command's child, supervisor.py) holds the lock
        try:
            return json.loads((run / ".lock").read_text() or "{}").get("pid") in (proc.pid, *_descendants(proc.pid))
        except (OSError, json.JSONDecodeError):
            return False

    _wait(proc, locked, run)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and f"--resume {run}" in err
    assert len(err.strip().splitlines()) <= 3
    assert ck.latest_good_checkpoint(run) == (run / "checkpoints" / "step_2", [])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_stops_with_the_resume_command_and_keeps_the_checkpoint(run):
    (run / "traces").mkdir(exist_ok=True)
    (run / "traces" / "step_3.jsonl").symlink_to("/dev/full")  # writing step 3's traces: ENOSPC
    proc = _cli(run, "--steps", "4", "logging.traces_every=1")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-2000:]
    assert "Traceback" not in err
    assert "No space left on device" in err and f"--resume {run}" in err
    assert ck.latest_good_checkpoint(run)[0] is not None
    assert not list((run / "checkpoints").glob(".tmp-*"))
    (run / "traces" / "step_3.jsonl").unlink()  # space freed: the advice works
    proc = _cli(run, "--steps", "4", "logging.traces_every=1")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_resume_works_from_any_working_directory(run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert Path(load_toml(run / "config.toml")["rollout"]["tasks"]).is_absolute()
    res = invoke("train", WF, "--resume", run, "--steps", "3", cwd=elsewhere)
    assert res.exit_code == 0, res.stderr[-2000:]
    assert "trained coord_seq for 1 steps" in res.stdout and "now at step 3" in res.stdout


def test_the_lock_is_released_and_an_unused_new_folder_removed(tmp_path):
    new = tmp_path / "new"
    with lock_run_dir(new):
        assert (new / ".lock").is_file()
        with pytest.raises(ConfigError, match="the run folder is in use"):  # also within one process
            lock_run_dir(new)
    assert not new.exists()  # nothing was written: no empty folder is left behind
    old = tmp_path / "old"
    old.mkdir()
    with lock_run_dir(old):
        pass
    assert old.is_dir()  # a folder that existed stays


def test_a_run_that_fails_before_writing_leaves_no_folder(tmp_path):
    run = tmp_path / "r"
    with pytest.raises(SrpoGraphError, match="no-such.jsonl"):
        train(WF, validate({**SMALL, "run_dir": str(run), "rollout": {"tasks": str(tmp_path / "no-such.jsonl")}}))
    assert not run.exists()
