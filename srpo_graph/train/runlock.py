"""Trainer stage: one training process per run folder (``RUN_DIR/.lock``).

Two processes training in one folder would interleave metrics and overwrite each other's
checkpoints, so :func:`lock_run_dir` takes an exclusive ``flock`` on ``RUN_DIR/.lock`` for as long
as the process trains. The kernel drops the lock when the process ends in any way (even
``kill -9``), so a crashed run never leaves a stale lock behind; the file itself only records
who holds it (pid, host, start time) for the error message.

This module knows nothing about models or configs.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

from srpo_graph.errors import ConfigError

LOCK_NAME = ".lock"


class RunLock:
    """A held lock on a run folder; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, handle: IO[str], created: bool = False):
        self.path, self._handle, self._created = path, handle, created

    def release(self) -> None:
        if self._handle is not None and not self._handle.closed:
            if self._created and [p.name for p in self.path.parent.iterdir()] == [LOCK_NAME]:
                self.path.unlink()  # a run that stopped before writing anything leaves no folder behind
                self.path.parent.rmdir()
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_run_dir(run_dir: str | Path) -> RunLock:
    """Take the run folder's lock (creating the folder), or refuse clearly.

    Raises:
        ConfigError: another live process holds the lock (named by pid and host when known).
    """
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        try:
            holder = json.loads(handle.read() or "{}")
        except json.JSONDecodeError:
            holder = {}
        handle.close()
        who = (f"process {holder.get('pid')} on {holder.get('host')} (since {holder.get('started')})"
               if holder.get("pid") else "another process")
        raise ConfigError.at(str(run_dir), f"the run folder is in use: {who} is training in it (lock {path})",
                             why="two processes in one run folder would overwrite each other's checkpoints",
                             fix="wait for it to finish or stop it, then resume; or train in another --run-dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
    handle.flush()
    return RunLock(path, handle, created)
