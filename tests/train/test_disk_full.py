"""Disk full while a checkpoint is written (issue 23, item 4), on a real small file system.

The run folder lives on a tmpfs sized so that step 1's checkpoint fits and step 2's runs out of
space inside one chosen file (the weights -- safetensors --, the optimizer state -- safetensors --,
the RNG state, state.json). Every case must end with exit 1, one message naming the disk and the
command that continues, no traceback, no half-written folder; once there is space, that command
finishes the run. The tmpfs is mounted in a user+mount namespace (``unshare -rm``), so the test
needs no root; it is skipped where namespaces are not allowed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph.train import checkpoint as ck
from srpo_graph.train.observe.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_seq.wf"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
ARGS = ["rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0", "checkpoint.every=1",
        "checkpoint.keep_last=5", "logging.tensorboard=false", "logging.plots=false", "logging.traces_every=0",
        "logging.progress=false"]
PAGE = 4096
# the files of a checkpoint in the order save_checkpoint writes them; each case fails inside one
ORDER = ["policies/tiny/config.json", "policies/tiny/generation_config.json", "policies/tiny/model.safetensors",
         "policies/tiny/tokenizer_config.json", "policies/tiny/special_tokens_map.json", "policies/tiny/vocab.json",
         "policies/tiny/tokenizer.json", "optim/tiny.safetensors", "optim/tiny.json", "config.toml",
         "rng.safetensors", "state.json"]
TARGETS = ["policies/tiny/model.safetensors", "optim/tiny.safetensors", "rng.safetensors", "state.json"]


def _pages(n: int) -> int:
    return -(-n // PAGE)


def _can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"],
                           capture_output=True)
    return probe.returncode == 0


def _cli_train(*args: str) -> None:
    """``srpo-graph train ARGS`` through the CLI's own entry point, in this process (the runs on a
    full disk are subprocesses: they need the tmpfs's mount namespace; these two need no process
    and Python+torch start-up of their own)."""
    from click.testing import CliRunner

    from srpo_graph.cli import app

    res = CliRunner().invoke(app, ["train", *args])
    assert res.exit_code == 0, (res.output[-2000:], res.exception)


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    _cli_train(str(WF), "--steps", "1", "--run-dir", str(run), *ARGS)
    return run


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="needs user+mount namespaces (unshare -rm) to mount a small tmpfs")
@pytest.mark.parametrize("target", TARGETS)
def test_disk_full_inside_a_checkpoint_stops_with_the_resume_command(one_step, tmp_path, target):
    ckpt = one_step / "checkpoints" / "step_1"
    files = [f for f in ORDER if (ckpt / f).is_file()]
    assert target in files
    extra = [p for p in ckpt.rglob("*") if p.is_file() and str(p.relative_to(ckpt)) not in files]
    used = sum(_pages(p.stat().st_size) for p in one_step.rglob("*") if p.is_file())
    before = sum(_pages((ckpt / f).stat().st_size) for f in files[: files.index(target)])
    before += sum(_pages(p.stat().st_size) for p in extra if p.name != "COMPLETE")
    size = (used + before + 2 + _pages((ckpt / target).stat().st_size) // 2) * PAGE
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inner = mnt / "run"
    train = [sys.executable, "-m", "srpo_graph.cli", "train", str(WF), "--resume", str(inner), "--steps", "2"]
    script = (f"mount -t tmpfs -o size={size} tmpfs {mnt} && cp -a {one_step} {inner} && "
              f"{' '.join(train)}; rc=$?; ls -a {inner}/checkpoints > {tmp_path}/ls.txt; "
              f"cp -a {inner} {tmp_path}/after; exit $rc")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    err = proc.stderr
    assert proc.returncode == 1, (target, size, err[-3000:])
    assert "Traceback" not in err and "SafetensorError" not in err, err[-3000:]
    assert "stopped after step 2: No space left on device" in err, err[-3000:]
    assert f"newest complete checkpoint: {inner}/checkpoints/step_1" in err
    assert f"free space, then resume: srpo-graph train {WF} --resume {inner}" in err
    assert (tmp_path / "ls.txt").read_text().split() == [".", "..", "step_1"]  # no .tmp- folder left
    # with space (the same folder, on the normal disk), the printed command finishes the run
    after = tmp_path / "after"
    _cli_train(str(WF), "--resume", str(after))
    assert [r["step"] for r in read_metrics(after / "metrics.jsonl")] == [1, 2]
    assert ck.latest_good_checkpoint(after)[0] == after / "checkpoints" / "step_2"


def _on_a_full_tmpfs(tmp_path: Path, free_pages: int, copy: Path | None, *args: str) -> subprocess.CompletedProcess:
    """``srpo-graph train ARGS`` with its run folder ``<mnt>/run`` (a copy of ``copy``, or none) on a
    1 MiB tmpfs filled up to ``free_pages`` free pages; ``<tmp_path>/after`` keeps what was left."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    train = [sys.executable, "-m", "srpo_graph.cli", "train", *args]
    script = (f"mount -t tmpfs -o size=8m tmpfs {mnt} && {f'cp -a {copy} {mnt}/run && ' if copy else ''}"
              f"avail=$(df -B{PAGE} --output=avail {mnt} | tail -1) && "
              f"dd if=/dev/zero of={mnt}/filler bs={PAGE} count=$((avail - {free_pages})) status=none && "
              f"{' '.join(train)}; rc=$?; (cp -a {mnt}/run {tmp_path}/after 2>/dev/null || true); exit $rc")
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="needs user+mount namespaces (unshare -rm) to mount a small tmpfs")
@pytest.mark.parametrize("free_pages, file", [(0, ".lock"), (1, "config.toml"), (2, "workflow.json")])
def test_disk_full_while_a_new_run_is_set_up_is_one_message(tmp_path, free_pages, file):
    """Every write of a new run's set-up -- the lock, config.toml, the workflow's record -- on a disk
    that fills up inside it (a real tmpfs with that many free pages): exit 1, one message naming the
    file and what its file system has left, what to do, no traceback, nothing half-written left."""
    mnt = tmp_path / "mnt"
    proc = _on_a_full_tmpfs(tmp_path, free_pages, None, str(WF), "--steps", "1", "--run-dir", str(mnt / "run"), *ARGS)
    err = proc.stderr
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert f"No space left on device ({mnt}/run/{file}; " in err and " bytes free on that file system)" in err, err
    if file == "workflow.json":  # config.toml is there: the run can be resumed
        assert f"free space, then resume: srpo-graph train {WF} --resume {mnt}/run" in err, err
        left = sorted(p.name for p in (tmp_path / "after").iterdir())
        assert left == [".lock", "config.toml"], left  # no temporary file
    else:  # nothing to resume: the folder this run created is gone
        assert "nothing was trained" in err and "free space, then run the command again" in err, err
        assert not (tmp_path / "after").exists()


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="needs user+mount namespaces (unshare -rm) to mount a small tmpfs")
def test_disk_full_while_a_resumed_run_rewrites_its_config_is_one_message(one_step, tmp_path):
    """`--resume` rewrites config.toml before the loop: on a full disk, one message naming it, the
    newest checkpoint and the resume command; the old config.toml is intact (written atomically),
    and with space the command finishes the run."""
    mnt = tmp_path / "mnt"
    before = (one_step / "config.toml").read_text()
    proc = _on_a_full_tmpfs(tmp_path, 0, one_step, str(WF), "--resume", str(mnt / "run"), "--steps", "2")
    err = proc.stderr
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert f"No space left on device ({mnt}/run/config.toml; 0 bytes free on that file system)" in err, err
    assert f"newest complete checkpoint: {mnt}/run/checkpoints/step_1" in err, err
    assert f"free space, then resume: srpo-graph train {WF} --resume {mnt}/run" in err, err
    after = tmp_path / "after"
    assert (after / "config.toml").read_text() == before and not list(after.glob(".config.toml.tmp-*"))
    _cli_train(str(WF), "--resume", str(after), "--steps", "2")  # the config of record says 1 step
    assert [r["step"] for r in read_metrics(after / "metrics.jsonl")] == [1, 2]

