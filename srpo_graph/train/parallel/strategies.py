"""Trainer stage, parallel: ``STRATEGIES``, how the update runs on one or many processes, one table.

A strategy answers the few questions the update loop (``learn/update.py``) asks that depend on the
distribution of the work; the loop itself has no ``if sharded`` left:

* ``shard(mb)``: this rank's whole events of a mini-batch;
* ``micro_batches(local)``: the micro-batches to run (FSDP pads with ``None`` so every rank runs
  the same number of forwards, Note [Matching forwards] in ``fsdp.py``);
* ``begin(models, active, i, n)``: the models to run micro-batch i of n with, and a plan;
* ``backward(loss, plan)`` / ``backward_padding(plan)``: back-propagate a micro-batch's loss
  (or a zero-weight padding forward); each returns the padding forwards it ran;
* ``reduce_grads(params)``: make the gradients global before clipping (DDP's all-reduce;
  FSDP reduce-scatters inside the last backward);
* ``after_grads(models)`` and ``finish(result)``.

Adding a strategy is one class and one row here; ``TrainConfig.strategy``'s choices are this
table's keys. ``single`` is what every strategy becomes in one process.

Note [A table without torch]: the configuration checks ``strategy`` against this table's keys, and
the process that checks it first is often one that never runs a model: the launcher of ``srpo-graph
train --nproc N``, which only starts torchrun. Importing this module must not import torch (~1 s of
CPU and ~150 MB per such process), so torch, the collectives and FSDP are imported where a strategy
first runs, inside a rank (``tests/e2e/test_train_cli.py`` holds the launcher to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from srpo_graph.train.parallel.job import DistInfo

if TYPE_CHECKING:  # Note [A table without torch]
    import torch

    from srpo_graph.compiler.setbatch import SetBatch


def _collectives():  # imported at first use: Note [A table without torch]
    from srpo_graph.train.parallel import collectives

    return collectives


def _fsdp():
    from srpo_graph.train.parallel import fsdp

    return fsdp


class Single:
    """One process: the whole mini-batch, plain backward, nothing to reduce."""

    name = "single"

    def __init__(self, dist: DistInfo):
        self.dist = dist

    def shard(self, mb: SetBatch) -> SetBatch:
        return mb

    def micro_batches(self, local: SetBatch) -> list[SetBatch | None]:
        return list(local.micro_batches())

    def begin(self, models: Sequence[torch.nn.Module], active: list[int], i: int, n: int) -> tuple[Sequence[Any], Any]:
        return models, None

    def backward(self, loss: torch.Tensor, plan: Any) -> int:
        loss.backward()
        return 0

    def backward_padding(self, plan: Any) -> int:
        return 0

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        return None

    def after_grads(self, models: Sequence[torch.nn.Module]) -> None:
        return None

    def finish(self, padding_forwards: int) -> int:
        return padding_forwards


class DataParallel(Single):
    """DDP's arithmetic: each rank back-propagates its shard of whole events (balanced by tokens);
    gradients are all-reduced in buckets before clipping (``collectives.py``; the loss
    denominator is global, so the sum over ranks is the one-process gradient)."""

    name = "ddp"

    def shard(self, mb: SetBatch) -> SetBatch:
        shard = _collectives().shard_sets(mb.set_tokens.tolist(), self.dist.rank, self.dist.world_size)
        return mb.select_sets(shard).with_(set_episode_events=mb.set_episode_events[shard])

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        _collectives().all_reduce_grads(params, self.dist)


class FullySharded(DataParallel):
    """FSDP2 (``fsdp.py``): every rank runs the same forwards in the same order (padding ranks with
    fewer micro-batches with zero-weight forwards); the reduce-scatter runs in the last
    micro-batch's backward; FSDP averages over ranks, so losses are scaled back to the sum."""

    name = "fsdp"

    def micro_batches(self, local: SetBatch) -> list[SetBatch | None]:
        micros: list[SetBatch | None] = list(local.micro_batches())
        return micros + [None] * (int(_collectives().all_reduce(len(micros), "max", self.dist)) - len(micros))

    def begin(self, models, active, i, n):
        _fsdp().set_gradient_sync(models, i == n - 1)
        return _fsdp().ordered_models(models, active)

    def backward(self, loss: torch.Tensor, plan: Any) -> int:
        zero = plan.finish()
        (loss * _fsdp().loss_scale(self.dist) + (zero if zero is not None else 0.0)).backward()
        return len(plan.extra)

    def backward_padding(self, plan: Any) -> int:
        zero = plan.finish()
        if zero is not None:
            zero.backward()
        return len(plan.extra)

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        return None  # reduce-scattered in the last backward

    def after_grads(self, models: Sequence[torch.nn.Module]) -> None:
        _fsdp().reshard_all(models)  # the optimizer steps the sharded parameters

    def finish(self, padding_forwards: int) -> int:
        return int(_collectives().all_reduce(padding_forwards, "sum", self.dist))


STRATEGIES: dict[str, type[Single]] = {"ddp": DataParallel, "fsdp": FullySharded}


def make_strategy(name: str, dist: DistInfo) -> Single:
    """The strategy ``name`` (a key of ``STRATEGIES``); in one process every strategy is ``single``.

    >>> make_strategy("fsdp", DistInfo()).name
    'single'
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name](dist) if dist.enabled else Single(dist)
