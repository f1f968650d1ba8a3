"""Backends stage: who may write or delete what in ``rollout.sglang.weight_dir`` -- one rule for
the full-model sync (``sglang.py``) and the LoRA adapter sync (``sglang_lora.py``).

A weight folder (``weight_dir/<policy>``) belongs to one run at a time. Its manifest,
``.srpo-graph-weights.json``, records the owner (a run id: a digest of the run folder, so a
resumed run is the same owner; a random one for a backend built outside training), the owner's
process and host, and the version folders the owner wrote. The rule, for every path that writes
or deletes there:

* a folder is written only after it is recorded in the owner's manifest (a crash leaves it known),
  and never over a folder the manifest does not list (a user's ``v0`` is refused, left alone);
* a folder is deleted only if the manifest lists it;
* another run's folder: while that run's process is alive on this host, a second run is refused
  at its first write, naming the folder and the owner (before: two runs sharing a weight folder
  deleted each other's live versions); a manifest whose owner is gone (its process is not
  running here) is adopted -- the folders it lists were written by srpo-graph and are stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
from pathlib import Path

from srpo_graph.errors import BackendError

MANIFEST = ".srpo-graph-weights.json"


def run_owner(run_dir: str | os.PathLike) -> str:
    """The owner id of a run folder (stable across resumes and working directories).

    >>> run_owner("runs/x") == run_owner(Path("runs/x").resolve())
    True
    """
    return "run-" + hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=6).hexdigest()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WeightFolderError(BackendError):
    """The weight folder cannot be used as it is (another run owns it, a folder srpo-graph did not
    write is in the way); no server is at fault."""

    remedy = "fix the weight folder as said above"


class WeightFolder:
    """The versions one owner keeps in ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, owner: str | None = None):
        self.root = Path(root)
        self.owner = owner or f"process-{os.getpid()}-{secrets.token_hex(4)}"

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
        tmp = self.root / f"{MANIFEST}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"owner": self.owner, "pid": os.getpid(), "host": socket.gethostname(),
                                   "written": names}, indent=1))
        tmp.replace(self.manifest_path)

    def written(self) -> list[str]:
        """The folders this owner wrote (after the ownership check).

        Raises:
            BackendError: another live run owns the folder.
        """
        data = self._read()
        owner = data.get("owner")
        if owner is not None and owner != self.owner:
            pid, host = data.get("pid"), data.get("host")
            if isinstance(pid, int) and host == socket.gethostname() and pid != os.getpid() and _alive(pid):
                raise WeightFolderError.at(
                    str(self.root), f"the weight folder is in use by another run (owner {owner}, process {pid} on "
                    f"{host}; {self.manifest_path})",
                    why="two runs sharing a weight folder would delete each other's live versions",
                    fix="give each run its own rollout.sglang.weight_dir (the default, RUN_DIR/weights, is)")
        return [str(n) for n in data.get("written", []) if isinstance(n, str)]

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


__all__ = ["MANIFEST", "WeightFolder", "WeightFolderError", "run_owner"]
