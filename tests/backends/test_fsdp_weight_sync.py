"""FSDP weight sync without a full copy (srpo_graph/train/parallel/gather.py), with 2 real gloo
processes (torchrun) running tests/train/fsdp_sync_worker.py: the weights gathered one tensor at
a time reach a REAL SGLang CPU server (its log-probs are the trainer's weights', bf16 tolerance)
or a safetensors folder written shard by shard (``from_pretrained`` gives the weights back); a
sync that rank 0 cannot finish ends on every rank with an error, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.support.ports import unanswered_port
from tests.support.sglang_checks import ATOL, client, perturbed, served_gap
from tests.support.torchrun import TWO_FORKED_RANKS

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "train" / "fsdp_sync_worker.py"


def _torchrun(*args, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*TWO_FORKED_RANKS, str(WORKER), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _ranks(out):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.proc
def test_fsdp_save_pretrained_writes_shard_by_shard(tiny_dir, tmp_path):
    """The disk route under FSDP: a folder of several safetensors shards (+ index), written one
    gathered shard at a time, that ``from_pretrained`` loads as the trainer's weights; each rank
    holds only its half of the parameters."""
    from transformers import AutoModelForCausalLM

    proc = _torchrun(tiny_dir, tmp_path, "-", "disk")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = _ranks(tmp_path)
    assert "model.safetensors.index.json" in r0["files"] and sum(f.endswith(".safetensors") for f in r0["files"]) > 2
    for r in (r0, r1):
        assert r["sharded_bytes"] < 0.6 * r["full_bytes"]  # FSDP: each rank ~1/2 of every parameter
    want = perturbed(tiny_dir)
    got = AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved"), dtype=torch.float32)
    largest = max(p.numel() * 4 for p in want.parameters())
    assert r0["peak_bucket_bytes"] <= max(64 << 10, largest)  # one shard held at a time
    sd_want, sd_got = want.state_dict(), got.state_dict()
    assert sd_want.keys() == sd_got.keys()
    for k in sd_want:
        torch.testing.assert_close(sd_got[k], sd_want[k], rtol=0, atol=0)


@pytest.mark.proc
def test_a_failed_fsdp_sync_ends_on_every_rank(tiny_dir, tmp_path):
    """Rank 0's server does not exist: rank 0 reports the URL, rank 1 an error naming rank 0,
    both promptly (rank 0 still runs the gathers rank 1 waits in: Note [Every rank gathers])."""
    with unanswered_port() as port:
        url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        proc = _torchrun(tiny_dir, tmp_path, url, "distributed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 120
    r0, r1 = _ranks(tmp_path)
    assert url in r0["error"]
    assert "rank 0" in r1["error"]


@pytest.mark.sglang
@pytest.mark.parametrize("route", ["distributed", "disk"])
def test_fsdp_streaming_sync_serves_the_trainers_weights(sglang_url, tiny_dir, tmp_path, route):
    """2 gloo ranks, FSDP-sharded, no replica: after the sync the real server's log-probs are the
    trainer's weights' (bf16 tolerance) at version 31, over the process group in many buckets
    (``distributed``) or through a folder written shard by shard (``disk``). The session server
    gets its original weights back at the end."""

    from srpo_graph.models.tiny import load_tokenizer

    proc = _torchrun(tiny_dir, tmp_path, sglang_url, route)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = _ranks(tmp_path)
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    if route == "distributed":
        assert r0["stats"]["buckets"] > 10 and r0["stats"]["syncs"] == 1
        assert not (tmp_path / "w").exists()  # nothing went through the disk
    else:
        assert any((tmp_path / "w").rglob("*.safetensors"))
    tok = load_tokenizer(str(tiny_dir))
    prompts = [tuple(tok(f"<a>{i}")["input_ids"]) for i in range(4)]
    b = client(sglang_url, tiny_dir, weight_dir=tmp_path / "restore", sync="distributed")
    try:
        gap, versions = served_gap(b, perturbed(tiny_dir), prompts)
        assert versions == {31} and gap < ATOL
        assert served_gap(b, perturbed(tiny_dir, scale=0.0), prompts)[0] > 3 * ATOL
    finally:
        b.sync_weights(perturbed(tiny_dir, scale=0.0), 0)  # leave the session server as it was
        b.close()
