"""The job fails with its cause (Note [The job fails with its cause], train/parallel/launch.py):
when one rank fails and another stops because of it ("another rank of the job stopped
answering"), the launcher exits with the first rank's status, not the consequence's.

A CI run exited 1 where user code ending rank 1 must exit 8: rank 0's stop, in the same second,
won torchrun's tie (the lowest rank). Real torchrun below (the launcher's wrapper, two ranks of a
small script), and real ``ProcessFailure`` records read from real error files for the ties a
scheduler cannot be made to produce on demand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _failure(tmp_path: Path, rank: int, code: int, *, consequence: bool, monkeypatch) -> object:
    """torchrun's record of a failed rank, read from the error file the rank wrote (or none)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from srpo_graph.train.parallel.launch import ERROR_FILE_ENV, stopped_after_another_rank

    path = tmp_path / f"error-{rank}.json"
    if consequence:
        monkeypatch.setenv(ERROR_FILE_ENV, str(path))
        stopped_after_another_rank("srpo-graph train: stopped after step 0: another rank ...", wait=0)
        assert path.is_file()
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file=str(path))


@pytest.mark.parametrize("consequences", [(0,), (1,), (0, 2), ()])
def test_the_launcher_takes_the_first_failure_that_is_not_a_consequence(tmp_path, monkeypatch, consequences):
    from srpo_graph.train.parallel.launch import cause_of

    failures = {r: _failure(tmp_path, r, 1 if r in consequences else 8 + r, consequence=r in consequences,
                            monkeypatch=monkeypatch) for r in range(3)}
    for failure in failures.values():  # one second for all: the tie torchrun broke by the order it saw them
        failure.timestamp = 1_700_000_000
    rank, failure = cause_of(failures)
    expected = min(r for r in range(3) if r not in consequences)
    assert (rank, failure.exitcode) == (expected, 8 + expected)
    # nor does an earlier timestamp make a consequence the cause
    for r in consequences:
        failures[r].timestamp -= 5
    assert cause_of(failures)[0] == expected


@pytest.mark.parametrize("stopped", [143, 130, -15, -2])
def test_a_rank_torchrun_stopped_after_the_cause_is_not_the_cause(tmp_path, monkeypatch, stopped):
    """torchrun records the survivors it stops (SIGTERM) after the failures it saw, in the same second
    or later: a rank killed outright (-15) or stopping on it (143) never outranks a failure of its own,
    and when every failure is a consequence or a stop, the first recorded is the job's."""
    from srpo_graph.train.parallel.launch import cause_of

    own = {1: _failure(tmp_path, 1, -9, consequence=False, monkeypatch=monkeypatch),
           0: _failure(tmp_path, 0, stopped, consequence=False, monkeypatch=monkeypatch)}
    for failure in own.values():
        failure.timestamp = 7
    assert cause_of(own)[0] == 1  # rank 1 SIGKILLed, rank 0 stopped by torchrun after it
    elsewhere = {0: _failure(tmp_path, 0, 1, consequence=True, monkeypatch=monkeypatch),
                 1: _failure(tmp_path, 1, stopped, consequence=False, monkeypatch=monkeypatch)}
    for failure in elsewhere.values():
        failure.timestamp = 7
    assert cause_of(elsewhere)[0] == 0  # the cause on another node: rank 0's stop is this node's first


def test_only_consequences_give_the_earliest(tmp_path, monkeypatch):
    from srpo_graph.train.parallel.launch import cause_of

    failures = {r: _failure(tmp_path, r, 1, consequence=True, monkeypatch=monkeypatch) for r in range(2)}
    failures[0].timestamp, failures[1].timestamp = 20, 10
    assert cause_of(failures)[0] == 1


def test_outside_torchrun_nothing_is_written_and_nothing_waits(tmp_path, monkeypatch):
    import time

    from srpo_graph.train.parallel.launch import ERROR_FILE_ENV, stopped_after_another_rank

    monkeypatch.delenv(ERROR_FILE_ENV, raising=False)
    start = time.monotonic()
    stopped_after_another_rank("x", wait=30)
    assert time.monotonic() - start < 5 and not list(tmp_path.iterdir())


RANKS = """\
import os, sys, time
from srpo_graph.train.parallel.launch import stopped_after_another_rank
rank = int(os.environ["RANK"])
if rank == 1:  # the cause: it fails a moment after rank 0 has already said it stops because of it
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    time.sleep(0.3)
    os._exit(8)
open(sys.argv[1], "w").close()
stopped_after_another_rank("rank 0: another rank of the job stopped answering")
sys.exit(1)
"""


@pytest.mark.proc
def test_a_consequence_that_ends_first_still_leaves_the_cause_to_the_job(tmp_path):
    """Rank 0 says it stops because of another rank before that rank has failed (as when the
    collective notices the closed connection before torchrun polls the dead rank): its wait lets
    torchrun see rank 1's failure first, and the launcher exits 8, rank 1's status."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "srpo_graph.train.parallel.launch", "--standalone",
                           "--nproc_per_node=2", str(script), str(tmp_path / "said")],
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 8, done.stderr[-3000:]
