"""What a process forked from srpo-graph's preloaded forkserver finds (tests/train/test_forked_ranks.py):
a target for ``multiprocessing`` that must be importable by name in the forkserver's children."""

from __future__ import annotations

import json
import os
import sys


def report(path: str) -> None:
    """Write to ``path``: which of forked.PRELOAD this process has without importing them, how many
    threads its parent (the forkserver) runs, and whether its streams are unbuffered."""
    from srpo_graph.train.parallel.forked import PRELOAD

    had = {m: m in sys.modules for m in PRELOAD}  # (forked.py itself imports none of them)
    with open(path, "w") as f:
        json.dump({"preloaded": had, "server_threads": len(os.listdir(f"/proc/{os.getppid()}/task")),
                   "unbuffered": os.environ.get("PYTHONUNBUFFERED"), "write_through": sys.stdout.write_through,
                   "omp": os.environ.get("OMP_NUM_THREADS"), "server": os.getppid()}, f)
