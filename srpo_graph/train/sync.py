"""Trainer stage 3 of the loop, weight sync: after each update the new weights reach every backend that samples.

Consumes the trained policies' slots (``policies/``) after an update and the step number (the
weights' version); produces backends that sample from the new weights, each output tagged with
that version. One version per step: every policy moves together. There are three routes, chosen
by what the slot holds:

* **in process** (transformers): the backend samples from the trainer's own model, or under fsdp
  from rank 0's unsharded replica, refreshed here from the gathered full state dict (every rank
  joins the gather);
* **to a server or worker** (SGLang, the rollout worker): ``backend.sync_weights(model, version)``
  -- over a process group in flattened buckets, or through a weight folder on disk
  (``backends/weight_sync.py``, ``backends/sglang.py``; the worker: ``rollout/worker/``);
* **streaming FSDP** (a server backend under fsdp, no replica): :func:`stream_to_backend` hands the
  server a ``parallel.gather.GatheredModel`` that gathers one tensor at a time (Note [Every rank
  gathers] in ``parallel/gather.py``), so no rank holds a whole model.

The same call puts a resumed run's checkpoint weights on the backends before the first rollout.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from srpo_graph.errors import BackendError
from srpo_graph.train.parallel.collectives import all_reduce, current
from srpo_graph.train.parallel.fsdp import full_state_dict, is_sharded
from srpo_graph.train.parallel.gather import GatheredModel


def stream_to_backend(model: Any, backend: Any, version: int) -> None:
    """Hand ``model``'s weights to ``backend`` (rank 0; None elsewhere) as a :class:`GatheredModel`.
    A collective: every rank calls it (Note [Every rank gathers]).

    Raises:
        BackendError: rank 0's sync failed (on rank 0: its own error; elsewhere: one naming rank 0).
    """
    weights = GatheredModel(model)
    error: BaseException | None = None
    if backend is not None:
        try:
            backend.sync_weights(weights, version)
        except Exception as exc:  # the other ranks are in (or about to be in) the gathers: match them first
            error = exc
    weights.drain()
    failed = all_reduce(int(error is not None), "max", current())
    if error is not None:
        raise error
    if failed:
        raise BackendError(f"fsdp: rank 0's weight sync (version {version}) failed; see rank 0's output")


def sync_policy(slot: Any, version: int) -> None:
    """Give ``slot``'s backend (if any) the slot's current weights, tagged ``version``, by the route
    its model asks for (the module docstring). A collective under fsdp: every rank calls it."""
    slot.version = version
    model, replica, backend = slot.model, slot.replica, slot.backend
    if is_sharded(model) and slot.stream:
        stream_to_backend(model, backend, version)
        return
    if is_sharded(model):
        full = full_state_dict(model)
        if replica is not None:
            replica.load_state_dict(full)
    if backend is not None:
        backend.sync_weights(replica if replica is not None else model, version)


class Syncer:
    """Stage 5 of the loop: every trained policy's weights to its backend, one version per step."""

    def __init__(self, policies: Sequence[Any]) -> None:
        self.policies = list(policies)

    def sync(self, version: int) -> float:
        """Sync every policy at ``version``; the seconds it took."""
        t0 = time.perf_counter()
        for slot in self.policies:  # every policy's weights move together, so one version number per step
            sync_policy(slot, version)
        return time.perf_counter() - t0

    def restore(self, versions: dict[str, int], default: int) -> None:
        """A resumed run: each policy's checkpoint weights to its backend, at the version it had
        (``default``, the checkpoint's step, where none was recorded)."""
        for slot in self.policies:
            sync_policy(slot, int(versions.get(slot.name, default)))
