"""Trainer stage: atomic checkpoints in ``RUN_DIR/checkpoints/step_N/``.

Consumes the trainer's per-policy models, tokenizers, optimizers and schedulers plus the loop
state (step, data cursor); produces a folder that ``--resume`` reads back exactly. No pickle:

    step_N/
      policies/<policy>/      model (save_pretrained, safetensors) + tokenizer
                              (fsdp: config + tokenizer; weights and optimizer as DCP shards in
                              dcp/<policy>/, see sharded_checkpoint.py)
      optim/<policy>.safetensors   optimizer tensors (Adam moments, step counters)
      optim/<policy>.json          optimizer param groups + scheduler state
      rng.safetensors              torch (and CUDA) RNG states
      state.json                   step, data cursor, python/numpy RNG states, metrics so far
      config.toml                  a copy of the run's config.toml when it was saved
      COMPLETE                     written last: the manifest (size + sha256 of every other
                                   file); a folder without it is never loaded

Atomicity: everything is written into ``checkpoints/.tmp-step_N-<pid>``, fsynced, then the
folder is renamed to ``step_N`` (a rename is atomic on POSIX). A crash leaves either the old set
of checkpoints or a ``.tmp-`` folder that :func:`latest_checkpoint` ignores and the next save
removes. Only the newest ``keep_last`` complete checkpoints are kept.

Damage after the fact (a flipped byte, a truncated or deleted file, a model with NaN weights) is
found by :func:`verify_checkpoint` (every file against the manifest, every weight finite), and
:func:`latest_good_checkpoint` skips such a checkpoint, naming it and why, so ``--resume`` falls
back to the previous good one instead of training on a damaged model.

This module knows nothing about rollouts or losses.
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
from typing import Any, Callable, Mapping

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from srpo_graph.errors import ConfigError

COMPLETE = "COMPLETE"
MANIFEST_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class LoopState:
    """What the loop needs besides weights and optimizers to continue exactly."""

    step: int  # steps completed
    cursor: int  # batches of tasks consumed from the seeded training order (see data.task_indices)
    skipped_updates: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- optimizer state


def _optimizer_to_files(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_from_files(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, st in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(st)
    return {"state": state, "param_groups": meta["param_groups"]}


# --------------------------------------------------------------------------- RNG


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
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


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``run_dir/checkpoints``, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / COMPLETE).is_file():
                found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None. Half-written folders are ignored.

    >>> latest_checkpoint("/nonexistent") is None
    True
    """
    found = checkpoint_dirs(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    run_dir: str | Path,
    state: LoopState,
    *,
    models: Mapping[str, Any],
    tokenizers: Mapping[str, Any],
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    keep_last: int = 2,
    optimizer_states: Mapping[str, dict[str, Any]] | None = None,
) -> Path:
    """Write ``run_dir/checkpoints/step_{state.step}`` atomically; prune to ``keep_last``.

    Args:
        run_dir: the run folder.
        state: step, cursor and counters to restore.
        models, tokenizers, optimizers, schedulers: per policy name.
        keep_last: complete checkpoints kept (the newest).
        optimizer_states: per policy, an ``optimizer.state_dict()``-shaped full state to save
            instead of ``optimizers[name].state_dict()`` (fsdp: gathered from the shards).
    Returns:
        The checkpoint folder.
    Raises:
        ValueError: a model has a non-finite parameter (a corrupted model is never saved).
    """
    for name, model in models.items():
        for pname, p in model.named_parameters():
            if not torch.isfinite(p).all():
                raise ValueError(f"refusing to checkpoint policy {name!r}: parameter {pname} is not finite")
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{state.step}"
    tmp = root / f".tmp-step_{state.step}-{os.getpid()}"
    try:  # a failure (disk full, Ctrl-C) leaves no half-written folder taking space
        (tmp / "optim").mkdir(parents=True)
        for name, model in models.items():
            model.save_pretrained(tmp / "policies" / name, safe_serialization=True)
            tokenizers[name].save_pretrained(tmp / "policies" / name)
            opt_sd = (optimizer_states or {}).get(name)
            tensors, meta = _optimizer_to_files(opt_sd if opt_sd is not None else optimizers[name].state_dict())
            save_file(tensors, tmp / "optim" / f"{name}.safetensors")
            meta["scheduler"] = schedulers[name].state_dict() if name in schedulers else None
            (tmp / "optim" / f"{name}.json").write_text(json.dumps(meta))
    except BaseException as exc:
        _failed(exc, tmp, root, final)
    return finish_checkpoint(run_dir, tmp, state, sorted(models), keep_last=keep_last)


def _failed(exc: BaseException, tmp: Path, root: Path, final: Path) -> None:
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
    Also the last part of a sharded checkpoint (``sharded_checkpoint.py``)."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{state.step}"
    try:
        if (Path(run_dir) / "config.toml").is_file():  # a copy, so a damaged config.toml loses nothing
            shutil.copyfile(Path(run_dir) / "config.toml", tmp / "config.toml")
        rng_tensors, rng_meta = _rng_state()
        save_file(rng_tensors, tmp / "rng.safetensors")
        payload = {"step": state.step, "cursor": state.cursor, "skipped_updates": state.skipped_updates,
                   "extra": state.extra, "rng": rng_meta, "policies": policies, "sharded": sharded}
        (tmp / "state.json").write_text(json.dumps(payload))
        (tmp / COMPLETE).write_text(json.dumps({"step": state.step, "manifest": MANIFEST_VERSION,
                                                "files": _manifest(tmp)}, indent=1))
        _fsync_tree(tmp)
    except BaseException as exc:
        _failed(exc, tmp, root, final)
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(root: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size": bytes, "sha256": hex}}`` of every file under ``root``."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != COMPLETE:
            out[p.relative_to(root).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    return out


def verify_checkpoint(checkpoint: str | Path) -> str | None:
    """Why ``checkpoint`` cannot be trusted, or None when it is good.

    Checks, in order: the ``COMPLETE`` manifest reads; every file it lists exists with its
    size and sha256; ``state.json`` reads; every weight of every policy is finite. A checkpoint
    written before manifests existed (no ``files`` in ``COMPLETE``) gets the last two checks.

    >>> verify_checkpoint("/nonexistent")
    'no COMPLETE marker (a half-written checkpoint)'
    """
    ck = Path(checkpoint)
    try:
        marker = json.loads((ck / COMPLETE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {COMPLETE} marker (a half-written checkpoint)"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{COMPLETE} marker unreadable ({exc})"
    if not isinstance(marker, dict):
        return f"{COMPLETE} marker is not a JSON object"
    files = marker.get("files")
    if files is not None:
        if not isinstance(files, dict):
            return f"{COMPLETE} manifest has no file table"
        for rel, want in files.items():
            p = ck / rel
            if not p.is_file():
                return f"{rel} is missing"
            try:
                size = p.stat().st_size
                if size != want.get("size"):
                    return f"{rel} has {size} bytes, the manifest says {want.get('size')}"
                if _sha256(p) != want.get("sha256"):
                    return f"{rel} does not match its checksum (sha256) in the manifest"
            except (OSError, AttributeError) as exc:
                return f"{rel} unreadable ({exc})"
    try:
        payload = json.loads((ck / "state.json").read_text(encoding="utf-8"))
        policies = list(payload["policies"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"state.json unreadable ({type(exc).__name__}: {exc})"
    for name in policies:
        if (ck / "dcp" / name).is_dir():  # an fsdp checkpoint: DCP shards (sharded_checkpoint.py)
            from srpo_graph.train.checkpoint.sharded import check_finite

            problem = check_finite(ck, name)
            if problem is not None:
                return problem
            continue
        weights = sorted(policy_path(ck, name).glob("*.safetensors"))
        if not weights:
            return f"policy {name!r} has no weights (policies/{name}/*.safetensors)"
        for wpath in weights:
            try:
                tensors = load_file(wpath)
            except Exception as exc:  # safetensors raises its own error types for damaged headers
                return f"{wpath.relative_to(ck)} does not load ({type(exc).__name__}: {exc})"
            for tname, t in tensors.items():
                if t.is_floating_point() and not torch.isfinite(t).all():
                    return f"{wpath.relative_to(ck)}: weight {tname} is not finite"
    return None


def latest_good_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that :func:`verify_checkpoint` accepts, and the newer ones it skipped.

    Returns:
        (checkpoint or None, [(damaged checkpoint, why), ...] newest first).
    """
    skipped: list[tuple[Path, str]] = []
    root = Path(run_dir) / "checkpoints"
    steps = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else ())
                   if (m := _STEP_DIR.match(p.name)) and p.is_dir())
    for _, path in reversed(steps):  # a step_N without COMPLETE is damage: renames are atomic
        problem = verify_checkpoint(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def policy_path(checkpoint: str | Path, policy: str) -> Path:
    """Where a checkpoint keeps one policy's model (load it with ``from_pretrained``)."""
    return Path(checkpoint) / "policies" / policy


def load_checkpoint(
    checkpoint: str | Path,
    *,
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    restore_rng: bool = True,
    loaders: Mapping[str, Callable[[dict[str, Any]], None]] | None = None,
) -> LoopState:
    """Restore optimizer/scheduler/RNG state from a complete checkpoint.

    The models themselves are loaded by the caller from :func:`policy_path` (``from_pretrained``).
    ``loaders`` (per policy) load the full optimizer state dict instead of
    ``optimizer.load_state_dict`` (fsdp: into the sharded optimizer).

    Raises:
        ConfigError: the folder is not a complete checkpoint, lacks a policy, or a file of it
            does not read (call :func:`verify_checkpoint` first to choose a good one).
    """
    ck = Path(checkpoint)
    if not (ck / COMPLETE).is_file():
        raise ConfigError.at(str(ck), f"not a complete checkpoint (no {COMPLETE} marker)",
                             fix="resume from a run folder; the newest complete checkpoint is used")
    try:
        payload = json.loads((ck / "state.json").read_text())
        for name, opt in optimizers.items():
            if name not in payload["policies"]:
                raise ConfigError.at(str(ck), f"checkpoint has no policy {name!r} (has {payload['policies']})",
                                     fix="resume with the workflow the run was started with")
            meta = json.loads((ck / "optim" / f"{name}.json").read_text())
            if meta.get("format") == "dcp":  # loaded with the sharded weights (sharded_checkpoint.load_policy)
                if meta.get("scheduler") is not None and name in schedulers:
                    schedulers[name].load_state_dict(meta["scheduler"])
                continue
            opt_sd = _optimizer_from_files(load_file(ck / "optim" / f"{name}.safetensors"), meta)
            (loaders or {}).get(name, opt.load_state_dict)(opt_sd)
            if meta.get("scheduler") is not None and name in schedulers:
                schedulers[name].load_state_dict(meta["scheduler"])
        if restore_rng:
            _set_rng_state(load_file(ck / "rng.safetensors"), payload["rng"])
        return LoopState(step=payload["step"], cursor=payload["cursor"],
                         skipped_updates=payload.get("skipped_updates", 0), extra=payload.get("extra", {}))
    except ConfigError:
        raise
    except Exception as exc:  # json, safetensors, torch: a damaged file of any kind, never a traceback
        raise ConfigError.at(str(ck), f"damaged checkpoint ({type(exc).__name__}: {exc})",
                             fix="resume from the run folder: --resume falls back to the previous good "
                             "checkpoint") from None
