"""Trainer stage, checkpoints: the ``full`` format -- each policy whole, in one process.

Consumes each trained policy's model, tokenizer, optimizer and scheduler (one process, or rank 0
of a ``ddp`` job, whose replicas are equal); produces, inside the folder ``layout.begin`` made::

    policies/<policy>/            model (save_pretrained, safetensors) + tokenizer
    optim/<policy>.safetensors    optimizer tensors (Adam moments, step counters)
    optim/<policy>.json           optimizer param groups + scheduler state

and reads them back on resume (the models themselves are loaded by the policies stage from
``layout.policy_path``, ``from_pretrained``). A model with a non-finite parameter is never saved.
No pickle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, save_file

from srpo_graph.train.checkpoint.layout import LoopState, begin, failed, finish_checkpoint, policy_path

NAME = "full"


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


def save_checkpoint(
    run_dir: str | Path,
    state: LoopState,
    *,
    models: Mapping[str, Any],
    tokenizers: Mapping[str, Any],
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    keep_last: int = 2,
) -> Path:
    """Write ``run_dir/checkpoints/step_{state.step}`` atomically; prune to ``keep_last``.

    Args:
        run_dir: the run folder.
        state: step, cursor and counters to restore.
        models, tokenizers, optimizers, schedulers: per policy name.
        keep_last: complete checkpoints kept (the newest).
    Returns:
        The checkpoint folder.
    Raises:
        ValueError: a model has a non-finite parameter (a corrupted model is never saved).
        OSError: the disk filled up (``ENOSPC``; nothing half-written is left).
    """
    for name, model in models.items():
        for pname, p in model.named_parameters():
            if not torch.isfinite(p).all():
                raise ValueError(f"refusing to checkpoint policy {name!r}: parameter {pname} is not finite")
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{state.step}"
    tmp = root / f".tmp-step_{state.step}-{os.getpid()}"
    try:  # a failure (disk full, Ctrl-C) leaves no half-written folder taking space
        tmp = begin(run_dir, state.step, os.getpid())
        for name, model in models.items():
            model.save_pretrained(policy_path(tmp, name), safe_serialization=True)
            tokenizers[name].save_pretrained(policy_path(tmp, name))
            tensors, meta = _optimizer_to_files(optimizers[name].state_dict())
            save_file(tensors, tmp / "optim" / f"{name}.safetensors")
            meta["scheduler"] = schedulers[name].state_dict() if name in schedulers else None
            (tmp / "optim" / f"{name}.json").write_text(json.dumps(meta))
    except BaseException as exc:
        failed(exc, tmp, root, final)
    return finish_checkpoint(run_dir, tmp, state, sorted(models), keep_last=keep_last)


def holds(checkpoint: str | Path, policy: str) -> bool:
    """Whether ``policy`` of ``checkpoint`` is in this format (the fallback of ``checkpointer.format_of``)."""
    return True


def check_weights(checkpoint: str | Path, policy: str) -> str | None:
    """Why ``policy``'s weights cannot be trusted (none, a file that does not load, a weight that is
    not finite), or None. Call after ``layout.verify_files``."""
    ck = Path(checkpoint)
    weights = sorted(policy_path(ck, policy).glob("*.safetensors"))
    if not weights:
        return f"policy {policy!r} has no weights (policies/{policy}/*.safetensors)"
    for wpath in weights:
        try:
            tensors = load_file(wpath)
        except Exception as exc:  # safetensors raises its own error types for damaged headers
            return f"{wpath.relative_to(ck)} does not load ({type(exc).__name__}: {exc})"
        for tname, t in tensors.items():
            if t.is_floating_point() and not torch.isfinite(t).all():
                return f"{wpath.relative_to(ck)}: weight {tname} is not finite"
    return None


def load_optimizer(checkpoint: str | Path, policy: str, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    """Load ``policy``'s optimizer state (``optim/<policy>.safetensors`` + ``meta``, its json)."""
    tensors = load_file(Path(checkpoint) / "optim" / f"{policy}.safetensors")
    optimizer.load_state_dict(_optimizer_from_files(tensors, meta))
