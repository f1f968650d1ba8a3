"""Trainer stage, checkpoints: the layout of ``RUN_DIR/checkpoints/step_N/``, the generic layer.

Consumes the loop state (step, the rollout stage's cursor, counters) and a folder a format has
filled with the policies' files; produces a complete, checksummed checkpoint folder. Which files
hold the weights and optimizer states is a format's business (``full.py``: ``save_pretrained`` +
safetensors; ``sharded.py``: DCP shards, under fsdp; the table is ``checkpointer.FORMATS``); this
module never imports one. No pickle::

    step_N/
      policies/<policy>/      the policy's model folder (full: weights + tokenizer; dcp: config +
                              tokenizer, weights and optimizer in dcp/<policy>/)
      optim/<policy>.json     optimizer param groups (full) + scheduler state; "format" names the format
      rng.safetensors         torch (and CUDA) RNG states
      state.json              step, data cursor, counters, python/numpy RNG states, the policies
      config.toml             a copy of the run's config.toml when it was saved
      COMPLETE                written last: the manifest (size + sha256 of every other file); a
                              folder without it is never loaded

Atomicity: a format writes into ``checkpoints/.tmp-step_N-<pid>`` (:func:`begin`), then
:func:`finish_checkpoint` writes the rest, fsyncs and renames the folder to ``step_N`` (a rename
is atomic on POSIX). A crash leaves either the old set of checkpoints or a ``.tmp-`` folder that
:func:`latest_checkpoint` ignores and the next save removes. Only the newest ``keep_last``
complete checkpoints are kept.

Damage after the fact (a flipped byte, a truncated or deleted file) is found by
:func:`verify_files` against the manifest before any file of the checkpoint is opened;
``checkpointer.verify_checkpoint`` adds each format's weight check (every weight finite).

This module knows nothing about rollouts, losses or models.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file

COMPLETE = "COMPLETE"
MANIFEST_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class LoopState:
    """What the loop needs besides weights and optimizers to continue exactly (``state.json``).

    Attributes:
        step: steps completed.
        cursor: batches of tasks the rollout stage has consumed from the seeded training order
            (its ``state_dict()``; ``rollout/tasks.task_indices``).
        skipped_updates: optimizer steps skipped or rolled back so far (non-finite).
        rewards: the mean train reward of every step so far.
        evals: ``(step, eval/reward)`` of every evaluation so far.
        versions: the weight version of each trained policy.
        workflow: the name of the workflow the run trains.
        frozen: each frozen or external policy's declaration (a pointer, never weights).
    """

    step: int
    cursor: int
    skipped_updates: int = 0
    rewards: list[float] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    workflow: str | None = None
    frozen: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``state.json`` fields (the per-run lists and maps under ``extra``, as ever).

        >>> LoopState(step=2, cursor=3, rewards=[0.5]).to_json()["extra"]["rewards"]
        [0.5]
        """
        extra: dict[str, Any] = {"rewards": self.rewards, "evals": [list(e) for e in self.evals],
                                 "versions": self.versions, "workflow": self.workflow}
        if self.frozen is not None:
            extra["frozen"] = self.frozen
        return {"step": self.step, "cursor": self.cursor, "skipped_updates": self.skipped_updates, "extra": extra}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> LoopState:
        """Read back :meth:`to_json` (a checkpoint written before a field existed gets its default).

        Raises:
            KeyError, TypeError, ValueError: a field of the wrong kind (the caller names the file).

        >>> LoopState.from_json(LoopState(step=2, cursor=3, evals=[(2, 0.5)]).to_json()).evals
        [(2, 0.5)]
        """
        extra = payload.get("extra") or {}
        if not isinstance(extra, dict):
            raise TypeError(f"extra is {type(extra).__name__}, not an object")
        step, cursor, skipped = payload["step"], payload["cursor"], payload.get("skipped_updates", 0)
        for name, value in (("step", step), ("cursor", cursor), ("skipped_updates", skipped)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} is {value!r}, not an integer")
        return cls(step=step, cursor=cursor, skipped_updates=skipped,
                   rewards=[float(r) for r in extra.get("rewards", [])],
                   evals=[(int(s), float(r)) for s, r in extra.get("evals", [])],
                   versions={str(k): int(v) for k, v in (extra.get("versions") or {}).items()},
                   workflow=extra.get("workflow"), frozen=extra.get("frozen"))


# --------------------------------------------------------------------------- RNG


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # the global generator is MT19937: its legacy state is a tuple
    meta = {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return tensors, meta


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# --------------------------------------------------------------------------- save / load


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Every ``step_N`` folder under ``run_dir/checkpoints`` (complete or not), oldest first.

    >>> step_dirs("/nonexistent")
    []
    """
    root = Path(run_dir) / "checkpoints"
    return sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ())
                  if (m := _STEP_DIR.match(p.name)) and p.is_dir())


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``run_dir/checkpoints``, oldest first."""
    return [(n, p) for n, p in step_dirs(run_dir) if (p / COMPLETE).is_file()]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None. Half-written folders are ignored.

    >>> latest_checkpoint("/nonexistent") is None
    True
    """
    found = checkpoint_dirs(run_dir)
    return found[-1][1] if found else None


def begin(run_dir: str | Path, step: int, tag: int) -> Path:
    """A fresh ``checkpoints/.tmp-step_{step}-{tag}`` folder (with ``optim/``) for a format to write
    into, after removing earlier runs' leftovers. ``tag``: the writing process's pid (rank 0's)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-step_{step}-{tag}"
    (tmp / "optim").mkdir(parents=True)
    return tmp


def failed(exc: BaseException, tmp: Path, root: Path, final: Path) -> None:
    """Remove the half-written ``tmp``; re-raise ``exc`` (a full disk as ``OSError(ENOSPC)``)."""
    full = isinstance(exc, Exception) and disk_full(exc, root)
    shutil.rmtree(tmp, ignore_errors=True)
    if full and not isinstance(exc, OSError):  # safetensors / torch report ENOSPC as their own errors
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final)) from exc
    raise exc


def finish_checkpoint(run_dir: str | Path, tmp: Path, state: LoopState, policies: list[str], *, keep_last: int = 2,
                      sharded: bool = False) -> Path:
    """Complete the folder ``tmp`` (the policies' files are in it): config copy, RNG states,
    ``state.json``, the ``COMPLETE`` manifest; fsync, rename to ``step_N``, prune to ``keep_last``.
    The last part of every format's save."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{state.step}"
    try:
        if (Path(run_dir) / "config.toml").is_file():  # a copy, so a damaged config.toml loses nothing
            shutil.copyfile(Path(run_dir) / "config.toml", tmp / "config.toml")
        rng_tensors, rng_meta = rng_state()
        save_file(rng_tensors, tmp / "rng.safetensors")
        payload = {**state.to_json(), "rng": rng_meta, "policies": policies, "sharded": sharded}
        (tmp / "state.json").write_text(json.dumps(payload))
        (tmp / COMPLETE).write_text(json.dumps({"step": state.step, "manifest": MANIFEST_VERSION,
                                                "files": manifest(tmp)}, indent=1))
        _fsync_tree(tmp)
    except BaseException as exc:
        failed(exc, tmp, root, final)
    if final.exists():  # e.g. the same step saved again after a resume
        shutil.rmtree(final)
    os.rename(tmp, final)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for _, old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def disk_full_reason(exc: OSError, folder: Path) -> str:
    """What a failed write says, naming the disk: the file (or, when the error does not name one, the
    folder written into) and what its file system has left.

    >>> disk_full_reason(OSError(errno.ENOSPC, "No space left on device", "/x/y"), Path(".")).split(";")[0]
    'No space left on device (/x/y'
    """
    import shutil

    said = getattr(exc, "reason", None)  # a full disk another rank met, in its words (checkpoint/agree.py)
    if isinstance(said, str):
        return said
    what = os.strerror(exc.errno) if exc.errno else str(exc)
    where = str(exc.filename) if exc.filename else f"writing in {folder}"
    near = Path(exc.filename).parent if exc.filename else Path(folder)
    while not near.exists() and near != near.parent:  # a folder removed since (an unused new run folder)
        near = near.parent
    try:
        free = shutil.disk_usage(near).free
    except OSError:  # unreadable: say what is known
        return f"{what} ({where})"
    return f"{what} ({where}; {free:,} bytes free on that file system)"


def disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether ``exc`` (raised while writing into ``folder``) means the disk is full: an ``OSError``
    ENOSPC/EDQUOT anywhere in its chain, a library's own error that says so (safetensors:
    ``code: 28``/``StorageFull``; torch: ``file write failed``), or less than 1 MiB left there.

    >>> disk_full(OSError(28, "No space left on device"), Path("."))
    True
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(seen)
        if any(s in text for s in ("No space left", "code: 28", "StorageFull", "Disk quota", "file write failed")):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(folder).free < (1 << 20)
    except OSError:
        return False


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(root: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size": bytes, "sha256": hex}}`` of every file under ``root``."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != COMPLETE:
            out[p.relative_to(root).as_posix()] = {"size": p.stat().st_size, "sha256": sha256(p)}
    return out


def policy_path(checkpoint: str | Path, policy: str) -> Path:
    """Where a checkpoint keeps one policy's model (load it with ``from_pretrained``)."""
    return Path(checkpoint) / "policies" / policy




class _Extra(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    rewards: list[float] = []
    evals: list[tuple[int, float]] = []
    versions: dict[str, int] = {}
    workflow: str | None = None
    frozen: dict[str, str] | None = None


class _Rng(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    python: tuple[int, list[int], float | None]  # random.getstate()
    numpy: tuple[str, list[int], int, int, float]  # np.random.get_state(legacy=True)


class _State(BaseModel):
    """The fields of ``state.json`` every reader relies on, with their kinds (extra fields allowed:
    a newer writer may add some)."""

    model_config = ConfigDict(strict=True, extra="allow")
    step: Annotated[int, Field(ge=0)]
    cursor: Annotated[int, Field(ge=0)]
    skipped_updates: Annotated[int, Field(ge=0)] = 0
    extra: _Extra | None = None
    rng: _Rng
    policies: list[str]
    sharded: bool = False


def read_state(checkpoint: str | Path) -> dict[str, Any]:
    """``state.json`` of a checkpoint, as written, once every field a reader relies on has its kind
    (``step`` an integer equal to the folder's ``step_N``, ``policies`` a list of names, ...). Every
    reader of ``state.json`` goes through here: a field of the wrong kind is a named damage, never a
    ``TypeError`` deep in a loader.

    Raises:
        OSError: it does not read.
        ValueError: not JSON, or a field of the wrong kind: the message names the field (the caller
            says which checkpoint).
    """
    from pydantic import ValidationError

    ck = Path(checkpoint)
    text = (ck / "state.json").read_text(encoding="utf-8")
    payload = json.loads(text)
    if not isinstance(payload, dict):
        raise ValueError("state.json is not a JSON object")
    try:
        state = _State.model_validate_json(text)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        got = "" if e["type"] == "missing" else f" (it is {json.dumps(e.get('input'))[:60]})"
        raise ValueError(f"state.json: field `{where}`: {e['msg']}{got}") from None
    named = _STEP_DIR.match(ck.name)
    if named and int(named.group(1)) != state.step:
        raise ValueError(f"state.json: field `step` is {state.step}, but the folder is {ck.name}")
    return payload


SNAPSHOT_OF = "SNAPSHOT_OF"  # in a reader's snapshot folder: the checkpoint it was taken of


def origin(checkpoint: str | Path) -> Path:
    """The checkpoint a reader's snapshot was taken of (itself when it is no snapshot), for messages
    and for finding its run folder.

    >>> origin("/nonexistent/step_1").as_posix()
    '/nonexistent/step_1'
    """
    ck = Path(checkpoint)
    try:
        return Path((ck.parent / SNAPSHOT_OF).read_text(encoding="utf-8").strip()) / ck.name
    except OSError:
        return ck


def check_holds(checkpoint: str | Path, needed: list[str], workflow: str) -> None:
    """Refuse, before anything loads, a checkpoint that lacks a policy ``workflow`` loads from it
    (e.g. a run of another workflow), naming the run, what it holds and what the workflow needs.
    A checkpoint whose ``state.json`` does not read is left to the loader (it names the damage).

    Raises:
        ConfigError: a policy of ``needed`` is not in the checkpoint.
    """
    from srpo_graph.errors import ConfigError

    ck = Path(checkpoint)
    try:
        payload = read_state(ck)
        held = [str(p) for p in payload["policies"]]
    except (OSError, ValueError, KeyError, TypeError):
        return
    missing = [n for n in needed if n not in held]
    if not missing:
        return
    ck = origin(ck)  # a reader's snapshot names the checkpoint it was taken of (checkpointer.take_snapshot)
    run = ck.parent.parent if ck.parent.name == "checkpoints" else ck
    extra = payload.get("extra")
    trained = extra.get("workflow") if isinstance(extra, dict) else None
    of = f" of workflow {trained!r}" if isinstance(trained, str) and trained != workflow else ""
    try:  # the run folder's record of its .wf file (train/run_folder.py writes it)
        file = json.loads((run / "workflow.json").read_text(encoding="utf-8")).get("file")
    except (OSError, ValueError, AttributeError):
        file = None
    raise ConfigError.at(
        str(run),
        f"this run{of} holds policies {held} (checkpoint {ck.name}); workflow {workflow!r} loads {needed} from it: "
        f"no {', '.join(repr(m) for m in missing)}",
        fix=(f"use the workflow the run trained ({file})" if isinstance(file, str) else
             "use the workflow the run trained") + f", or a run of {workflow!r}",
    )


def verify_files(checkpoint: str | Path) -> tuple[str | None, list[str]]:
    """Why ``checkpoint``'s files cannot be trusted (None when they can), and its policies.

    Checks, in order: the ``COMPLETE`` manifest reads; every file it lists exists with its size and
    sha256 (before any of them is opened); ``state.json`` reads and names the policies. A checkpoint
    written before manifests existed (no ``files`` in ``COMPLETE``) gets the last check only.

    >>> verify_files("/nonexistent")
    ('no COMPLETE marker (a half-written checkpoint)', [])
    """
    ck = Path(checkpoint)
    try:
        marker = json.loads((ck / COMPLETE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {COMPLETE} marker (a half-written checkpoint)", []
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{COMPLETE} marker unreadable ({exc})", []
    if not isinstance(marker, dict):
        return f"{COMPLETE} marker is not a JSON object", []
    files = marker.get("files")
    if files is not None:
        if not isinstance(files, dict):
            return f"{COMPLETE} manifest has no file table", []
        for rel, want in files.items():
            p = ck / rel
            if not p.is_file():
                return f"{rel} is missing", []
            try:
                size = p.stat().st_size
                if size != want.get("size"):
                    return f"{rel} has {size} bytes, the manifest says {want.get('size')}", []
                if sha256(p) != want.get("sha256"):
                    return f"{rel} does not match its checksum (sha256) in the manifest", []
            except (OSError, AttributeError) as exc:
                return f"{rel} unreadable ({exc})", []
    try:
        policies = [str(p) for p in read_state(ck)["policies"]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        said = str(exc)  # read_state names the field itself
        return (said if said.startswith("state.json") else f"state.json unreadable ({type(exc).__name__}: {exc})"), []
    return None, policies


def load_rng(checkpoint: str | Path, payload: dict[str, Any]) -> None:
    """Put back the RNG states a checkpoint saved (``rng.safetensors`` + ``state.json``'s ``rng``)."""
    set_rng_state(load_file(Path(checkpoint) / "rng.safetensors"), payload["rng"])
