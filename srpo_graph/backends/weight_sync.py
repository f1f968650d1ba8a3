"""Backends stage: weights to SGLang servers over a process group (gloo on CPU, NCCL on GPU).

Consumes a model's named tensors (an ``nn.Module``, or any iterable of ``(name, tensor)`` pairs
produced bucket by bucket, e.g. FSDP shards gathered one bucket at a time) and an SGLang worker
URL; produces nothing but the worker's new weights and weight version.

The wire protocol (SGLang 0.5.x, ``entrypoints/http_server.py``; checked against the real CPU
server of ``shared/sglang-cpu``):

1. once per worker: ``POST /init_weights_update_group {master_address, master_port,
   rank_offset: 1, world_size: 1 + tp, group_name, backend}`` while this process -- rank 0 of
   the group, the master of its TCP store -- joins the same group (:func:`join_group`);
2. per sync: ``POST /begin_weight_update``; per bucket ``POST /update_weights_from_distributed
   {names, dtypes, shapes, group_name, weight_version, load_format: "flattened_bucket",
   flush_cache}`` while rank 0 broadcasts the bucket (one flat byte tensor, the tensors' bytes back
   to back, which is what SGLang's ``FlattenedTensorBucket`` reads); ``POST /end_weight_update``.
   The last bucket asks the server to flush its prefix cache (Note [The update flushes the cache]).

Note [A broadcast never waits for ever]: a broadcast whose receiver never comes (the server
refused the request, died, or stalls) would block rank 0 until the group's timeout, and a
blocking ``broadcast`` cannot be cancelled. So the broadcast is started asynchronously and
rank 0 polls both ends: the HTTP answer (a refusal ends the sync at once, naming the worker and
its message) and the broadcast's completion, against one deadline (``timeout``). A group that
failed mid-update is marked broken and a new one (new name, new port) is made at the next sync.
Every HTTP call has the same deadline.

Note [The update flushes the cache]
    After new weights the server's prefix cache holds KV of the old ones: it must be flushed. The
    update routes flush it themselves when asked (``flush_cache: true``), without the allocator's
    cache (``torch_empty_cache: false``, SGLang's default there): ~10 ms on the CPU server. The
    ``/flush_cache`` route always empties that cache too, which on CPU is a ``gc.collect()`` of
    the scheduler's heap: ~0.45 s a sync on the 2-core CI machine (a training step's whole sync
    took longer than the update itself), measured against the real server. So the update asks
    (the disk update; the last bucket of a streamed one), and ``/flush_cache?timeout=T`` is kept
    for the one case it is for: SGLang loads the weights but refuses its own flush while requests
    are still running or queued, answering HTTP 400 with :data:`UNFLUSHED` in its message
    (0.5.23, ``flush_cache_after_weight_update``); the caller then waits for the server to be idle
    and flushes (``SGLangBackend._flush_cache``). Any other refusal is an error, as before.
"""

from __future__ import annotations

import socket
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Sequence
from urllib.parse import urlparse

import torch

from srpo_graph.backends.ports import free_port
from srpo_graph.errors import BackendError

UNFLUSHED = "the cache was not flushed"
"""What SGLang's refusal says when an update loaded the weights but did not flush the cache
(Note [The update flushes the cache])."""

Post = Callable[[str, str, "dict[str, Any] | None", float], tuple[int, Any]]
"""``post(worker, route, payload, timeout) -> (HTTP status, decoded JSON answer or text)``; a
``None`` payload is a GET."""


def http_call(worker: str, route: str, payload: dict[str, Any] | None, timeout: float) -> tuple[int, Any]:
    """One control call to an SGLang worker with a deadline (:data:`Post`).

    Raises:
        BackendError: no answer within ``timeout`` seconds, or no connection (naming the URL).
    """
    import json

    import httpx

    from srpo_graph.backends import bounded_http

    url = f"{worker}{route}"
    try:
        with bounded_http.client(concurrency=1) as client:
            resp = bounded_http.call(client, "GET" if payload is None else "POST", url, json=payload, timeout=timeout,
                                     max_bytes=bounded_http.CONTROL_LIMIT, why=f"the route {route}")
    except bounded_http.AnswerTimeout:
        raise BackendError(f"sglang: {url} did not answer within {timeout:g}s") from None
    except bounded_http.AnswerTooLarge as exc:
        raise BackendError(f"sglang: {exc}") from None
    except httpx.HTTPError as exc:
        raise BackendError(f"sglang: {url}: {type(exc).__name__}: {exc} (did the server die?)") from None
    try:
        return resp.status, json.loads(resp.body)
    except ValueError:
        return resp.status, resp.text

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "half": torch.float16,
           "float": torch.float32}


def address_towards(url: str) -> str:
    """This machine's address as seen from ``url``'s host: the local end of a route to it
    (no packet is sent). ``127.0.0.1`` for a server on this machine.

    >>> address_towards("http://127.0.0.1:30000")
    '127.0.0.1'
    """
    host = urlparse(url).hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return str(s.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def named_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s weights as SGLang's loaders name them (the names ``save_pretrained`` writes):
    the state dict, each storage once (a tied ``lm_head`` is the embedding, sent once), DTensor
    shards gathered one tensor at a time (a collective under FSDP: every rank must iterate).
    An iterable of pairs is passed through."""
    if not isinstance(model, torch.nn.Module):
        yield from model
        return
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        full = t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP2: gather this tensor only
        key = full.untyped_storage().data_ptr() if full.numel() else id(full)
        if key in seen and full.numel():
            continue
        seen.add(key)
        yield name, full.detach()


def buckets(pairs: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, dtype: torch.dtype | None
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``pairs`` into lists of at most ``bucket_bytes`` (a larger tensor is a bucket of its
    own), cast to ``dtype`` (None: as they are), in order.

    >>> ts = [(f"w{i}", torch.zeros(10)) for i in range(5)]
    >>> [[n for n, _ in b] for b in buckets(ts, 80, None)]
    [['w0', 'w1'], ['w2', 'w3'], ['w4']]
    """
    return (bucket for bucket, _ in marked_buckets(pairs, bucket_bytes, dtype))


def marked_buckets(pairs: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, dtype: torch.dtype | None
                   ) -> Iterator[tuple[list[tuple[str, torch.Tensor]], bool]]:
    """:func:`buckets`, each with whether it is the last. That is known without holding a second
    bucket: a bucket is yielded when the next tensor (already in hand) does not fit, the last when
    the pairs end.

    >>> ts = [(f"w{i}", torch.zeros(10)) for i in range(5)]
    >>> [([n for n, _ in b], last) for b, last in marked_buckets(ts, 80, None)]
    [(['w0', 'w1'], False), (['w2', 'w3'], False), (['w4'], True)]
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in pairs:
        t = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket, False
            bucket, size = [], 0
        bucket.append((name, t.contiguous()))
        size += n
    if bucket:
        yield bucket, True


def flatten(bucket: Sequence[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """The bucket's tensors' bytes back to back, one uint8 tensor (SGLang's flattened bucket);
    a bucket of one (contiguous) tensor is a view of it, not a copy."""
    if len(bucket) == 1:
        return bucket[0][1].reshape(-1).view(torch.uint8)
    return torch.cat([t.reshape(-1).view(torch.uint8) for _, t in bucket])


def join_group(master_address: str, master_port: int, world_size: int, group_name: str, backend: str,
               timeout: float) -> Any:
    """Join a new process group as rank 0, the master of its TCP store, the way SGLang's
    ``init_custom_process_group`` makes the server's end (the store prefixed by the group name,
    a group outside torch's default group, so a trainer's DDP/FSDP group is untouched).

    Raises:
        BackendError: the other ranks did not join within ``timeout`` seconds.
    """
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    try:
        store = torch.distributed.TCPStore(master_address, master_port, world_size, is_master=True,
                                           timeout=timedelta(seconds=timeout), wait_for_workers=False)
        helper: Any = _new_process_group_helper  # private torch API, as SGLang's init_custom_process_group uses it
        pg, _ = helper(world_size, 0, [], Backend(backend), PrefixStore(group_name, store), group_name=group_name,
                       backend_options=None, timeout=timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as exc:
        raise BackendError(f"sglang: cannot create the weight-update group {group_name!r} on "
                           f"{master_address}:{master_port} ({type(exc).__name__}: {exc})") from None
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    from srpo_graph import exiting

    exiting.joined_process_group()  # Note [A process in a group ends without finalizing] (exiting.py)
    return pg


@dataclass
class _Group:
    name: str
    pg: Any
    broken: bool = False


class DistributedSync:
    """Streams weights to SGLang workers over one weight-update group per worker.

    Args:
        post: the HTTP call (:data:`Post`, default :func:`http_call`): every call has a deadline.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPU): the same code path.
        bucket_bytes: most bytes broadcast at once (one flattened bucket).
        timeout: seconds for one group's creation, and for one bucket (HTTP answer and broadcast).
        master_address: the address the servers reach this process at (default: the local end
            of a route to each worker; ``127.0.0.1`` for local servers).
        device: where tensors are broadcast from (``cuda`` for NCCL).
    """

    def __init__(
        self,
        post: Post = http_call,
        *,
        backend: str = "gloo",
        bucket_bytes: int = 256 << 20,
        timeout: float = 300.0,
        master_address: str | None = None,
        device: str = "cpu",
    ):
        self.post, self.backend, self.bucket_bytes = post, backend, int(bucket_bytes)
        self.timeout, self.master_address, self.device = float(timeout), master_address, device
        self.groups: dict[str, _Group] = {}
        self.dtypes: dict[str, torch.dtype | None] = {}  # what each worker computes in (sent so)
        self.stats = {"syncs": 0, "buckets": 0, "bytes": 0, "seconds": 0.0}
        self._http = ThreadPoolExecutor(max_workers=3, thread_name_prefix="srpo-weight-sync")

    # ------------------------------------------------------------------ groups

    def _call(self, worker: str, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        status, answer = self.post(worker, route, payload, self.timeout)
        if status == 404:
            raise BackendError.at(
                "sglang",
                f"{worker} has no {route} route (an SGLang without process-group weight sync?)",
                fix="set rollout.sglang.sync=disk",
            )
        if status >= 300 or not isinstance(answer, dict) or not answer.get("success", False):
            msg = answer.get("message") if isinstance(answer, dict) else answer
            raise BackendError(f"sglang: {worker}{route} refused: HTTP {status}: {msg}")
        return answer

    def server_info(self, worker: str) -> dict[str, Any]:
        """The worker's ``/server_info`` (``/get_server_info`` before SGLang 0.5.23); {} if neither."""
        for route in ("/server_info", "/get_server_info"):
            status, info = self.post(worker, route, None, self.timeout)
            if status < 300 and isinstance(info, dict):
                return info
        return {}

    def connect(self, worker: str) -> _Group:
        """The worker's group, made now if it has none or the last one broke."""
        group = self.groups.get(worker)
        if group is not None and not group.broken:
            return group
        info = self.server_info(worker)
        world = 1 + int(info.get("tp_size", 1) or 1) * int(info.get("pp_size", 1) or 1)  # rank 0 + its receivers
        self.dtypes[worker] = server_dtype(info)
        address = self.master_address or address_towards(worker)
        port = free_port("0.0.0.0" if address != "127.0.0.1" else "127.0.0.1")
        name = f"srpo-graph-{uuid.uuid4().hex[:12]}"  # a name can be used once per server process
        init: Future = self._http.submit(
            self._call,
            worker,
            "/init_weights_update_group",
            {
                "master_address": address,
                "master_port": port,
                "rank_offset": 1,
                "world_size": world,
                "group_name": name,
                "backend": self.backend,
            },
        )
        join: Future = self._http.submit(join_group, address, port, world, name, self.backend, self.timeout)
        deadline = time.monotonic() + self.timeout
        while not (init.done() and join.done()):  # a refusal ends the wait at once (the join then times out alone)
            if init.done() and init.exception() is not None:
                raise BackendError(f"{init.exception()} (creating the weight-update group)") from None
            if time.monotonic() > deadline:
                raise BackendError(
                    f"sglang: {worker} did not join the weight-update group on {address}:{port} "
                    f"within {self.timeout:g}s (can it reach this address? set "
                    "rollout.sglang.sync_address)"
                )
            time.sleep(0.01)
        pg = join.result()
        init.result()
        group = self.groups[worker] = _Group(name, pg)
        return group

    # ------------------------------------------------------------------ updates

    def _broadcast(self, worker: str, group: _Group, bucket: list[tuple[str, torch.Tensor]], version: int,
                   flush: bool = False) -> bool:
        """One bucket: the HTTP request and the broadcast together (Note [A broadcast never waits for ever]).
        ``flush``: the server flushes its prefix cache after loading it (Note [The update flushes the
        cache]). True when it was asked to and loaded the bucket but refused the flush."""
        flat = flatten(bucket).to(self.device)
        answer: Future = self._http.submit(
            self._call,
            worker,
            "/update_weights_from_distributed",
            {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": group.name,
                "flush_cache": flush,
                "torch_empty_cache": False,
                "weight_version": str(int(version)),
                "load_format": "flattened_bucket",
            },
        )
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        work = group.pg.broadcast([flat], opts)
        deadline = time.monotonic() + self.timeout
        def refused() -> BaseException | None:  # a refusal that is not the loaded-but-unflushed one
            exc = answer.exception() if answer.done() else None
            return None if exc is None or (flush and UNFLUSHED in str(exc)) else exc

        while not (work.is_completed() and answer.done()):
            if (exc := refused()) is not None:
                group.broken = True
                raise exc
            if time.monotonic() > deadline:
                group.broken = True
                what = "the broadcast" if not work.is_completed() else "its answer"
                raise BackendError(
                    f"sglang: {worker} did not take the weight update within {self.timeout:g}s "
                    f"(waiting for {what}; the server stalled or died)"
                )
            time.sleep(0.002)
        if not work.is_success():
            group.broken = True
            raise BackendError(f"sglang: the broadcast to {worker} failed: {work.exception()}")
        if (exc := refused()) is not None:
            group.broken = True
            raise exc
        self.stats["buckets"] += 1
        self.stats["bytes"] += flat.numel()
        return answer.exception() is not None

    def push(self, workers: Sequence[str], model: Any, version: int) -> list[str]:
        """Stream ``model``'s weights (see :func:`named_weights`) to every worker, tagged ``version``;
        the workers that loaded them but refused to flush their cache (requests queued: flush them
        once idle, Note [The update flushes the cache]).

        Buckets are made once and sent to each worker in turn, so an FSDP model is gathered once.

        Raises:
            BackendError: a worker that refuses, stalls or dies (named), never a hang.
        """
        t0 = time.perf_counter()
        groups = {w: self.connect(w) for w in workers}
        dtype = self.dtypes.get(workers[0])  # the workers of one policy serve one model
        if hasattr(model, "gather_dtype"):  # FSDP (fsdp_stream.GatheredModel): cast the shards, gather half the bytes
            model.gather_dtype = dtype
        for w in workers:
            self._begin(w)
        unflushed: list[str] = []
        try:
            for bucket, last in marked_buckets(named_weights(model), self.bucket_bytes, dtype):
                for w in workers:
                    if self._broadcast(w, groups[w], bucket, version, flush=last):
                        unflushed.append(w)
        finally:
            for w in workers:
                if not groups[w].broken:
                    self._call(w, "/end_weight_update", {})
        self.stats["syncs"] += 1
        self.stats["seconds"] += time.perf_counter() - t0
        return unflushed

    def _begin(self, worker: str) -> None:
        try:
            self._call(worker, "/begin_weight_update", {})
        except BackendError as exc:
            if "already open" not in str(exc):
                raise
            self._call(worker, "/end_weight_update", {})  # a session an earlier failed sync left open
            self._call(worker, "/begin_weight_update", {})

    def close(self) -> None:
        self._http.shutdown(wait=False, cancel_futures=True)


def server_dtype(info: dict[str, Any] | None) -> torch.dtype | None:
    """The dtype a server's ``/server_info`` says it runs in (None: unknown or ``auto``).

    >>> server_dtype({"dtype": "bfloat16"})
    torch.bfloat16
    >>> server_dtype({"dtype": "auto"}) is None
    True
    """
    return _DTYPES.get(str((info or {}).get("dtype", "auto")))
