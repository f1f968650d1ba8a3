"""The test harness's wait: a program's files changing under a probe never fail a wait."""

from __future__ import annotations

import shutil
import threading

import pytest

from tests.support.waiting import wait_for


def test_a_folder_renamed_during_a_listing_is_progress_not_a_failure(tmp_path):
    """A checkpoint's `.tmp-` folder renamed while `rglob` walks it (FileNotFoundError inside pathlib)
    restarts the stall clock; the wait ends when the state is reached."""
    run = tmp_path / "run"
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            tmp = run / f".tmp-{i}" / "policies" / "tiny"
            tmp.mkdir(parents=True)
            (tmp / "w").write_bytes(b"x")
            shutil.rmtree(run / f".tmp-{i}")
            i += 1
        (run / "done").touch()

    worker = threading.Thread(target=churn)
    worker.start()
    calls = {"n": 0}

    def done() -> bool:
        calls["n"] += 1
        if calls["n"] == 400:
            stop.set()
        return (run / "done").exists()

    try:
        wait_for(done, progress=lambda: sorted(map(str, run.rglob("*"))) if run.exists() else [],
                 stall=60, interval=0, what="the churn to end")
    finally:
        stop.set()
        worker.join()


def test_a_probe_that_always_fails_still_stalls():
    """An error from `done()` means "not yet", never success: with nothing moving, the stall fires."""
    def missing() -> bool:
        raise FileNotFoundError("metrics.jsonl")

    with pytest.raises(AssertionError, match="no progress towards the file"):
        wait_for(missing, progress=lambda: 1, stall=0.05, interval=0.01, what="the file")
