"""Trainer stage, checkpoints: the ``dcp`` format, sharded under fsdp (``torch.distributed.checkpoint``).

Consumes the sharded policy models and optimizers of every rank; produces a checkpoint folder in
the layout of ``layout.py`` where each policy's weights and optimizer state are a DCP
checkpoint, written by every rank for its own shards (no rank gathers a full model)::

    step_N/
      dcp/<policy>/           .metadata + __<rank>_0.distcp: {"model": ..., "optim": ...} shards
      policies/<policy>/      config.json (+ generation_config.json) and the tokenizer, no weights
      optim/<policy>.json     {"format": "dcp", "scheduler": ...}
      rng.safetensors, state.json ("sharded": true), config.toml, COMPLETE (manifest, checksums)

The folder is written into ``checkpoints/.tmp-step_N-<rank 0's pid>`` and renamed by rank 0 once
every rank's shards are written, as ``full.save_checkpoint`` does; the manifest covers the
shards. ``--resume`` builds each model from its ``config.json`` (weights uninitialized, then
sharded) and loads model and optimizer shards with ``dcp.load`` -- any number of ranks (DCP
reshards), also one process (``srpo-graph eval`` of a run folder). :func:`consolidate` writes a
normal ``save_pretrained`` folder (``srpo-graph consolidate``), one shard at a time.

Note [DCP metadata]: DCP's ``.metadata`` file is a pickle written by torch (the only pickle a
run folder holds, and only under fsdp). It is read only after the manifest check has matched
its sha256 (``layout.verify_files``), so a damaged or swapped file is refused before it is read.

Note [No shared run folder]: each rank writes its own shard files under the same (relative or
absolute) path. On one machine, or a file system every rank sees, rank 0 then sees them all.
Across nodes without a shared file system (the run folder lives on rank 0's node,
docs/gpu.md), rank 0 lists the shard files DCP's metadata names that it does not see, and each
is sent to it over the process group by the lowest rank that has it (point to point, in chunks,
under the group's deadline); the other nodes' leftover copies are removed once rank 0 has
renamed the checkpoint. ``--resume`` then ships the whole checkpoint to the ranks that cannot
read it (``parallel/multinode.ship_checkpoint``), as for any checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from srpo_graph.errors import ConfigError
from srpo_graph.train.checkpoint.agree import agree
from srpo_graph.train.checkpoint.layout import begin, finish_checkpoint, origin, policy_path
from srpo_graph.train.parallel.collectives import all_reduce, broadcast_bytes, current

DCP_DIR = "dcp"
NAME = FORMAT = "dcp"


def is_sharded_checkpoint(checkpoint: str | Path) -> bool:
    """Whether ``checkpoint`` keeps its weights as DCP shards.

    >>> is_sharded_checkpoint("/nonexistent")
    False
    """
    return (Path(checkpoint) / DCP_DIR).is_dir()


def holds(checkpoint: str | Path, policy: str) -> bool:
    """Whether ``policy`` of ``checkpoint`` is in this format (``checkpointer.format_of``)."""
    return dcp_path(checkpoint, policy).is_dir()


def dcp_path(checkpoint: str | Path, policy: str) -> Path:
    return Path(checkpoint) / DCP_DIR / policy


def _all_max(value: int) -> int:
    """The largest ``value`` over the job's ranks (a collective under the group's deadline)."""
    return int(all_reduce(value, "max", current()))


def save(
    run_dir: str | Path,
    state: Any,
    *,
    models: Mapping[str, Any],
    tokenizers: Mapping[str, Any],
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    keep_last: int = 2,
) -> Path:
    """Write ``run_dir/checkpoints/step_{state.step}`` with every rank's shards. A collective:
    every rank calls it with its own (sharded) models and optimizers.

    Returns:
        The checkpoint folder (the same path on every rank).
    Raises:
        ValueError: a model has a non-finite parameter on some rank (nothing is saved).
        DiskFull: the disk filled up on some rank, raised by every rank (Note [A full disk stops
            every rank], ``agree.py``); nothing half-written is left.
        ConfigError: a shard file no rank has (Note [No shared run folder]).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank = current().rank
    bad = ""
    for name, model in models.items():
        for pname, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if not bad and not torch.isfinite(local).all():
                bad = f"refusing to checkpoint policy {name!r}: parameter {pname} is not finite"
    if _all_max(int(bool(bad))):
        raise ValueError(bad or "refusing to checkpoint: another rank holds a non-finite parameter")
    root = Path(run_dir) / "checkpoints"
    tag = _all_max(os.getpid() if rank == 0 else 0)  # rank 0's pid names the folder on every rank
    tmp, final = root / f".tmp-step_{state.step}-{tag}", root / f"step_{state.step}"
    error: BaseException | None = None
    try:  # each part ends in agree(): a failure on any rank (a full disk) stops every rank alike
        try:
            if rank == 0:
                begin(run_dir, state.step, tag)
        except Exception as exc:
            error = exc
        agree(error, run_dir, final, remove=[tmp])  # also the barrier: the folder exists before any rank writes into it
        try:
            for name, model in models.items():
                msd, osd = get_state_dict(model, optimizers[name])
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(dcp_path(tmp, name)))
        except (Exception, CheckpointException) as exc:  # DCP hands a rank's failure to every rank, as a
            error = exc  # CheckpointException: a BaseException (it would pass an `except Exception`)
        agree(error, run_dir, final, remove=[tmp])
        error = _collect_shards(tmp, sorted(models))  # Note [No shared run folder]
        if rank == 0 and error is None:
            try:
                _finish(run_dir, tmp, state, models, tokenizers, schedulers, keep_last)
            except Exception as exc:
                error = exc
        agree(error, run_dir, final, remove=[tmp])
        return final
    finally:  # another node's own copy of its shards (rank 0 renamed the one it sees), or what a rank
        shutil.rmtree(tmp, ignore_errors=True)  # stopped by a signal or a dead peer had written


CHUNK = 64 << 20  # bytes per message when a shard file travels to rank 0


def _collect_shards(tmp: Path, policies: Sequence[str]) -> Exception | None:
    """Rank 0 receives the shard files under ``tmp`` that it does not see, each from the lowest rank
    that has it (Note [No shared run folder]). A collective: every rank calls it after ``dcp.save``.

    Returns:
        What writing a received file raised on rank 0 (its disk is full): the transfer goes on to
        its end, the rest unwritten, so every rank leaves it together (``agree``); else None.
    """
    import torch.distributed as tdist

    rank, world = current().rank, current().world_size
    if world == 1:
        return None
    failed: Exception | None = None
    missing: list[str] = []
    if rank == 0:
        for name in policies:
            d = dcp_path(tmp, name)
            missing += [str((d / f).relative_to(tmp)) for f in _shard_files(d) if not (d / f).is_file()]
    missing = json.loads(broadcast_bytes(json.dumps(missing).encode() if rank == 0 else None, current()).decode())
    for rel in missing:
        src = int(all_reduce(rank if (tmp / rel).is_file() else world, "min", current()))
        if src == world:  # nobody has it: _finish names it
            continue
        if rank == src:
            data = (tmp / rel).read_bytes()
            n = torch.tensor([len(data)], dtype=torch.int64)
            tdist.send(n, dst=0)
            for off in range(0, len(data), CHUNK):
                tdist.send(torch.frombuffer(bytearray(data[off : off + CHUNK]), dtype=torch.uint8), dst=0)
        elif rank == 0:
            n = torch.empty(1, dtype=torch.int64)
            tdist.recv(n, src=src)
            out = None
            try:
                if failed is None:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    out = open(tmp / rel, "wb")
            except OSError as exc:
                failed = exc
            for off in range(0, int(n.item()), CHUNK):
                chunk = torch.empty(min(CHUNK, int(n.item()) - off), dtype=torch.uint8)
                tdist.recv(chunk, src=src)
                try:
                    if out is not None and failed is None:
                        out.write(chunk.numpy().tobytes())
                except OSError as exc:
                    failed = exc
            try:
                if out is not None:
                    out.close()
            except OSError as exc:
                failed = failed or exc
    return failed


def _finish(
    run_dir: str | Path,
    tmp: Path,
    state: Any,
    models: Mapping[str, Any],
    tokenizers: Mapping[str, Any],
    schedulers: Mapping[str, Any],
    keep_last: int,
) -> Path:
    """Rank 0: configs, tokenizers, scheduler states, then the manifest and the rename."""
    for name in models:
        missing = [f for f in _shard_files(dcp_path(tmp, name)) if not (dcp_path(tmp, name) / f).is_file()]
        if missing:
            raise ConfigError.at(
                str(run_dir),
                f"the checkpoint shards {missing} were written by no rank of the job",
                why="DCP's metadata names them, but no rank has them after the save",
                fix="check the disk of every node (a full or read-only disk on one of them)",
            )
        out = policy_path(tmp, name)
        model = models[name]
        model.config.save_pretrained(out)
        gen = getattr(model, "generation_config", None)
        if gen is not None and hasattr(gen, "save_pretrained"):
            gen.save_pretrained(out)
        tokenizers[name].save_pretrained(out)
        sched = schedulers[name].state_dict() if name in schedulers else None
        (tmp / "optim" / f"{name}.json").write_text(json.dumps({"format": FORMAT, "scheduler": sched}))
    return finish_checkpoint(run_dir, tmp, state, sorted(models), keep_last=keep_last, sharded=True)


def _shard_files(path: Path) -> list[str]:
    """The data files DCP's metadata names (Note [DCP metadata])."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(path)).read_metadata()
    return sorted({getattr(v, "relative_path", "") for v in (meta.storage_data or {}).values()} - {""})


def load_model(path: str | Path, dtype: torch.dtype) -> Any:
    """A causal LM from ``path``: ``from_pretrained``, or, for a sharded checkpoint's policy folder
    (a config without weights), built from its config -- its weights come from :func:`load_policy`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    if (
        p.is_dir()
        and (p / "config.json").is_file()
        and not any(p.glob("*.safetensors"))
        and is_sharded_checkpoint(p.parent.parent)
    ):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(p)), dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def load_policy(checkpoint: str | Path, policy: str, model: Any, optimizer: torch.optim.Optimizer | None) -> None:
    """Load ``policy``'s weights (and optimizer state) from the DCP shards into ``model``: sharded
    under FSDP (a collective, every rank), or whole in one process (DCP reshards either way).

    Raises:
        ConfigError: the shards do not load (naming the checkpoint).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    no_dist = current().world_size == 1
    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
    try:
        if optimizer is None:
            msd = get_model_state_dict(model)
            dcp.load({"model": msd}, checkpoint_id=str(dcp_path(checkpoint, policy)), no_dist=no_dist)
            set_model_state_dict(model, msd)
            return
        msd, osd = get_state_dict(model, optimizer)  # initializes the optimizer's state (a zero-lr step)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(dcp_path(checkpoint, policy)), no_dist=no_dist)
        set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        raise ConfigError.at(
            str(origin(checkpoint)),
            f"the sharded weights of policy {policy!r} do not load ({type(exc).__name__}: {str(exc)[:300]})",
            fix="resume from the run folder: --resume falls back to the previous good checkpoint",
        ) from None


# --------------------------------------------------------------------------- one process: verify, consolidate


def _tensor_keys(path: Path, prefix: str = "model.") -> dict[str, Any]:
    """``{name: TensorStorageMetadata}`` of the model tensors in a DCP checkpoint."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(path)).read_metadata()
    return {
        k[len(prefix) :]: v
        for k, v in meta.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }


def read_tensors(path: str | Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Full tensors ``names`` of a DCP checkpoint's model, read in this process (no group)."""
    import torch.distributed.checkpoint as dcp

    keys = _tensor_keys(Path(path))
    out = {n: torch.empty(tuple(keys[n].size), dtype=keys[n].properties.dtype) for n in names}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": out}, checkpoint_id=str(path), no_dist=True)
    return out


def iter_tensors(path: str | Path, batch_bytes: int = 256 << 20) -> Iterator[tuple[str, torch.Tensor]]:
    """Every model tensor of a DCP checkpoint, read ``batch_bytes`` at a time."""
    keys = _tensor_keys(Path(path))
    batch: list[str] = []
    size = 0
    for name, meta in keys.items():
        n = math.prod(meta.size) * meta.properties.dtype.itemsize
        if batch and size + n > batch_bytes:
            yield from read_tensors(path, batch).items()
            batch, size = [], 0
        batch.append(name)
        size += n
    if batch:
        yield from read_tensors(path, batch).items()


def check_weights(checkpoint: str | Path, policy: str) -> str | None:
    """Why ``policy``'s sharded weights cannot be trusted (a tensor that does not read or is not
    finite), or None."""
    path = dcp_path(checkpoint, policy)
    try:
        for name, t in iter_tensors(path):
            if t.is_floating_point() and not torch.isfinite(t).all():
                return f"{DCP_DIR}/{policy}: weight {name} is not finite"
    except Exception as exc:  # DCP raises its own error types (CheckpointException) for damaged shards
        return f"{DCP_DIR}/{policy} does not load ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def consolidate(checkpoint: str | Path, policy: str, out: str | Path, *, shard_bytes: int = 1 << 30) -> Path:
    """Write ``policy`` of ``checkpoint`` (sharded or not) as a ``save_pretrained`` folder with its
    tokenizer, reading one shard of at most ``shard_bytes`` at a time.

    Returns:
        ``out``.
    Raises:
        ConfigError: the checkpoint has no such policy.
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    src, out = policy_path(checkpoint, policy), Path(out)
    if not src.is_dir():
        have = (
            sorted(p.name for p in (Path(checkpoint) / "policies").iterdir())
            if (Path(checkpoint) / "policies").is_dir()
            else []
        )
        raise ConfigError.at(
            str(origin(checkpoint)),
            f"no policy {policy!r} in this checkpoint (it has {have})",
            fix=f"choose one of {have} with --policy",
        )
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # config, tokenizer (and, in an unsharded checkpoint, the weights themselves)
        if f.is_file():
            shutil.copyfile(f, out / f.name)
    if not is_sharded_checkpoint(checkpoint):
        return out
    with torch.device("meta"):  # the names save_pretrained writes: each tied parameter once
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(src)))
    seen: set[int] = set()
    names = []
    for name, t in skeleton.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            names.append(name)
    keys = _tensor_keys(dcp_path(checkpoint, policy))
    missing = [n for n in names if n not in keys]
    if missing:
        raise ConfigError.at(
            str(dcp_path(checkpoint, policy)),
            f"the shards lack weights {missing[:5]}",
            fix="consolidate another checkpoint (--step N)",
        )
    groups: list[list[str]] = []
    size = 0
    for n in names:
        b = math.prod(keys[n].size) * keys[n].properties.dtype.itemsize
        if groups and size + b <= shard_bytes:
            groups[-1].append(n)
            size += b
        else:
            groups.append([n])
            size = b
    files = (
        ["model.safetensors"]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    weight_map, total = {}, 0
    for fname, group in zip(files, groups):
        tensors = read_tensors(dcp_path(checkpoint, policy), group)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({n: fname for n in group})
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / fname), metadata={"format": "pt"})
    if len(groups) > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    return out
