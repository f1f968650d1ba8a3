"""Trainer stage, checkpoints: the formats' table and the one :class:`Checkpointer` the loop calls.

Consumes the trained policies (each with ``name``, ``model``, ``tokenizer``, ``optimizer``,
``scheduler``: the policies stage's ``PolicySlot``) and the loop state; produces checkpoint
folders (``layout.py``) and, on resume, the loop state and optimizer states back. A policy's
files are in one format of :data:`FORMATS`: ``dcp`` (``sharded.py``, every rank its shards,
under fsdp) or ``full`` (``full.py``, rank 0 writes each policy whole). Every reader goes
through :func:`verify_checkpoint` first: the manifest (every file's size and sha256, before any
file is opened), then the format's weight check (every weight finite).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from srpo_graph.errors import ConfigError
from srpo_graph.train.checkpoint import full, sharded
from srpo_graph.train.checkpoint.agree import agree
from srpo_graph.train.checkpoint.layout import (
    COMPLETE,
    SNAPSHOT_OF,
    LoopState,
    checkpoint_dirs,
    latest_checkpoint,
    load_rng,
    read_state,
    step_dirs,
    verify_files,
)
from srpo_graph.train.parallel.fsdp import is_sharded

# name -> the format's module: NAME, holds(ck, policy), check_weights(ck, policy), save_checkpoint / save.
# The first whose ``holds`` is true is a policy's format; ``full`` holds whatever no other format does.
FORMATS: dict[str, ModuleType] = {sharded.NAME: sharded, full.NAME: full}


def format_of(checkpoint: str | Path, policy: str) -> ModuleType:
    """The format ``policy``'s files in ``checkpoint`` are in.

    >>> format_of("/nonexistent", "p").NAME
    'full'
    """
    return next(f for f in FORMATS.values() if f.holds(checkpoint, policy))


def verify_checkpoint(checkpoint: str | Path) -> str | None:
    """Why ``checkpoint`` cannot be trusted, or None when it is good: its files against the manifest
    (``layout.verify_files``), then every policy's weights in its format (every weight finite).

    >>> verify_checkpoint("/nonexistent")
    'no COMPLETE marker (a half-written checkpoint)'
    """
    problem, policies = verify_files(checkpoint)
    if problem is not None:
        return problem
    if sharded.is_sharded_checkpoint(checkpoint) and not _has_manifest(checkpoint):  # Note [DCP metadata]
        return (f"a sharded (DCP) checkpoint whose {COMPLETE} marker has no manifest: its .metadata pickle is "
                "never read unverified")
    for name in policies:
        problem = format_of(checkpoint, name).check_weights(checkpoint, name)
        if problem is not None:
            return problem
    return None


def _has_manifest(checkpoint: str | Path) -> bool:
    import json

    try:
        marker = json.loads((Path(checkpoint) / COMPLETE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and isinstance(marker.get("files"), dict)


def latest_good_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that :func:`verify_checkpoint` accepts, and the newer ones it skipped.

    Returns:
        (checkpoint or None, [(damaged checkpoint, why), ...] newest first).
    """
    skipped: list[tuple[Path, str]] = []
    for _, path in reversed(step_dirs(run_dir)):  # a step_N without COMPLETE is damage: renames are atomic
        problem = verify_checkpoint(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def open_checkpoint(source: str | Path, step: int | None = None, *, reader: str = "read",
                    snapshot: bool = True) -> Path:
    """The one way a command opens a checkpoint (Note [One verified read]): ``source`` is a run folder
    (its newest good checkpoint, or ``step``), one ``checkpoints/step_N`` folder, or a policy folder
    inside one (``.../step_N/policies/NAME``, used as a model); the checkpoint is verified --
    manifest, every file's size and sha256 before any is opened, the pickle of a DCP ``.metadata``
    only after its checksum -- before it is returned.

    With ``snapshot`` (Note [Reading beside a training run]) what is verified and returned is a
    snapshot of the checkpoint (hard links, made in an instant, removed at exit), so a training run
    that rotates the checkpoint away (``checkpoint.keep_last``) mid-read takes nothing from the
    reader; a checkpoint that vanishes before it is linked is named, and a run folder's reader takes
    the newest good one left.

    Returns:
        The checkpoint folder (or the policy folder inside it, for a policy folder ``source``).
    Raises:
        ConfigError: no checkpoint there, or a damaged or vanished one, naming the file and what is wrong.
    """
    path = Path(source)
    chosen = enclosing_checkpoint(path)
    inner = path.relative_to(chosen) if chosen is not None else Path()  # a policy folder inside it
    explicit = chosen is not None or step is not None
    if chosen is None and step is not None:
        chosen = path / "checkpoints" / f"step_{step}"
        if not chosen.is_dir():
            have = [s for s, _ in checkpoint_dirs(path)]
            raise ConfigError.at(str(chosen), f"cannot {reader} step {step}: no such checkpoint",
                                 fix=f"choose one of the run's checkpoints: steps {have}")
    candidates = [chosen] if chosen is not None else [p for _, p in reversed(step_dirs(path))]
    skipped: list[tuple[Path, str]] = []
    for candidate in candidates:
        try:
            read = take_snapshot(candidate) if snapshot else candidate
        except FileNotFoundError:
            skipped.append((candidate, "removed while being opened (the training run rotated it away: "
                                       "checkpoint.keep_last)"))
            continue
        problem = verify_checkpoint(read)
        if problem is not None and not candidate.exists():
            problem = "removed while being opened (the training run rotated it away: checkpoint.keep_last)"
        if problem is None:
            if skipped and not explicit:
                print(f"srpo-graph: took {candidate.name}: "
                      + "; ".join(f"{p.name} {why}" for p, why in skipped), file=sys.stderr)
            return read / inner
        skipped.append((candidate, problem))
    if explicit:
        where, why = skipped[0]
        raise ConfigError.at(str(where), f"cannot {reader} this checkpoint: {why}",
                             why="a checkpoint is read only after every file matches its manifest",
                             fix="use another checkpoint of the run (its newest good one: give the run folder)")
    why = "; ".join(f"{p.name}: {w}" for p, w in skipped) or "no checkpoint"
    raise ConfigError.at(str(path), f"no good checkpoint to {reader} ({why})",
                         fix="train with checkpoint.every > 0, or give another source")


# Note [Reading beside a training run]: a reader (eval, consolidate, export-adapter) may run while the
# run trains and rotates its checkpoints away (keep_last). A checkpoint's files are never changed
# after its COMPLETE marker (written in a .tmp- folder, renamed), so hard links to them taken at once
# are a consistent snapshot that the rotation cannot remove; the reader verifies and reads the
# snapshot (RUN_DIR/.readers/<pid>-<token>/step_N, removed when the process exits). Where hard links
# cannot be made (another file system), the files are copied. Issue 40, item 6.


def take_snapshot(checkpoint: Path) -> Path:
    """A hard-linked snapshot of ``checkpoint`` (Note above); removed when this process exits.

    Raises:
        FileNotFoundError: the checkpoint (or one of its files) vanished while it was linked.
    """
    import atexit
    import os
    import secrets
    import shutil

    if not checkpoint.is_dir():
        raise FileNotFoundError(str(checkpoint))
    root = checkpoint.parent.parent / ".readers" / f"{os.getpid()}-{secrets.token_hex(4)}"
    target = root / checkpoint.name
    atexit.register(shutil.rmtree, root, True)
    try:
        root.mkdir(parents=True)
        (root / SNAPSHOT_OF).write_text(str(checkpoint.parent.resolve()), encoding="utf-8")  # layout.origin
        for dirpath, _, files in os.walk(checkpoint):
            rel = Path(dirpath).relative_to(checkpoint)
            (target / rel).mkdir(parents=True, exist_ok=True)
            for name in files:
                src, dst = Path(dirpath) / name, target / rel / name
                try:
                    os.link(src, dst)
                except FileNotFoundError:
                    raise
                except OSError:  # another file system, or links not allowed: a copy
                    shutil.copy2(src, dst)
        if not (target / COMPLETE).is_file():
            raise FileNotFoundError(str(checkpoint / COMPLETE))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return target


def enclosing_checkpoint(path: str | Path) -> Path | None:
    """The ``checkpoints/step_N`` folder ``path`` is, or is a policy folder of (None: neither).

    >>> enclosing_checkpoint("runs/r/checkpoints/step_3/policies/tiny").as_posix()
    'runs/r/checkpoints/step_3'
    >>> enclosing_checkpoint("runs/r") is None
    True
    """
    p = Path(path)
    for candidate in (p, p.parent.parent):
        if candidate.parent.name == "checkpoints" and candidate.name.startswith("step_") and (
                candidate == p or p.parent.name == "policies"):
            return candidate
    return None


def verified_model_path(path: str) -> str:
    """``path`` (a model folder), after its checkpoint's verification when it is a checkpoint's policy
    folder (``.../checkpoints/step_N/policies/NAME``, e.g. a frozen earlier self).

    Raises:
        ConfigError: that checkpoint is damaged (named).
    """
    if enclosing_checkpoint(path) is not None:
        open_checkpoint(path, reader="load a policy of", snapshot=False)  # loaded now, while the run lives
    return path


# Note [One verified read]: --resume, eval, consolidate, export-adapter and a checkpoint's policy folder
# used as a model (rollout.models, a frozen `policy past = ".../step_N/policies/me"`) read checkpoints;
# each goes through open_checkpoint (or latest_good_checkpoint), so a damaged or swapped file is named,
# never exported, evaluated or unpickled (issue 40, item 2).


def load_checkpoint(checkpoint: str | Path, *, optimizers: dict[str, Any], schedulers: dict[str, Any],
                    restore_rng: bool = True) -> LoopState:
    """Restore optimizer/scheduler/RNG state from a complete checkpoint; the loop state it saved.

    The models themselves are loaded by the policies stage (``full``: from ``layout.policy_path``;
    ``dcp``: ``sharded.load_policy``, which also loads the optimizer's shards).

    Raises:
        ConfigError: the folder is not a complete checkpoint, lacks a policy, or a file of it
            does not read (call :func:`verify_checkpoint` first to choose a good one).
    """
    import json

    ck = Path(checkpoint)
    if not (ck / COMPLETE).is_file():
        raise ConfigError.at(str(ck), f"not a complete checkpoint (no {COMPLETE} marker)",
                             fix="resume from a run folder; the newest complete checkpoint is used")
    try:
        payload = read_state(ck)
        for name, opt in optimizers.items():
            if name not in payload["policies"]:
                raise ConfigError.at(str(ck), f"checkpoint has no policy {name!r} (has {payload['policies']})",
                                     fix="resume with the workflow the run was started with")
            meta = json.loads((ck / "optim" / f"{name}.json").read_text())
            if meta.get("format") != sharded.FORMAT:  # a dcp optimizer is loaded with its weights' shards
                full.load_optimizer(ck, name, opt, meta)
            if meta.get("scheduler") is not None and name in schedulers:
                schedulers[name].load_state_dict(meta["scheduler"])
        if restore_rng:
            load_rng(ck, payload)
        return LoopState.from_json(payload)
    except ConfigError:
        raise
    except Exception as exc:  # json, safetensors, torch: a damaged file of any kind, never a traceback
        raise ConfigError.at(str(ck), f"damaged checkpoint ({type(exc).__name__}: {exc})",
                             fix="resume from the run folder: --resume falls back to the previous good "
                             "checkpoint") from None


@dataclass
class Checkpointer:
    """Saves the run every ``every`` steps (and at the last) in the policies' format, keeping the
    newest ``keep_last``; chooses and restores the checkpoint a resumed run starts from.

    Under fsdp every rank calls :meth:`save` (each writes its shards); otherwise only the process
    that owns the run folder (``is_main``) writes.

    Attributes:
        run_dir: the run folder.
        every: steps between saves (0: only the last step).
        keep_last: complete checkpoints kept.
        last_step: the run's last step (always saved).
        is_main: this process writes the run folder (rank 0).
        latest: the newest complete checkpoint this run wrote or resumed from.
    """

    run_dir: Path
    every: int
    keep_last: int
    last_step: int
    is_main: bool = True
    latest: Path | None = None

    def due(self, step: int) -> bool:
        """Whether step ``step`` is saved.

        >>> [s for s in range(1, 8) if Checkpointer(Path("r"), every=3, keep_last=1, last_step=7).due(s)]
        [3, 6, 7]
        """
        return step == self.last_step or (self.every > 0 and step % self.every == 0)

    def save(self, state: LoopState, policies: Sequence[Any]) -> Path | None:
        """Write step ``state.step``'s checkpoint of ``policies``: ``dcp`` when their models are
        sharded (a collective: every rank), else ``full`` (the main process; None elsewhere).

        Raises:
            OSError: the disk filled up (``ENOSPC``: complete checkpoints stay intact), on every rank
                of a job wherever it filled up (``agree.DiskFull``).
            ValueError: a weight is not finite (nothing is saved).
        """
        parts = {"models": {p.name: p.model for p in policies}, "tokenizers": {p.name: p.tokenizer for p in policies},
                 "optimizers": {p.name: p.optimizer for p in policies},
                 "schedulers": {p.name: p.scheduler for p in policies}}
        if any(is_sharded(p.model) for p in policies):
            self.latest = sharded.save(self.run_dir, state, keep_last=self.keep_last, **parts)
            return self.latest
        error: Exception | None = None
        if self.is_main:
            try:
                self.latest = full.save_checkpoint(self.run_dir, state, keep_last=self.keep_last, **parts)
            except Exception as exc:
                error = exc
        # the other ranks learn how rank 0's save went, so none goes on alone (Note [A full disk stops every rank])
        agree(error, self.run_dir, self.run_dir / "checkpoints" / f"step_{state.step}")
        return self.latest

    def choose(self, *, announce: bool = True) -> Path | None:
        """The newest checkpoint that verifies; damaged newer ones are named (stderr). None: the run
        has no checkpoint yet (it stopped before the first), so it starts again at step 0.

        Raises:
            ConfigError: every checkpoint is damaged (each named with why).
        """
        good, damaged = latest_good_checkpoint(self.run_dir)
        if good is None:
            if not damaged:
                if announce:
                    print(f"srpo-graph train: {self.run_dir} has no checkpoint yet; starting the run again from step 0 "
                          "with its saved configuration", file=sys.stderr)
                return None
            listed = "\n".join(f"  {p}: {why}" for p, why in damaged)
            raise ConfigError.at(str(self.run_dir), f"every checkpoint is damaged, nothing to resume from\n{listed}",
                                 fix="restore the run folder from a backup, or start a new run with --overwrite")
        if announce:
            for path, why in damaged:
                print(f"srpo-graph train: checkpoint {path} is damaged ({why}); skipping it", file=sys.stderr)
            if damaged:
                print(f"srpo-graph train: resuming from the previous good checkpoint {good}", file=sys.stderr)
        return good

    def restore(self, checkpoint: Path, policies: Sequence[Any]) -> LoopState:
        """The loop state of ``checkpoint``, with every policy's optimizer and scheduler state (and the
        RNG states) put back; the weights were loaded when the policies were built."""
        self.latest = checkpoint
        return load_checkpoint(checkpoint, optimizers={p.name: p.optimizer for p in policies},
                               schedulers={p.name: p.scheduler for p in policies})

    def newest(self) -> Path | None:
        """The newest complete checkpoint in the run folder (what a stop message names)."""
        return latest_checkpoint(self.run_dir)


__all__ = ["FORMATS", "Checkpointer", "checkpoint_dirs", "enclosing_checkpoint", "format_of", "latest_good_checkpoint",
           "load_checkpoint", "open_checkpoint", "verified_model_path", "verify_checkpoint"]
