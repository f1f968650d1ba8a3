"""Rollouts on every rank (issue 25 item 3): each rank of a torchrun job (real gloo processes)
samples its share of the step's tasks (whole groups) with its own transformers backend; every rank
ends with the one-process episodes (log-probs up to float rounding: a forward over other batches of
rows) and the same statistics.

One plain process and one 2-rank job (tests/train/rollout_worker.py) each run two rollouts:

* coord_mixed, 5 tasks x 3 samples: an uneven split (2 tasks on rank 0, 3 on rank 1);
* coord_seq with a reward that raises on odd targets, the tasks ordered so that rank 0's share
  never fails and rank 1's always does: the merged counts exceed ``max_failed_fraction = 0.4``
  (rank 0's own would not), so every rank stops with the same error as one process;
* coord_mixed again with rank 1's backend raising (a test double, in the 2-rank job only): both
  ranks raise a BackendError, rank 0's naming rank 1, and the job goes on (no rank left waiting).

The whole training loop on 2 ranks (traces, metrics, eval) is tests/e2e/test_train_cli.py::
test_cli_nproc_2_matches_one_process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srpo_graph.errors import ConfigError
from srpo_graph.train.config.loading import validate
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.rollout.ranks import rank_share, samples_on_every_rank
from tests.support.torchrun import TWO_FORKED_RANKS
from tests.support.user_code import make

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rollout_worker.py")


def _tasks(path: Path, targets: list[int]) -> Path:
    path.write_text("".join(f'{{"id": "t{i}", "target": {i}}}\n' for i in targets), encoding="utf-8")
    return path


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_two_ranks_sample_their_shares_and_equal_one_process(tmp_path):
    failing, _, _ = make(tmp_path, reward="half_reward")  # odd targets raise
    jobs = [f"{ROOT / 'workflows' / 'coord_mixed.wf'},{_tasks(tmp_path / 'mixed.jsonl', [0, 2, 1, 3, 4])}",
            f"{failing},{_tasks(tmp_path / 'half.jsonl', [0, 2, 1, 3])}",
            f"{ROOT / 'workflows' / 'coord_mixed.wf'},{tmp_path / 'mixed.jsonl'},1"]
    opts = ["rollout.samples=3", "rollout.max_failed_fraction=0.4"]
    _run([sys.executable, str(WORKER), str(tmp_path / "one"), *jobs, *opts])
    _run([*TWO_FORKED_RANKS, str(WORKER), str(tmp_path / "two"), *jobs, *opts])

    def read(run: str, job: int, rank: int) -> dict:
        return json.loads((tmp_path / run / f"job{job}_rank{rank}.json").read_text())

    one, r0, r1 = read("one", 0, 0), read("two", 0, 0), read("two", 0, 1)
    assert len(one["episodes"]) == 15
    assert r0["episodes"] == r1["episodes"]  # every rank holds the same list, byte for byte
    eps1, eps2 = ([json.loads(e) for e in run["episodes"]] for run in (one, r0))
    lp1, lp2 = ([lp for ep in eps for o in ep["outputs"] for lp in o.pop("logprobs")] for eps in (eps1, eps2))
    assert eps1 == eps2  # tokens, texts, values, rewards, seeds, versions: exactly as one process
    assert lp1 == pytest.approx(lp2, abs=1e-5)  # up to float rounding (other batches of rows; here: equal)
    assert [json.loads(e)["task_id"] for e in r0["episodes"][::3]] == ["t0", "t2", "t1", "t3", "t4"]
    for k in ("episodes", "mean_reward", "tokens_generated", "failures", "truncated", "failed_by_kind"):
        assert r0["stats"][k] == r1["stats"][k] == one["stats"][k], k
    # each rank really sampled (its own generate calls, added up): 2 rounds per rank for coord_mixed
    assert r0["stats"]["generate_calls"] == r1["stats"]["generate_calls"] == 2 * one["stats"]["generate_calls"]

    one, r0, r1 = read("one", 1, 0), read("two", 1, 0), read("two", 1, 1)
    assert one["error"] == r0["error"] == r1["error"] == "FailureBudgetExceeded", (one, r0, r1)
    assert one["message"] == r0["message"] == r1["message"]
    assert "6 of 12 episodes failed" in r0["message"] and "odd target" in r0["message"]

    r0, r1 = read("two", 2, 0), read("two", 2, 1)  # rank 1's engine raises: both ranks stop, none waits
    assert r1["error"] == "BackendError" and "test double" in r1["message"]
    assert (
        r0["error"] == "BackendError" and "rank 1's rollout failed" in r0["message"] and "test double" in r0["message"]
    )


def test_every_rank_choice_and_shares():
    two = DistInfo(rank=0, world_size=2)
    assert samples_on_every_rank(validate({}), two)  # auto: transformers under ddp
    assert not samples_on_every_rank(validate({}), DistInfo())
    assert not samples_on_every_rank(validate({"rollout": {"every_rank": False}}), two)
    assert not samples_on_every_rank(validate({"strategy": "fsdp"}), two)
    assert not samples_on_every_rank(validate({"rollout": {"backend": "sglang"}}), two)
    for bad, word in (({"strategy": "fsdp"}, "fsdp"), ({"rollout": {"backend": "sglang"}}, "server")):
        data = {**bad, "rollout": {**bad.get("rollout", {}), "every_rank": True}}
        with pytest.raises(ConfigError, match="rollout.every_rank") as info:
            samples_on_every_rank(validate(data), two)
        assert word in str(info.value)
    with pytest.raises(ConfigError, match="field `rollout.every_rank`: .*must be auto, true or false"):
        validate({"rollout": {"every_rank": "maybe"}})
    for n in range(0, 9):  # whole tasks, contiguous, in rank order, balanced to within one, nothing lost
        for world in (1, 2, 3, 4):
            shares = [rank_share(n, r, world) for r in range(world)]
            assert [i for s in shares for i in s] == list(range(n))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
