"""One single-process training run of a workflow, shared by the tests that compare a run of N
processes (torchrun, FSDP, two "nodes") with one process.

Each such test used to train its own 1-process reference of the same small coord_mixed run (a
Python process, ~10-20 s of a 2-core CI run each); the runs are deterministic (seeded sampling on
the embedded backend, one thread), so one run per session serves them all. The reference is
trained the way the tests trained it -- ``srpo-graph train`` as its own process, one thread -- in a
session folder that no test writes into: a test that resumes it resumes a copy
(:meth:`ReferenceRuns.copy`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# 2 steps of coord_mixed (sets of size 1 and 2, two agents), 3 tasks a step (an uneven split over
# 2 ranks), eval at step 2, a checkpoint and a trace file after every step
COORD_MIXED = (
    str(ROOT / "workflows" / "coord_mixed.wf"),
    "--steps",
    "2",
    "rollout.tasks_per_step=3",
    "rollout.samples=4",
    "eval.every=2",
    "checkpoint.every=1",
    "logging.traces_every=1",
    "logging.tensorboard=false",
    "logging.plots=false",
)


def train_env() -> dict[str, str]:
    """The environment the reference and the runs compared with it train in (one thread: float
    sums split over threads round differently)."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


class ReferenceRuns:
    """``refs(args)``: the run folder of ``srpo-graph train *args`` in one process, trained on
    the first request of the session and reused after (read it, never write into it);
    ``refs.worker()``: the same for tests/train/ddp_worker.py's single-process update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[tuple[str, ...], Path] = {}

    def __call__(self, args: tuple[str, ...] = COORD_MIXED) -> Path:
        if args not in self.runs:
            run = self.root / f"one-{len(self.runs)}"
            proc = subprocess.run(
                [sys.executable, "-m", "srpo_graph.cli", "train", *args, "--nproc", "1", "--run-dir", str(run)],
                cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=600,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            self.runs[args] = run
        return self.runs[args]

    def worker(self) -> Path:
        """The output folder of tests/train/ddp_worker.py run as a plain process (world size 1: no
        sharding, no collectives, whichever strategy it is given), the reference of both
        test_train_ddp.py and test_train_fsdp.py; run once per session."""
        out = self.root / "ddp-worker"
        if not (out / "result.json").is_file():
            worker = ROOT / "tests" / "train" / "ddp_worker.py"
            proc = subprocess.run([sys.executable, str(worker), str(out)], cwd=ROOT, env=train_env(),
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        return out

    def copy(self, target: Path, args: tuple[str, ...] = COORD_MIXED) -> Path:
        """A copy of the reference run at ``target``, to resume."""
        shutil.copytree(self(args), target)
        return target
