"""Trainer stage, the run folder's ownership: one training process per folder, and which workflow it trains.

* :func:`lock_run_dir`: two processes training in one folder would interleave metrics and overwrite
  each other's checkpoints, so it takes an exclusive ``flock`` on ``RUN_DIR/.lock`` for as long as
  the process trains. The kernel drops the lock when the process ends in any way (even ``kill -9``),
  so a crashed run never leaves a stale lock behind; the file itself only records who holds it (pid,
  host, start time) for the error message.
* :func:`clear_previous_run`: a fresh (not resumed) run never mixes with an earlier run's outputs
  in the same folder: refused, or replaced with ``--overwrite``;
* :func:`record_workflow` / :func:`check_resumed_workflow`: which workflow a run folder trained,
  so ``--resume`` with another ``.wf`` says so first. ``<run_dir>/workflow.json`` (``{"name",
  "file", "source_hash"}``) is written when a fresh run starts; on ``--resume`` one check is made
  before anything else of the run is read (task files, checkpoints, models): a workflow of another
  name is refused with "this run trained workflow 'X' (file ...)", whatever else would have failed
  later. Runs written before this file existed are identified by their newest checkpoint's
  ``state.json`` (the workflow's name only). The same name with another source (the file was
  edited since) is allowed, with a note on stderr: fixing a prompt and resuming is legitimate.

This module knows nothing about models or configs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import IO

from srpo_graph.errors import ConfigError
from srpo_graph.workflow import Workflow

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
        who = (
            f"process {holder.get('pid')} on {holder.get('host')} (since {holder.get('started')})"
            if holder.get("pid")
            else "another process"
        )
        raise ConfigError.at(
            str(run_dir),
            f"the run folder is in use: {who} is training in it (lock {path})",
            why="two processes in one run folder would overwrite each other's checkpoints",
            fix="wait for it to finish or stop it, then resume; or train in another --run-dir",
        ) from None
    handle.seek(0)
    handle.truncate()
    try:
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
    except OSError as exc:  # a full disk: the lock is not taken, the file named
        try:
            handle.close()
        except OSError:  # the buffered write fails again on close
            pass
        if created and [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:  # leave no folder behind
            path.unlink()
            run_dir.rmdir()
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    return RunLock(path, handle, created)


RUN_WORKFLOW = "workflow.json"


def record_workflow(run_dir: str | Path, workflow: Workflow, workflow_path: str | Path) -> None:
    """Write which workflow this run trains (name, resolved file, source hash), atomically."""
    path = Path(run_dir) / RUN_WORKFLOW
    tmp = path.with_suffix(".json.tmp")
    record = {"name": workflow.name, "file": str(Path(workflow_path).resolve()), "source_hash": workflow.source_hash}
    try:
        tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:  # a full disk: nothing half-written left, the file named
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def recorded_workflow(run_dir: str | Path) -> dict[str, str] | None:
    """What the run folder says it trained: ``workflow.json``, else the newest checkpoint's
    ``state.json`` (name only), else None (nothing to compare against).

    >>> recorded_workflow("/nonexistent") is None
    True
    """
    run_dir = Path(run_dir)
    try:
        got = json.loads((run_dir / RUN_WORKFLOW).read_text(encoding="utf-8"))
        if isinstance(got, dict) and isinstance(got.get("name"), str):
            return {k: str(v) for k, v in got.items()}
    except (OSError, ValueError):
        pass
    root = run_dir / "checkpoints"
    states = (
        sorted(
            root.glob("step_*/state.json"),
            key=lambda p: int(p.parent.name.split("_")[-1]) if p.parent.name.split("_")[-1].isdigit() else -1,
        )
        if root.is_dir()
        else []
    )
    for state in reversed(states):
        try:
            name = json.loads(state.read_text(encoding="utf-8")).get("extra", {}).get("workflow")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(name, str):
            return {"name": name}
    return None


def run_folder_of(path: str | Path) -> Path | None:
    """The run folder ``path`` is, or whose ``checkpoints/step_N`` it is; None: neither."""
    path = Path(path)
    for run in (path.parent.parent if path.parent.name == "checkpoints" else None, path):  # a checkpoint's run first
        if run is not None and ((run / RUN_WORKFLOW).is_file() or (run / "config.toml").is_file()):
            return run
    return None


def workflow_given_a_folder(path: str | Path, command: str) -> Path:
    """The ``.wf`` file of the run folder (or checkpoint) ``path`` that was given where ``command``
    expects the workflow first, when the run recorded one that still exists.

    Raises:
        ConfigError: ``path`` is not a run folder, or its workflow file is not recorded or is gone;
            the message says the workflow comes first.
    """
    run = run_folder_of(path)
    got = recorded_workflow(run) if run is not None else None
    if got is not None and got.get("file") and Path(got["file"]).is_file():
        return Path(got["file"])
    what = (f"a run of workflow {got['name']!r}" + (f" (its file {got['file']} is gone)" if got.get("file") else "")
            if got is not None else "a run folder with no record of its workflow" if run is not None
            else "a folder, not a .wf file")
    raise ConfigError.at(str(path), f"{what}: `srpo-graph {command}` takes the workflow (.wf) first",
                         fix=f"srpo-graph {command} WORKFLOW.wf {path} ...")


def check_resumed_workflow(run_dir: str | Path, workflow: Workflow, workflow_path: str | Path) -> None:
    """Refuse to resume ``run_dir`` with a workflow of another name than the one it trained.

    Raises:
        ConfigError: naming the run's workflow and its file, and the one given.
    """
    got = recorded_workflow(run_dir)
    if got is None:
        return
    file = f" (file {got['file']})" if got.get("file") else ""
    if got["name"] != workflow.name:
        raise ConfigError.at(
            str(run_dir),
            f"this run trained workflow {got['name']!r}{file}, not {workflow.name!r} "
            f"(file {Path(workflow_path).resolve()})",
            fix=f"resume with the .wf file the run was started with: srpo-graph train "
            f"{got.get('file', '<its .wf>')} --resume {run_dir}",
        )
    if got.get("source_hash") and workflow.source_hash and got["source_hash"] != workflow.source_hash:
        print(
            f"srpo-graph train: note: workflow {workflow.name!r} changed since this run started{file}; "
            "resuming with the edited file",
            file=sys.stderr,
        )


def clear_previous_run(run_dir: Path, *, overwrite: bool, quiet: bool = False) -> None:
    """A fresh (not resumed) run never mixes with an earlier run's outputs in the same folder.

    It refuses the folder (losing nothing) unless ``overwrite`` is set; then the old outputs
    go, since an old, newer-numbered checkpoint would be what a later ``--resume`` picks.

    Raises:
        ConfigError: the folder holds an earlier run and ``overwrite`` is off.
    """
    old = [run_dir / n for n in ("checkpoints", "traces", "plots", "tensorboard", "metrics.jsonl", "summary.json")]
    old = [p for p in old if p.exists()]
    if old and not overwrite:
        raise ConfigError.at(
            str(run_dir),
            f"the folder holds an earlier run ({', '.join(p.name for p in old)})",
            why="a fresh run there would mix with it or destroy it",
            fix=f"continue it with --resume {run_dir}, choose another --run-dir, or pass --overwrite to replace it",
        )
    if old and not quiet:
        print(f"srpo-graph train: replacing the previous run in {run_dir} (--overwrite)", file=sys.stderr)
    for p in old:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
