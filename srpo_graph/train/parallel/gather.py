"""Trainer stage, parallel: an FSDP model's full weights, gathered one tensor at a time, never all at once.

Consumes a model sharded by ``fsdp.shard_model`` (FSDP2: every parameter a DTensor, 1/N on each
rank); produces :class:`GatheredModel`, which a weight sync consumes in place of a model:

* iterated, it yields ``(name, full tensor)`` in state-dict order, each gathered when it is
  reached (``DTensor.full_tensor()``, an all-gather on the default group, so under its deadline
  ``dist_timeout``) -- :class:`~srpo_graph.backends.weight_sync.DistributedSync` groups them into
  one size-bounded bucket, broadcasts it to the servers and drops it before the next;
* ``save_pretrained(path)`` writes a normal safetensors model folder (``model-0000i-of-0000N``
  + ``model.safetensors.index.json`` + ``config.json``), one shard of at most ``shard_bytes``
  gathered and written at a time (the disk route of an SGLang sync).

So neither route holds more than one bucket (or shard) of full tensors. A server that computes
in bf16 gets shards cast before they are gathered (``gather_dtype``, set by the consumer on rank 0
and broadcast to the others before the first gather): half the bytes gathered and held. A tied weight (embedding
and ``lm_head``) is one parameter: it is gathered and sent once, under its first name, as
``save_pretrained`` and SGLang's loaders expect.

Note [Every rank gathers]: the gathers are collectives. Only rank 0 talks to servers, yet every
rank must run the same gathers in the same order. ``train/sync.py``'s ``stream_to_backend`` runs on every
rank: rank 0 hands the :class:`GatheredModel` to its backend, the others (and rank 0, after the
backend returned or failed) :meth:`~GatheredModel.drain` what is left, so the gathers always
match even when the server refused the update halfway. Then one all-reduce tells every rank
whether rank 0's sync failed (each rank raises), so no rank waits for a peer that gave up.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import torch

from srpo_graph.errors import BackendError

DEFAULT_SHARD_BYTES = 1 << 30  # the disk route's safetensors shards (save_pretrained's default is 5 GB)


_DTYPE_CODES: list[torch.dtype | None] = [None, torch.bfloat16, torch.float16, torch.float32]


def _global_nbytes(t: torch.Tensor) -> int:
    return math.prod(t.shape) * t.element_size()  # a DTensor's shape and dtype are the full tensor's


class GatheredModel:
    """``model``'s full weights, gathered one tensor at a time (module docstring). One pass:
    iterate it (or :meth:`save_pretrained`, or :meth:`drain`) once per sync, on every rank.

    Args:
        model: an FSDP2-sharded (or plain) ``transformers`` model.
        shard_bytes: most bytes of one safetensors file :meth:`save_pretrained` writes.
    """

    def __init__(self, model: torch.nn.Module, shard_bytes: int = DEFAULT_SHARD_BYTES):
        self.model, self.shard_bytes = model, int(shard_bytes)
        seen: set[int] = set()
        self.plan: list[tuple[str, torch.Tensor]] = []  # (name, DTensor or plain tensor), each storage once
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) in seen:  # a tied weight: the same Parameter under a second name
                continue
            seen.add(id(t))
            self.plan.append((name, t))
        self.position = 0
        self.gather_dtype: torch.dtype | None = None  # set by the consumer (the server's dtype): shards cast first
        self.peak_bucket_bytes = 0  # largest shard save_pretrained held (measured, for the benchmark)

    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The sharded parameters (their ``device`` is where the gathers land)."""
        return self.model.parameters()

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        if self.gather_dtype is not None and t.is_floating_point():  # elementwise: the same as casting after
            t = t.detach().to(self.gather_dtype)
        full = t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP2: all-gather this tensor only
        return full.detach()

    def _agree_dtype(self) -> None:
        """Rank 0's ``gather_dtype`` on every rank (one broadcast before the first gather): only
        rank 0's consumer sets it, and an all-gather needs one dtype on all ranks."""
        import torch.distributed as tdist

        if not (tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1):
            return
        code = torch.tensor([_DTYPE_CODES.index(self.gather_dtype)], dtype=torch.int64)
        tdist.broadcast(code, src=0)  # under the default group's deadline (dist_timeout)
        self.gather_dtype = _DTYPE_CODES[int(code.item())]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.position == 0 and self.plan:
            self._agree_dtype()
        while self.position < len(self.plan):
            name, t = self.plan[self.position]
            self.position += 1
            yield name, self._gather(t)

    def drain(self) -> int:
        """Gather (and drop) every tensor not gathered yet: Note [Every rank gathers].

        Returns:
            How many were left.
        """
        left = len(self.plan) - self.position
        for _ in self:
            pass
        return left

    def shards(self) -> list[list[int]]:
        """The plan's indices grouped into files of at most ``shard_bytes`` (by full sizes, known
        before any gather, so the number of files is known before the first is written).

        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> GatheredModel(m, shard_bytes=80).shards()
        [[0, 1], [2, 3]]
        """
        out: list[list[int]] = []
        size = 0
        for i, (_, t) in enumerate(self.plan):
            n = _global_nbytes(t)
            if out and size + n <= self.shard_bytes:
                out[-1].append(i)
                size += n
            else:
                out.append([i])
                size = n
        return out

    def save_pretrained(self, path: str | Path, safe_serialization: bool = True, **_: Any) -> None:
        """Write a ``from_pretrained``-loadable folder, one shard gathered and written at a time.

        Raises:
            BackendError: this pass was already (partly) consumed.
        """
        from safetensors.torch import save_file

        if self.position:
            raise BackendError("fsdp: a gathered model can be consumed once per sync (it was already read)")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        groups = self.shards()
        names = ["model.safetensors"] if len(groups) == 1 else \
            [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
        weight_map: dict[str, str] = {}
        total = 0
        pairs = iter(self)
        for fname, group in zip(names, groups):
            tensors: dict[str, torch.Tensor] = {}
            for _i in group:
                name, full = next(pairs)
                tensors[name] = full.cpu().contiguous()
                weight_map[name] = fname
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            self.peak_bucket_bytes = max(self.peak_bucket_bytes, nbytes)
            total += nbytes
            save_file(tensors, str(path / fname), metadata={"format": "pt"})
            del tensors
        if len(groups) > 1:
            (path / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        if self.config is not None:
            self.config.save_pretrained(path)
        gen = getattr(self.model, "generation_config", None)
        if gen is not None and hasattr(gen, "save_pretrained"):
            gen.save_pretrained(path)
