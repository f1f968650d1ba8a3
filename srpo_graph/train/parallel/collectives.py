"""Trainer stage, parallel: the process group and its collectives (torch.distributed; gloo on CPU, nccl on GPU).

Consumes the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``); produces a :class:`DistInfo` and the collective helpers the
loop uses (:class:`DistInfo` itself is ``job.py``'s, torch-free). It knows nothing about workflows or losses.

How data parallelism keeps the single-process result exactly (see Note [Global denominator]):

* every rank holds the step's whole list of episodes, so every rank compiles the same SetBatch:
  each rank samples its share of the tasks and the shares are all-gathered as JSON bytes
  (``train/rollout/ranks.py``), or rank 0 samples alone and broadcasts them (no pickle either way);
* every mini-batch's loss denominator is computed once on the *whole* mini-batch;
* each rank takes a contiguous shard of whole events (:func:`shard_sets`), computes its part of
  the loss divided by that global denominator and back-propagates;
* gradients are summed over ranks with ``all_reduce(SUM)`` (:func:`all_reduce_grads`), which
  equals the single-process gradient of the whole mini-batch up to float summation order. This
  is what ``DistributedDataParallel`` does with the loss scaled by the world size; doing it
  by hand keeps one code path for several policies and for ranks that hold no member of a
  policy. For models too large for one device, wrap each policy in FSDP instead (docs/gpu.md).

Note [Global denominator]: DDP averages gradients over ranks, which equals the global mean only
if every rank's loss is normalized by the same count and the shards are equal. Event shards are
not equal (sets differ in size), so we normalize by the global denominator and sum.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch

from srpo_graph import exiting
from srpo_graph.train.parallel.job import DistInfo


def init_distributed(device: str = "cpu", timeout: float = 600.0) -> DistInfo:
    """Join the process group ``torchrun`` prepared (a no-op when WORLD_SIZE is unset or 1).

    Args:
        device: ``cpu`` (gloo) or ``cuda`` (nccl for CUDA tensors, gloo for the CPU tensors of the
            byte collectives; each rank takes GPU ``LOCAL_RANK``).
        timeout: seconds any collective may wait for a rank (``dist_timeout``): a rank that died
            or stalls ends the others' collective with an error, never a hang.
    Returns:
        DistInfo.

    >>> init_distributed() if "WORLD_SIZE" not in os.environ else DistInfo()
    DistInfo(rank=0, world_size=1, local_rank=0)
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        # before the group exists: see Note [Group defaults captured at import]
        import torch.distributed._functional_collectives  # noqa: F401
        import torch.distributed.fsdp.sharded_grad_scaler  # noqa: F401
        import torch.distributed.nn.functional  # noqa: F401
        if device == "cuda":
            torch.cuda.set_device(local)
        from datetime import timedelta

        # on GPUs the byte collectives (episodes, configs, checkpoint files) still move CPU tensors:
        # NCCL for CUDA tensors, gloo for CPU ones, one group
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout))
        exiting.joined_process_group()  # Note [A process in a group ends without finalizing] (exiting.py)
    return DistInfo(rank=rank, world_size=world, local_rank=local)


# Note [Group defaults captured at import]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch.distributed.nn.functional declares `def all_reduce(tensor, ..., group=group.WORLD)` and
# nine more like it: a module imported after init_process_group keeps the default group in
# those defaults for good. torch._dynamo imports it, and so do transformers' modeling code,
# torch.distributed.checkpoint and fsdp, so loading a model after init did. Then
# destroy_process_group cannot free the group: its gloo worker threads outlive it, and one still
# releasing the last collective's work (a barrier holds the work before it, with the tensors
# Python made) needs the GIL while the interpreter finalizes, which aborts the process
# ("terminate called without an active exception", SIGABRT) after a run that succeeded; about
# 1 in 20 two-rank runs on 2 loaded cores. Imported before the group exists, those defaults are
# None, the group dies in destroy_process_group, and its threads are joined there, while the
# interpreter is whole. tests/train/test_train_ddp.py::test_shutdown_frees_the_process_group.
# The modules of torch.distributed that keep the group in a default or a module global are
# imported before init for that reason: nn.functional, _functional_collectives (FSDP's and
# DTensor's collectives) and fsdp.sharded_grad_scaler. (An FSDP two-rank run still aborted this
# way at exit, ~1 run in 3 on 2 loaded cores, with nn.functional alone imported first.)


def collective_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that lost a peer: it died (connection reset or closed) or
    did not come within the group's timeout (gloo and NCCL raise plain RuntimeErrors).

    >>> collective_failed(RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"))
    True
    >>> collective_failed(RuntimeError("shape mismatch"))
    False
    """
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return any(k in text for k in ("gloo", "NCCL", "Connection reset", "Connection closed", "timed out", "Timed out"))


def shutdown(info: DistInfo, *, barrier: bool = True) -> None:
    """Leave the process group (if this process joined one).

    Args:
        barrier: wait for every rank first (the normal end of a run). Without it a rank whose
            peer already tore down its gloo pairs can abort at exit ("terminate called without
            an active exception"). Pass False on an error path, where a peer may never arrive.
    """
    if info.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            if barrier:
                dist.barrier()
            dist.destroy_process_group()


def broadcast_bytes(data: bytes | None, info: DistInfo) -> bytes:
    """Rank 0's ``data`` on every rank (length first, then a uint8 tensor)."""
    if not info.enabled:
        assert data is not None
        return data
    import torch.distributed as dist

    size = torch.tensor([len(data) if info.is_main and data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    if info.is_main:
        buf = torch.frombuffer(bytearray(data or b""), dtype=torch.uint8)
    dist.broadcast(buf, src=0)
    return bytes(buf.numpy().tobytes())


def all_gather_bytes(data: bytes, info: DistInfo) -> list[bytes]:
    """Every rank's ``data``, in rank order, on every rank (lengths first, then one padded uint8
    tensor per rank). Its deadline is the group's (``dist_timeout``): a rank that died or stalls
    ends the others' call with an error (:func:`collective_failed`), never a hang."""
    if not info.enabled:
        return [data]
    import torch.distributed as dist

    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(info.world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(info.world_size)]
    dist.all_gather(bufs, buf)
    return [bytes(b[: int(s.item())].numpy().tobytes()) for b, s in zip(bufs, sizes)]


_OPS = ("sum", "max", "min")


def all_reduce(value: float, op: str, dist: DistInfo) -> float:
    """``value`` reduced over the ranks of the job with ``op`` (``sum``, ``max`` or ``min``), as a
    float64 (exact for integers below 2**53). One process: ``value``. Its deadline is the group's
    (``dist_timeout``): a rank that died or stalls ends the call with an error
    (:func:`collective_failed`), never a hang.

    >>> all_reduce(3, "max", DistInfo())
    3
    """
    if op not in _OPS:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(_OPS)}")
    if not dist.enabled:
        return value
    import torch.distributed as tdist

    t = torch.tensor([value], dtype=torch.float64)
    tdist.all_reduce(t, op={"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}[op])
    return float(t.item())


def all_reduce_vector(values: torch.Tensor, op: str, dist: DistInfo) -> torch.Tensor:
    """``values`` (a 1-d tensor, the same length on every rank) reduced elementwise over the ranks
    with ``op`` (``sum`` or ``max``; a minimum travels negated), as a CPU float64 copy; one
    collective, whatever its length, with the group's deadline like :func:`all_reduce`.

    >>> all_reduce_vector(torch.tensor([1.0, 2.0]), "sum", DistInfo()).tolist()
    [1.0, 2.0]
    """
    if op not in _OPS:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(_OPS)}")
    t = values.detach().to("cpu", torch.float64).reshape(-1).clone()
    if not dist.enabled:
        return t
    import torch.distributed as tdist

    tdist.all_reduce(t, op={"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}[op])
    return t


def current() -> DistInfo:
    """This process's place in the process group that is initialized now (one process: ``DistInfo()``),
    for code that runs inside a collective without being handed a :class:`DistInfo`.

    >>> current()
    DistInfo(rank=0, world_size=1, local_rank=0)
    """
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        return DistInfo(rank=tdist.get_rank(), world_size=tdist.get_world_size(),
                        local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo()


GRAD_BUCKET_ELEMS = 1 << 24  # 16M elements (64 MB in fp32) per all-reduce


def all_reduce_grads(params: Iterable[torch.nn.Parameter], info: DistInfo, bucket_elems: int | None = None) -> None:
    """Sum every parameter's gradient over ranks (a missing grad counts as zeros).

    Gradients travel in flat buckets of at most ``bucket_elems`` elements (like DDP's
    buckets), so the extra memory is one bucket, not a second copy of all gradients.
    """
    if not info.enabled:
        return
    import torch.distributed as dist

    bucket_elems = bucket_elems or GRAD_BUCKET_ELEMS
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    bucket: list[torch.Tensor] = []  # gradients (each has its parameter's shape)
    size = 0
    for g in grads + [None]:  # None flushes the last bucket
        if g is not None and (not bucket or (size + g.numel() <= bucket_elems and g.dtype == bucket[0].dtype
                                             and g.device == bucket[0].device)):
            bucket.append(g)
            size += g.numel()
            continue
        flat = torch.cat([q.reshape(-1) for q in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for q in bucket:
            n = q.numel()
            q.copy_(flat[offset : offset + n].view_as(q))
            offset += n
        if g is not None:
            bucket, size = [g], g.numel()


def shard_sets(set_tokens: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Contiguous shard of whole sets for ``rank``, balanced by tokens.

    >>> [shard_sets([5, 1, 1, 1, 4], r, 2) for r in range(2)]
    [[0, 1], [2, 3, 4]]
    >>> shard_sets([3, 3], 0, 1)
    [0, 1]
    """
    total = sum(set_tokens)
    if world_size <= 1:
        return list(range(len(set_tokens)))
    out, used = [], 0
    for i, n in enumerate(set_tokens):
        mid = used + n / 2  # a set goes to the rank whose token range holds its midpoint
        owner = min(int(mid * world_size / total), world_size - 1) if total else i % world_size
        if owner == rank:
            out.append(i)
        used += n
    return out
