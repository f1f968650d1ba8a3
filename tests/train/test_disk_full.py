"""Disk full while a checkpoint is written (issue 23, item 4), on a real small file system.

The run folder lives on a tmpfs sized so that step 1's checkpoint fits and step 2's runs out of
space inside one chosen file (the weights -- safetensors --, the optimizer state -- safetensors --,
the RNG state, state.json). Every case must end with exit 1, one message naming the disk and the
command that continues, no traceback, no half-written folder; once there is space, that command
finishes the run. The tmpfs is mounted in a user+mount namespace (``unshare -rm``,
tests/support/tmpfs.py), so the test needs no root; it is skipped where namespaces are not allowed.

The same rule holds for every save path of a torchrun job (issue 40, item 1; Note [A full disk stops
every rank], srpo_graph/train/checkpoint/agree.py): fsdp's sharded save (inside the ranks' shards,
DCP's metadata, rank 0's own files), ddp's (rank 0 writes, rank 1 waits), and fsdp on two nodes
without a shared run folder (node 1's disk, or node 0's as it receives node 1's shard): exit 1 on
every process, one message (rank 0's), no traceback, no ``.tmp-`` folder on any node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph.train import checkpoint as ck
from srpo_graph.train.observe.metrics import read_metrics
from tests.support.tmpfs import PAGE, needs_tmpfs, on_tmpfs, pages, pages_of, tmpfs_command

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_seq.wf"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
ARGS = ["rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0", "checkpoint.every=1",
        "checkpoint.keep_last=5", "logging.tensorboard=false", "logging.plots=false", "logging.traces_every=0",
        "logging.progress=false"]
# the files of a checkpoint in the order save_checkpoint writes them; each case fails inside one
ORDER = ["policies/tiny/config.json", "policies/tiny/generation_config.json", "policies/tiny/model.safetensors",
         "policies/tiny/tokenizer_config.json", "policies/tiny/special_tokens_map.json", "policies/tiny/vocab.json",
         "policies/tiny/tokenizer.json", "optim/tiny.safetensors", "optim/tiny.json", "config.toml",
         "rng.safetensors", "state.json"]
TARGETS = ["policies/tiny/model.safetensors", "optim/tiny.safetensors", "rng.safetensors", "state.json"]


def _tmpfs_size(run: Path, checkpoint: Path, order: list[str], target: str) -> int:
    """Bytes of a tmpfs that holds ``run`` and then fills up halfway through ``target``, a file of
    ``checkpoint`` (a checkpoint like the one to be written), its files written in ``order``."""
    files = [f for f in order if (checkpoint / f).is_file()]
    assert target in files
    extra = [p for p in checkpoint.rglob("*") if p.is_file() and str(p.relative_to(checkpoint)) not in files]
    before = pages_of(checkpoint / f for f in files[: files.index(target)])
    before += pages_of(p for p in extra if p.name != "COMPLETE")
    return (pages_of(run.rglob("*")) + before + 2 + pages((checkpoint / target).stat().st_size) // 2) * PAGE


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
@needs_tmpfs
@pytest.mark.parametrize("target", TARGETS)
def test_disk_full_inside_a_checkpoint_stops_with_the_resume_command(one_step, tmp_path, target):
    size = _tmpfs_size(one_step, one_step / "checkpoints" / "step_1", ORDER, target)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inner = mnt / "run"
    train = [sys.executable, "-m", "srpo_graph.cli", "train", str(WF), "--resume", str(inner), "--steps", "2"]
    script = (f"cp -a {one_step} {inner} && "
              f"{' '.join(train)}; rc=$?; ls -a {inner}/checkpoints > {tmp_path}/ls.txt; "
              f"cp -a {inner} {tmp_path}/after; exit $rc")
    proc = on_tmpfs(mnt, size, script, cwd=ROOT, env=ENV)
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
    script = (f"{f'cp -a {copy} {mnt}/run && ' if copy else ''}"
              f"avail=$(df -B{PAGE} --output=avail {mnt} | tail -1) && "
              f"dd if=/dev/zero of={mnt}/filler bs={PAGE} count=$((avail - {free_pages})) status=none && "
              f"{' '.join(train)}; rc=$?; (cp -a {mnt}/run {tmp_path}/after 2>/dev/null || true); exit $rc")
    return on_tmpfs(mnt, "8m", script, cwd=ROOT, env=ENV)


@pytest.mark.slow
@needs_tmpfs
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
@needs_tmpfs
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



# A job of 2 ranks (torchrun, gloo): Note [A full disk stops every rank] (srpo_graph/train/checkpoint/agree.py).
TRAIN = [sys.executable, "-m", "srpo_graph.cli", "train", str(WF)]
# the files of a sharded (fsdp) checkpoint in the order its save writes them: both ranks' shards at
# once, DCP's metadata (rank 0), then rank 0's configs, tokenizer, scheduler, RNG and state
FSDP_ORDER = ["dcp/tiny/__0_0.distcp", "dcp/tiny/__1_0.distcp", "dcp/tiny/.metadata", "policies/tiny/config.json",
              "policies/tiny/generation_config.json", "policies/tiny/tokenizer_config.json",
              "policies/tiny/tokenizer.json", "optim/tiny.json", "config.toml", "rng.safetensors", "state.json"]
TWO_RANKS = [("fsdp", "dcp/tiny/__1_0.distcp"), ("fsdp", "dcp/tiny/.metadata"), ("fsdp", "state.json"),
             ("ddp", "policies/tiny/model.safetensors")]
RESUMED = {"dcp/tiny/__1_0.distcp", "policies/tiny/model.safetensors"}  # what is left is the same in every case


def _run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*TRAIN, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """strategy -> an uninterrupted run of 2 steps by 2 ranks with it, every step checkpointed."""
    runs: dict[str, Path] = {}

    def run(strategy: str) -> Path:
        if strategy not in runs:
            runs[strategy] = tmp_path_factory.mktemp(strategy) / "run"
            _run("--nproc", "2", "--steps", "2", "--run-dir", str(runs[strategy]), *ARGS, f"strategy={strategy}",
                 "dist_timeout=120")
        return runs[strategy]

    return run


@pytest.mark.slow
@pytest.mark.proc
@needs_tmpfs
@pytest.mark.parametrize("strategy, target", TWO_RANKS, ids=[f"{s}-{t.split('/')[-1]}" for s, t in TWO_RANKS])
def test_disk_full_inside_a_checkpoint_of_two_ranks_stops_every_rank_alike(two_ranks, tmp_path, strategy, target):
    """Under torchrun the disk fills up inside step 2's checkpoint -- fsdp: inside the ranks' shards,
    DCP's metadata (rank 0) or rank 0's own files; ddp: rank 0's whole save while rank 1 waits --
    as it does for one process: exit 1, ONE message (rank 0's, no traceback from any rank) naming
    the disk, the newest complete checkpoint and the resume command; no .tmp- folder left, every
    rank and torchrun out. With space, that command gives the uninterrupted run's steps (run once per
    strategy: the folder left is step 1's run in every case)."""
    ref = two_ranks(strategy)
    start = tmp_path / "start"  # the run as it stood after step 1
    shutil.copytree(ref, start, symlinks=True,
                    ignore=lambda _, names: [n for n in names if n in ("step_2", "summary.json")])
    size = _tmpfs_size(start, ref / "checkpoints" / "step_2", FSDP_ORDER if strategy == "fsdp" else ORDER, target)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inner = mnt / "run"
    script = (f"cp -a {start} {inner} && {' '.join(TRAIN)} --resume {inner}; rc=$?; "
              f"ls -a {inner}/checkpoints > {tmp_path}/ls.txt; cp -a {inner} {tmp_path}/after; exit $rc")
    proc = on_tmpfs(mnt, size, script, cwd=ROOT, env=ENV)
    err = proc.stderr
    assert proc.returncode == 1, (size, err[-3000:])
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]
    assert err.count("srpo-graph train: stopped after step 2: No space left on device (") == 1, err[-3000:]
    assert err.count("free space, then resume:") == 1 and "interrupted" not in err, err[-3000:]
    assert f"newest complete checkpoint: {inner}/checkpoints/step_1\n" in err, err[-3000:]
    assert f"free space, then resume: srpo-graph train {WF} --resume {inner}\n" in err, err[-3000:]
    assert (tmp_path / "ls.txt").read_text().split() == [".", "..", "step_1"]  # no .tmp- folder left
    if target not in RESUMED:
        return
    after = tmp_path / "after"
    _run("--resume", str(after))  # with space: the command finishes the run (2 ranks: the run's config)
    rows, want = read_metrics(after / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for a, b in zip(rows, want):
        assert a["reward"] == b["reward"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm/tiny"] == pytest.approx(b["grad_norm/tiny"], rel=1e-5)
    assert ck.verify_checkpoint(after / "checkpoints" / "step_2") is None
    assert json.loads((after / "checkpoints" / "step_2" / "state.json").read_text())["sharded"] == (strategy == "fsdp")


@pytest.mark.slow
@pytest.mark.proc
@needs_tmpfs
@pytest.mark.parametrize("small", [1, 0], ids=["node1-writing-its-shard", "node0-receiving-node1s-shard"])
def test_disk_full_on_one_node_stops_every_node_with_one_message(two_ranks, tmp_path, small):
    """fsdp on two "nodes" without a shared run folder (tests/train/test_multinode.py, Note [No shared
    run folder]), one node's disk a small tmpfs: node 1's fills up inside its own DCP shard of step
    1, or node 0's inside node 1's shard as it receives it. Both nodes exit 1; node 0 alone prints
    one message naming the full disk (and the rank whose it is) and the resume command; no .tmp-
    folder is left on either node."""
    from srpo_graph.backends.ports import claim_ports

    ref = two_ranks("fsdp")  # its shards are the sizes this job's are
    shards = ref / "checkpoints" / "step_1" / "dcp" / "tiny"
    size = 64 * PAGE  # node 1: under its shard
    if small == 0:  # node 0: the run's files, its own shard and DCP's metadata, half of node 1's shard
        run = pages_of(p for p in ref.iterdir() if p.name != "summary.json")
        own = pages_of([shards / "__0_0.distcp", shards / ".metadata"])
        size = (run + 2 + own + pages((shards / "__1_0.distcp").stat().st_size) // 2) * PAGE
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(Path.home() / ".cache" / "srpo-graph" / "tiny", home / "tiny")  # the built model
    env = {**ENV, "SRPO_GRAPH_HOME": str(home)}
    endpoint = f"127.0.0.1:{claim_ports(1)[0]}"  # torchrun binds it seconds later
    procs = []
    for rank in (0, 1):
        cwd = tmp_path / f"node{rank}"
        cwd.mkdir()
        train = [*TRAIN, "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--steps", "1",
                 "--run-dir", "runs/job", *ARGS, "strategy=fsdp", "dist_timeout=120"]
        cmd = train if rank != small else tmpfs_command(  # cd: into the tmpfs mounted over the node's folder
            cwd, size, f"cd {cwd} && {' '.join(train)}; rc=$?; find . > {tmp_path}/left.txt; exit $rc")
        with open(tmp_path / f"err{rank}.txt", "w") as err:
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err))
    codes = [p.wait(timeout=300) for p in procs]
    err0, err1 = ((tmp_path / f"err{r}.txt").read_text() for r in (0, 1))
    assert codes == [1, 1], (size, err0[-3000:], err1[-3000:])
    assert "Traceback" not in err0 + err1 and "Exception" not in err0 + err1, (err0[-3000:], err1[-3000:])
    assert err0.count("srpo-graph train: stopped after step 1: No space left on device (") == 1, err0[-3000:]
    named = " bytes free on that file system)" + (" [rank 1, on " if small else "\n")
    assert named in err0 and "stopped after" not in err1, err0[-3000:]
    assert "no checkpoint yet" in err0 and err0.count("free space, then resume: ") == 1, err0[-3000:]
    assert f"free space, then resume: srpo-graph train {WF} --resume runs/job\n" in err0, err0[-3000:]
    assert ".tmp-" not in (tmp_path / "left.txt").read_text()
    assert not list((tmp_path / "node0").rglob(".tmp-*")) and not list((tmp_path / "node1").rglob(".tmp-*"))
