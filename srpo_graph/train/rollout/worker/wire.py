"""Trainer stage, rollout worker: the wire between the trainer and its rollout worker process.

Two channels, neither of them pickle:

* control: one local TCP connection carrying frames ``[8-byte header length][8-byte payload
  length][JSON header][payload bytes]``. Requests, episodes (JSON lines in the payload) and
  statistics (JSON) cross here. Every read on the trainer's side has a deadline and notices a
  worker that died (:func:`recv`), so no wait is unbounded.
* weights: a two-rank gloo process group (the trainer rank 0, the worker rank 1) made the way
  ``backends/weight_sync.py`` makes the SGLang servers' group (:func:`join_group` there for
  rank 0, :func:`join_as_receiver` here for rank 1). Tensors cross as that module's flattened
  buckets (its :func:`~srpo_graph.backends.weight_sync.buckets` and
  :func:`~srpo_graph.backends.weight_sync.flatten`); :func:`unflatten` is the receiving half.

It knows nothing about workflows or models.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch

from srpo_graph.errors import BackendError


class WorkerError(BackendError):
    """The rollout worker failed, died, stalled or broke the wire (there is no server to check)."""

    remedy = "check the rollout worker's output above (a process of its own; rollout.worker_timeout bounds each wait)"

_HEAD = struct.Struct(">QQ")
_MAX_HEADER = 64 << 20  # a header is small JSON; anything larger is a broken stream

DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                                     torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool)}


def send(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    """One frame: ``header`` as JSON and ``payload`` as raw bytes."""
    data = json.dumps(header).encode()
    sock.sendall(_HEAD.pack(len(data), len(payload)) + data)
    if payload:
        sock.sendall(payload)


def _read_exact(sock: socket.socket, n: int, deadline: float | None, why_dead: Callable[[], str | None],
                what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{what} did not answer within the deadline (rollout.worker_timeout)")
            sock.settimeout(min(0.5, left))
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except socket.timeout:
            dead = why_dead()
            if dead is not None:
                raise WorkerError(f"{what} {dead}") from None
            continue
        except OSError as exc:
            raise WorkerError(f"{what}: connection lost ({exc})") from None
        if not chunk:
            dead = why_dead()
            raise WorkerError(f"{what} closed the connection" + (f" ({dead})" if dead else ""))
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket, *, deadline: float | None = None, why_dead: Callable[[], str | None] = lambda: None,
         what: str = "the peer") -> tuple[dict[str, Any], bytes]:
    """The next frame: (header, payload).

    Args:
        deadline: ``time.monotonic()`` past which the wait fails (None: wait as long as the peer lives).
        why_dead: a check run while waiting: None while the peer lives, else why it does not.
        what: the peer, named in errors.
    Raises:
        BackendError: past the deadline, the peer died or closed the connection, a broken frame.
    """
    head_len, payload_len = _HEAD.unpack(_read_exact(sock, _HEAD.size, deadline, why_dead, what))
    if head_len > _MAX_HEADER:
        raise WorkerError(f"{what} sent a broken frame (header of {head_len} bytes)")
    header = json.loads(_read_exact(sock, head_len, deadline, why_dead, what))
    payload = _read_exact(sock, payload_len, deadline, why_dead, what) if payload_len else b""
    return header, payload


def bucket_header(bucket: Sequence[tuple[str, torch.Tensor]], nbytes: int) -> dict[str, Any]:
    """What the receiver needs to cut a flattened bucket back into tensors."""
    return {"names": [n for n, _ in bucket], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket], "nbytes": int(nbytes)}


def unflatten(flat: torch.Tensor, header: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a flattened bucket (``weight_sync.flatten``'s inverse), views into ``flat``.

    >>> from srpo_graph.backends.weight_sync import flatten
    >>> b = [("a", torch.arange(3.0)), ("b", torch.ones(2, 2, dtype=torch.bfloat16))]
    >>> out = unflatten(flatten(b), bucket_header(b, 0))
    >>> [(n, t.dtype, tuple(t.shape)) for n, t in out], out[0][1].tolist()
    ([('a', torch.float32, (3,)), ('b', torch.bfloat16, (2, 2))], [0.0, 1.0, 2.0])
    """
    out = []
    offset = 0
    for name, dt, shape in zip(header["names"], header["dtypes"], header["shapes"]):
        dtype = DTYPES[dt]
        numel = 1
        for d in shape:
            numel *= int(d)
        n = numel * torch.empty((), dtype=dtype).element_size()
        out.append((name, flat[offset:offset + n].view(dtype).reshape(shape)))
        offset += n
    return out


def join_as_receiver(master_address: str, master_port: int, group_name: str, timeout: float) -> Any:
    """Join the trainer's two-rank weight group as rank 1 (the trainer, rank 0, made it with
    ``weight_sync.join_group``): the same private torch helper SGLang's ``init_custom_process_group``
    uses, so a default process group is neither needed nor touched."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    store = torch.distributed.TCPStore(master_address, master_port, 2, is_master=False,
                                       timeout=timedelta(seconds=timeout))
    helper: Any = _new_process_group_helper
    pg, _ = helper(2, 1, [], Backend("gloo"), PrefixStore(group_name, store), group_name=group_name,
                   backend_options=None, timeout=timedelta(seconds=timeout))
    _world.pg_group_ranks[pg] = {0: 0, 1: 1}
    from srpo_graph import exiting

    exiting.joined_process_group()  # Note [A process in a group ends without finalizing] (exiting.py)
    return pg


def broadcast_options() -> Any:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    return opts
