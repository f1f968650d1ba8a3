"""Overlapped rollouts with bounded staleness on a REAL SGLang CPU server -- the session's, which
the runs train into (``trainable_sglang``, tests/backends/conftest.py: what is tested is the
training; the launch is tested where a run owns its server, test_sglang_train.py) (issue 26 items
2 and 4): `srpo-graph train ... rollout.max_staleness=1` trains with the batches of
step s+1 sampled during update s (staleness 1 in the metrics' histogram), and with k = 2 and an
update made slower than the rollouts (a real delay) the producer runs up to the bound and never
past it -- checked on every output of every step's traces; a stop drops the batches sampled ahead
(counted) and `--resume` samples them again, still within the bound; a partial sync pauses a
request in flight and resumes it on the new weights (two version spans)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "coord_par2.wf"
COMMON = ["rollout.backend=sglang", "rollout.sglang.update_connected=true", "rollout.tasks_per_step=2",
          "rollout.samples=4",
          "eval.every=0", "logging.tensorboard=false", "logging.progress=false", "logging.plots=false",
          "logging.traces_every=1", "checkpoint.every=1"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]


def _staleness(run: Path) -> dict[int, list[int]]:
    """Per step s, every output's staleness (s - 1) - policy_version, from the step's traces."""
    out = {}
    for path in (run / "traces").glob("step_*.jsonl"):
        s = int(path.stem.split("_")[1])
        out[s] = [(s - 1) - o["policy_version"] for line in path.read_text().splitlines() if line
                  for o in json.loads(line)["outputs"]]
    return out


def test_one_step_off_trains_from_the_command_line(tmp_path, trainable_sglang):
    """The issue's command, k = 1: every output of step s was sampled at version s-1 or s-2, the
    histogram in metrics.jsonl shows staleness 1, and the run ends normally with nothing dropped."""
    url, _ = trainable_sglang
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "srpo_graph.cli", "train", str(WF), "rollout.max_staleness=1",
                           "steps=4", f"run_dir={json.dumps(str(run))}", *COMMON,
                           f"rollout.sglang.url={json.dumps(url)}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dropped" not in proc.stderr
    stale = _staleness(run)
    assert sorted(stale) == [1, 2, 3, 4] and all(stale.values())
    assert all(0 <= x <= 1 for xs in stale.values() for x in xs), stale
    rows = _metrics(run)
    assert all(r["staleness/max"] <= 1 for r in rows)
    assert any(r.get("staleness/s1", 0) > 0 for r in rows), [r.get("staleness/s1") for r in rows]
    # step 2's batch was dispatched with step 1's (version 0 >= 2 - 1 - 1): sampled during update 1
    assert rows[1]["async/started_at_version"] == 0 and rows[1]["staleness/s1"] > 0
    assert 'max_staleness = 1' in (run / "config.toml").read_text()


def test_the_bound_holds_when_the_producer_runs_ahead_and_resume_resamples_what_was_dropped(tmp_path, monkeypatch,
                                                                                            capsys, trainable_sglang):
    """k = 2 with every update delayed 1.5 s (a real sleep: the update is the slow side, so the producer
    is always at the bound): the largest staleness is exactly 2, never more; stopping after step 3
    drops the batches of steps 4 and 5 (counted), and --resume (with partial rollouts on) samples them
    again within the bound."""
    import torch

    from srpo_graph.train import trainer as trainer_mod
    from srpo_graph.train.config.loading import load_config
    from srpo_graph.train.learn.step import Learner

    url, log = trainable_sglang
    common = [*COMMON, f"rollout.sglang.url={json.dumps(url)}"]
    torch.set_num_threads(1)
    learn = Learner.learn

    def slow_learn(self, *args, **kwargs):
        time.sleep(1.5)
        return learn(self, *args, **kwargs)

    monkeypatch.setattr(Learner, "learn", slow_learn)
    run = tmp_path / "run"
    cfg = load_config(None, ["steps=5", f"run_dir={json.dumps(str(run))}", "rollout.max_staleness=2",
                             "debug.stop_after_step=3", *common])
    trainer_mod.train(WF, cfg)
    err = capsys.readouterr().err
    assert "2 batch(es) sampled ahead dropped (steps 4..5); --resume samples them again" in err, err[-2000:]
    rows = _metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["async/ahead"] == 2
    stale = _staleness(run)
    assert max(max(xs) for xs in stale.values()) == 2  # the producer reached the bound ...
    assert all(0 <= x <= 2 for xs in stale.values() for x in xs), stale  # ... and never passed it
    # resumed with partial rollouts: a sync pauses the requests in flight and resumes them on the new weights
    mark = log.stat().st_size if log is not None else 0  # the resumed run's part of the session server's log
    trainer_mod.train(WF, load_config(None, ["steps=5", f"run_dir={json.dumps(str(run))}", "rollout.max_staleness=2",
                                             "rollout.partial_rollouts=true", *common]), resume=True)
    rows = _metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    if log is not None:  # the session's server (an outside one's log is not ours to read)
        with open(log, "rb") as fh:
            fh.seek(mark)
            logs = fh.read().decode("utf-8", errors="replace")
        assert "POST /pause_generation" in logs and "POST /continue_generation" in logs, logs[-2000:]  # its syncs
    stale = _staleness(run)
    assert sorted(stale) == [1, 2, 3, 4, 5] and all(0 <= x <= 2 for xs in stale.values() for x in xs), stale


def test_a_partial_sync_pauses_a_request_in_flight_and_resumes_it_on_the_new_weights(sglang_url, tiny_dir):
    """rollout.partial_rollouts on the real server: a long request (ignore_eos, 1500 tokens) is in
    flight when a partial sync loads weights tagged version 1; the sync returns while the request
    is still running (it did not wait for it), and the request finishes whole with two spans,
    version 0 then version 1, each token's log-prob the sampler's; the SGLang backend records the
    oldest. (The session's shared server: the same weights are loaded, and version 0 is put back.)"""
    import threading

    import httpx

    from srpo_graph.backends.sglang import SGLangBackend
    from srpo_graph.models.tiny import load_tokenizer
    from srpo_graph.train.rollout.gate import GatedBackend, WeightGate

    backend = SGLangBackend(sglang_url, load_tokenizer(str(tiny_dir)), sync="disk")
    gated = GatedBackend(backend, WeightGate(60), partial=True)
    assert gated.partial
    answer: dict = {}
    done: dict[str, float] = {}

    def long_request() -> None:
        body = {"input_ids": [5, 6, 7], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 1500, "temperature": 1.0, "ignore_eos": True}}
        answer.update(httpx.post(f"{sglang_url}/generate", json=body, timeout=600).json())
        done["request"] = time.monotonic()

    t = threading.Thread(target=long_request)
    try:
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "the request finished before the sync: make it longer"
        gated.sync_weights(str(tiny_dir), 1)
        done["sync"] = time.monotonic()
        t.join(600)
        assert done["sync"] < done["request"]  # the sync did not wait for the request in flight
        meta = answer["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 1500
        spans = meta["weight_versions"]
        assert [s["version"] for s in spans] in (["0", "1"], ["default", "1"])
        assert spans[0]["start"] == 0 and spans[-1]["end"] == 1500
        assert len(meta["output_token_logprobs"]) == 1500
        assert backend._version_of(meta) == 0  # the version of record: the oldest
    finally:
        backend.continue_generation()  # whatever happened, the shared server is not left paused
        t.join(120)
        backend.sync_weights(str(tiny_dir), 0)  # the shared server as it was
        backend.close()
