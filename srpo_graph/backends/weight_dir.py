"""Backends stage: who may write or delete what in ``rollout.sglang.weight_dir`` -- one rule for
the full-model sync (``sglang.py``) and the LoRA adapter sync (``sglang_lora.py``).

A weight folder (``weight_dir/<policy>``) belongs to one run at a time: the run holding its lease
(``weight_lease.py``, Note [A weight folder's lease]: a heartbeat, not a PID, so an owner on
another host, and a second owner in the same process, count). Its manifest,
``.srpo-graph-weights.json``, records the owner (a run id: a digest of the run folder, so a
resumed run is the same owner; a random one for a backend built outside training) and the
version folders it wrote. The rule, for every path that writes or deletes there:

* nothing is written or deleted before the lease is held (taken at the first write, renewed by a
  heartbeat and by every write): while another owner's lease is fresh, a second run is refused
  at its first write, naming the folder and the holder (run, host, pid, heartbeat age) -- before,
  two runs sharing a weight folder deleted each other's live versions;
* a folder is written only after it is recorded in the owner's manifest (a crash leaves it known),
  and never over a folder the manifest does not list (a user's ``v0`` is refused, left alone);
* a folder is deleted only if the manifest lists it; a manifest of another owner whose lease
  expired (or was released) is adopted -- the folders it lists were written by srpo-graph and are
  stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
from pathlib import Path

from srpo_graph.backends.weight_lease import EXPIRY_S, HEARTBEAT_S, Lease, WeightFolderError

MANIFEST = ".srpo-graph-weights.json"
_RUN_DIRS: dict[str, str] = {}  # owner id -> run folder, for the lease to name the run


def run_owner(run_dir: str | os.PathLike) -> str:
    """The owner id of a run folder (stable across resumes and working directories).

    >>> run_owner("runs/x") == run_owner(Path("runs/x").resolve())
    True
    """
    path = str(Path(run_dir).resolve())
    owner = "run-" + hashlib.blake2b(path.encode(), digest_size=6).hexdigest()
    _RUN_DIRS[owner] = path
    return owner


class WeightFolder:
    """The versions one owner keeps in ``root`` (see the module docstring).

    Args:
        root: the weight folder.
        owner: the owner id (``run_owner``); None: one of its own for this object.
        interval, expiry: the lease's heartbeat interval and expiry, seconds (Note [A weight
            folder's lease]; short ones in tests).
    """

    def __init__(self, root: str | os.PathLike, owner: str | None = None, *, interval: float = HEARTBEAT_S,
                 expiry: float = EXPIRY_S):
        self.root = Path(root)
        self.owner = owner or f"process-{os.getpid()}-{secrets.token_hex(4)}"
        self.lease = Lease(self.root, self.owner, _RUN_DIRS.get(self.owner), interval=interval, expiry=expiry)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    def _read(self) -> dict:
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, names: list[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{MANIFEST}.{self.lease.token}.tmp"
        tmp.write_text(json.dumps({"owner": self.owner, "pid": os.getpid(), "host": socket.gethostname(),
                                   "written": names}, indent=1))
        tmp.replace(self.manifest_path)

    def written(self) -> list[str]:
        """The folders listed in the manifest, once this owner holds the folder's lease.

        Raises:
            WeightFolderError: another owner's lease is fresh (named), or this owner's was taken over.
        """
        self.lease.acquire()
        return [str(n) for n in self._read().get("written", []) if isinstance(n, str)]

    def close(self) -> None:
        """Release the lease (the backend's ``close``; the end of a run)."""
        self.lease.release()

    def claim(self, name: str) -> Path:
        """``root/name``, recorded as this owner's and empty, ready to be written.

        Raises:
            BackendError: another live run owns the folder, or ``root/name`` exists and is not listed
                (a folder srpo-graph did not write: left alone).
        """
        path = self.root / name
        written = self.written()
        if path.exists():
            if name not in written:
                raise WeightFolderError.at(str(path), f"exists and was not written by srpo-graph (not in "
                                      f"{self.manifest_path}); refusing to replace it",
                                      fix="point rollout.sglang.weight_dir at a folder of its own")
            shutil.rmtree(path)
        self._write(sorted(set(written) | {name}, key=_vkey))  # before writing: a crash leaves it known
        return path

    def keep_only(self, keep: set[str]) -> None:
        """Delete this owner's folders not in ``keep`` (never one the manifest does not list)."""
        written = self.written()
        for name in written:
            if name not in keep:
                shutil.rmtree(self.root / name, ignore_errors=True)
        self._write([n for n in written if n in keep])


def _vkey(name: str) -> tuple[int, str]:
    try:
        return int(name[1:]), name
    except ValueError:
        return -1, name


__all__ = ["MANIFEST", "WeightFolder", "WeightFolderError", "run_owner"]  # WeightFolderError: weight_lease.py
