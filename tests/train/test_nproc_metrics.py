"""Under ``--nproc 2`` every metric is the whole batch's (issue 36 item 4, ``train/learn/across_ranks.py``).

One step of coord_mixed (sets of size 1 and 2, two agents, 2 epochs) trained once in one process and
once as two real gloo processes (``srpo-graph train --nproc 2``, ddp): the same episodes, so one
fixed batch. Every key of metrics.jsonl must be present in both and equal to float tolerance,
except the keys that are legitimately per process, listed in ``PER_PROCESS``: wall times and what
is derived from them. ``optim.mini_batches = 20`` cuts the 32 sets into mini-batches of 2 and of 1
set, so in some mini-batches one rank's shard is empty (it joins the reduction with zeros).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]
ARGS = [str(ROOT / "workflows" / "coord_mixed.wf"), "--steps", "1", "rollout.tasks_per_step=4", "rollout.samples=4",
        "eval.every=0", "logging.tensorboard=false", "logging.plots=false", "checkpoint.every=0",
        "optim.epochs=2", "optim.mini_batches=20", "dist_timeout=120"]
PER_PROCESS = ("time/", "throughput/")  # wall clock (rank 0's), and tokens per second of it


def _train(run: Path, *extra: str) -> dict:
    """The one-process run in this process (tests/support/cli.py); ``--nproc 2`` starts torchrun."""
    if "--nproc" in extra:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "train", *ARGS, "--run-dir", str(run), *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        res = invoke("train", *ARGS, "--run-dir", run, *extra, cwd=ROOT)
        assert res.exit_code == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    return rows[0]


def _flat(row: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in row.items():
        out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.slow
def test_every_metric_under_two_processes_equals_one_process(tmp_path):
    one = _flat(_train(tmp_path / "one"))
    two = _flat(_train(tmp_path / "two", "--nproc", "2"))
    assert one.keys() == two.keys(), sorted(one.keys() ^ two.keys())
    assert one["loss/num_events"] == 32 and one["loss/events/k1"] > 0 and one["loss/events/k2"] > 0
    assert any(k.startswith("loss/epoch2/clip_upper/") for k in one)  # per-epoch, per-size, per-agent bins
    compared, differ = 0, []
    for k in sorted(one):
        if k.startswith(PER_PROCESS):
            continue
        a, b = one[k], two[k]
        compared += 1
        if isinstance(a, float) or isinstance(b, float):
            if not (math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(a) and math.isnan(b))):
                differ.append((k, a, b))
        elif a != b:
            differ.append((k, a, b))
    assert not differ, differ
    assert compared > 100, compared
