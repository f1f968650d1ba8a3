"""Data parallel with gloo: 2 processes give the single-process loss and weights.

Both runs execute tests/train/ddp_worker.py: one as a plain process, one under torchrun with
2 gloo processes (real collectives). The worker updates two policies (an event may span both)
for 2 epochs x 2 mini-batches on a fixed SetBatch compiled from synthetic traces.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.torchrun import TWO_FORKED_RANKS

WORKER = Path(__file__).with_name("ddp_worker.py")


def _run(cmd, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path, one_process):
    one, two = one_process.worker(), tmp_path / "two"  # the plain process: the session's (reference_runs.py)
    _run([*TWO_FORKED_RANKS, str(WORKER), str(two)], tmp_path)
    r1 = json.loads((one / "result.json").read_text())
    r2 = json.loads((two / "result.json").read_text())
    assert r1["updates"] == r2["updates"] == 4
    assert r1["micro_batches"] > 2  # the split really differs between the runs
    assert r1["loss"] == pytest.approx(r2["loss"], abs=1e-6)
    for p in ("p0", "p1"):
        assert r1["grad_norm"][p] == pytest.approx(r2["grad_norm"][p], rel=1e-5)
    from srpo_graph.models.tiny import ensure_tiny_model

    base = load_file(ensure_tiny_model() / "model.safetensors")
    for i in range(2):
        a, b = load_file(one / f"p{i}.safetensors"), load_file(two / f"p{i}.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4)
        # the update really moved the weights (a test that cannot fail would not)
        moved = max((a[k] - base[k]).abs().max().item() for k in a if k in base)
        assert moved > 1e-3


def test_shards_are_whole_contiguous_and_cover_everything():
    from srpo_graph.train.parallel.collectives import shard_sets

    tokens = [7, 1, 30, 2, 2, 9, 4]
    for world in (1, 2, 3, 4):
        shards = [shard_sets(tokens, r, world) for r in range(world)]
        flat = [i for s in shards for i in s]
        assert flat == list(range(len(tokens)))  # disjoint, in order, nothing lost


SHUTDOWN_WORKER = '''
import json, os, sys
import torch
from srpo_graph.train.parallel.collectives import all_gather_bytes, init_distributed, shutdown

def gloo_threads():
    names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return sorted(n for n in names if "gloo" in n)

dist = init_distributed("cpu", timeout=60)
during = gloo_threads()
import torch._dynamo  # what loading a model after init imports (transformers' modeling code does)
import transformers.modeling_utils  # noqa: F401
parts = all_gather_bytes(str(dist.rank).encode(), dist)
shutdown(dist)
with open(os.path.join(sys.argv[1], f"rank{dist.rank}.json"), "w") as f:
    json.dump({"parts": [p.decode() for p in parts], "during": during, "after": gloo_threads()}, f)
'''


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from /proc")
def test_shutdown_frees_the_process_group(tmp_path):
    """``shutdown`` leaves no gloo thread behind, even when modules that keep the default group in
    their defaults (torch.distributed.nn.functional, imported by torch._dynamo and transformers'
    modeling code) are first imported after init (Note [Group defaults captured at import]): a
    group that outlives destroy_process_group can abort the process at exit."""
    script = tmp_path / "shutdown_worker.py"
    script.write_text(SHUTDOWN_WORKER, encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["parts"] == ["0", "1"]
        assert got["during"], "the group's gloo threads should exist while it lives (else this test shows nothing)"
        assert got["after"] == [], got
