"""FSDP2 (fully_shard) with gloo: 2 processes give the single-process loss and weights.

The ``fsdp`` strategy of the trainer (srpo_graph/train/parallel/fsdp.py): each policy model is sharded
with ``fully_shard`` (per decoder layer + root), the local loss is scaled by the world size so
FSDP's averaged reduce-scatter is the single-process sum, and ranks whose shard lacks
micro-batches or members of a policy run zero-weight forwards so the collectives match.
tests/train/ddp_worker.py runs once as a plain process (reference: no sharding, no collectives)
and once under torchrun with 2 gloo processes and real FSDP collectives.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import invoke
from tests.support.torchrun import TWO_FORKED_RANKS

WORKER = Path(__file__).with_name("ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(cmd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_fsdp_two_gloo_processes_equal_one_process(tmp_path, one_process):
    # the plain process (no sharding, no collectives) is the session's, shared with test_train_ddp.py
    one, two = one_process.worker(), tmp_path / "two"
    _run([*TWO_FORKED_RANKS, str(WORKER), str(two), "fsdp"])
    r1 = json.loads((one / "result.json").read_text())
    r2 = json.loads((two / "result.json").read_text())
    assert r1["updates"] == r2["updates"] == 4
    assert r1["padding_forwards"] == 0  # one process: nothing to match
    assert r2["padding_forwards"] > 0  # the uneven-shard path (zero-weight forwards) really ran
    assert r1["loss"] == pytest.approx(r2["loss"], abs=1e-6)
    for p in ("p0", "p1"):
        assert r1["grad_norm"][p] == pytest.approx(r2["grad_norm"][p], rel=1e-5)
    for i in range(2):
        a, b = load_file(one / f"p{i}.safetensors"), load_file(two / f"p{i}.safetensors")
        base = load_file(two / f"init{i}.safetensors")
        assert a.keys() == b.keys()  # the gathered full state dict has the plain model's names
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4)
        assert base.keys() == a.keys()
        moved = min((b[k] - base[k]).abs().max().item() for k in a)
        assert moved > 1e-3  # EVERY tensor moved (a stale unsharded root would leave some behind)


@pytest.mark.slow
def test_fsdp_training_run_resumes_and_equals_one_process(tmp_path, one_process):
    """The trainer with strategy=fsdp (rank 0 samples from a replica refreshed from the gathered
    weights; checkpoints written sharded with DCP, no gather): stopped after step 1 and resumed
    with 2 processes, it gives the metrics of an uninterrupted single-process run (the session's
    shared one: tests/support/reference_runs.py), and ``srpo-graph consolidate`` turns its sharded
    checkpoint into that run's model (and its DCP shards hold that run's Adam moments)."""
    from tests.support.reference_runs import COORD_MIXED

    one = one_process(COORD_MIXED)
    cli = [sys.executable, "-m", "srpo_graph.cli", "train"]
    _run([*cli, *COORD_MIXED, "--nproc", "2", "--run-dir", str(tmp_path / "fsdp"), "strategy=fsdp",
          "debug.stop_after_step=1"])
    assert [json.loads(x)["step"] for x in (tmp_path / "fsdp" / "metrics.jsonl").read_text().splitlines()] == [1]
    # strategy and nproc come from the run's config.toml
    _run([*cli, str(ROOT / "workflows/coord_mixed.wf"), "--resume", str(tmp_path / "fsdp")])
    rows = {n: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            for n, d in (("one", one), ("fsdp", tmp_path / "fsdp"))}
    assert [r["step"] for r in rows["fsdp"]] == [1, 2]
    for a, b in zip(rows["one"], rows["fsdp"]):
        assert a["reward"] == b["reward"] and a["events"] == b["events"]  # step 2 sampled the updated replica
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm/tiny"] == pytest.approx(b["grad_norm/tiny"], rel=1e-5)
    assert rows["one"][1]["eval/reward"] == rows["fsdp"][1]["eval/reward"]
    # the fsdp checkpoint is sharded (DCP: each rank wrote its shard), verifies, and consolidates to
    # the single-process run's model and Adam state
    from transformers import AutoModelForCausalLM

    from srpo_graph.train.checkpoint import verify_checkpoint

    ck = tmp_path / "fsdp" / "checkpoints" / "step_2"
    assert sorted(p.name for p in (ck / "dcp" / "tiny").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not list((ck / "policies" / "tiny").glob("*.safetensors")) and verify_checkpoint(ck) is None
    out = tmp_path / "consolidated"
    # consolidate and eval read folders: in this process (tests/support/cli.py), no interpreter each
    res = invoke("consolidate", tmp_path / "fsdp", "--out", out)
    assert res.exit_code == 0, res.output[-3000:]
    a = load_file(one / "checkpoints" / "step_2" / "policies/tiny/model.safetensors")
    b = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=2e-5, rtol=1e-4)
    names = [n for n, _ in AutoModelForCausalLM.from_pretrained(str(out)).named_parameters()]
    adam = load_file(one / "checkpoints" / "step_2" / "optim/tiny.safetensors")
    import torch.distributed.checkpoint as dcp

    moments = {
        n: {k: torch.empty_like(adam[f"state.{i}.{k}"]) for k in ("exp_avg", "exp_avg_sq")} for i, n in enumerate(names)
    }
    dcp.load({"optim": {"state": moments}}, checkpoint_id=str(ck / "dcp" / "tiny"), no_dist=True)
    for i, n in enumerate(names):
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(moments[n][k], adam[f"state.{i}.{k}"], atol=2e-5, rtol=1e-4)
    # `srpo-graph eval` reads the consolidated folder, and the sharded run folder itself (in one process)
    ev = tmp_path / "eval"
    res = invoke("eval", ROOT / "workflows/coord_mixed.wf", out, tmp_path / "fsdp", "--num-tasks", "2",
                 "--samples", "2", "--out", ev, "--no-progress")
    assert res.exit_code == 0, res.output[-3000:]
    a_rep, b_rep = json.loads((ev / "eval.json").read_text())["reports"]
    assert a_rep["problems"] == b_rep["problems"] and a_rep["overall"] == b_rep["overall"]
