"""Trainer stage, rollout worker: sampling for the transformers backend in a process of its own.

With ``rollout.worker = true`` the trainer's policies are not sampled in the trainer's process
(where a rollout cannot overlap an update that mutates the very same model objects) but by a
:class:`RolloutWorker`: a child process (``main.py``) holding its own copy of every policy,
which runs whole rollout batches with the executor on request. What crosses (``wire.py``):

* requests, episodes (JSON lines) and statistics (JSON) over a local TCP connection -- no pickle;
* weights over a two-rank gloo group, the trainer rank 0, in ``backends/weight_sync.py``'s
  flattened buckets (the same code that streams to SGLang servers). A full policy sends every
  weight; a LoRA adapter policy sends its adapter matrices only (its frozen base never changes).

The trainer's slots hold a :class:`WorkerPolicy` as their backend, so the sync stage (``train/sync.py``) -- after
each update and at resume, from the checkpoint's weights -- pushes weights through the same sync
interface as every other backend; ``lockstep.rollout`` sends the batch to the worker.

Deadlines: starting, each rollout batch and each weight push wait at most
``rollout.worker_timeout`` seconds, and every wait notices a worker that died (named, with its
exit code). A worker that failed a wait is stopped: later calls fail at once. The worker exits
when the trainer does, however it ends (``worker_main._watch_parent``).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping, Sequence

import torch

from srpo_graph.backends.ports import free_port
from srpo_graph.backends.weight_sync import buckets, flatten, join_group, named_weights
from srpo_graph.errors import BackendError
from srpo_graph.runtime.executor import RunResult, RunStats
from srpo_graph.runtime.trace import Episode
from srpo_graph.train.rollout.worker.main import TOKEN_ENV
from srpo_graph.train.rollout.worker.wire import WorkerError, broadcast_options, bucket_header, recv, send

BUCKET_BYTES = 64 << 20


class WorkerRefused(WorkerError):
    """The worker answered with an error (it still serves); any other failure stops it."""


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def weight_pairs(model: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """What a push sends of ``model``: a LoRA adapter's own matrices (``lora.AdapterModel``), nothing
    for a frozen adapter base, every weight of a full model (``weight_sync.named_weights``)."""
    if getattr(model, "shared_base", None) is not None:
        if model.lora_name is None:
            return ()
        return ((n, p.detach()) for n, p in model.named_parameters())
    return named_weights(model)


class RolloutWorker:
    """A rollout worker process with its own copy of each policy of ``wf``.

    Args:
        wf: the workflow as the run trains it (models overridden).
        device, dtype: where and in what the worker's models run (as the trainer's).
        max_batch_size: the transformers backend's rows per chunk.
        timeout: seconds any one wait may take (start, a rollout batch, a weight push).
    Raises:
        BackendError: the worker did not start, did not load its models, or did not join the
            weight group within ``timeout`` (naming the worker and why).
    """

    def __init__(self, wf: Any, *, device: str = "cpu", dtype: str = "float32", max_batch_size: int = 256,
                 timeout: float = 1800.0):
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._broken: str | None = None
        self.stats = {"pushes": 0, "tensors": 0, "bytes": 0, "push_seconds": 0.0, "runs": 0, "run_seconds": 0.0}
        token = secrets.token_hex(16)
        server = socket.create_server(("127.0.0.1", 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "srpo_graph.train.rollout.worker.main", "--port", str(server.getsockname()[1])],
            stdin=subprocess.PIPE, env={**os.environ, TOKEN_ENV: token}, start_new_session=True)
        self.name = f"rollout worker (pid {self.proc.pid})"
        self._finalizer = weakref.finalize(self, _reap, self.proc)
        self.pg: Any = None
        try:
            deadline = time.monotonic() + self.timeout
            self.sock = self._accept(server, deadline)
            hello, _ = recv(self.sock, deadline=deadline, why_dead=self._why_dead, what=f"the {self.name}")
            if hello.get("token") != token:
                raise WorkerError(f"the {self.name}: a stranger connected to its port")
            port, group = free_port(), f"srpo-graph-worker-{uuid.uuid4().hex[:12]}"
            send(self.sock, {"op": "start", "workflow": wf.model_dump_json(), "threads": torch.get_num_threads(),
                             "options": {"device": device, "dtype": dtype, "max_batch_size": max_batch_size},
                             "group": {"address": "127.0.0.1", "port": port, "name": group}, "timeout": self.timeout})
            with ThreadPoolExecutor(1, thread_name_prefix="srpo-worker-group") as pool:
                join = pool.submit(join_group, "127.0.0.1", port, 2, group, "gloo", self.timeout)
                while not join.done():
                    self._check(deadline, "join the weight group")
                    time.sleep(0.01)
                self.pg = join.result()
            self._answer(deadline)  # its models are loaded
        except BaseException:
            self.kill()
            raise
        finally:
            server.close()

    # ------------------------------------------------------------------ waits

    def _why_dead(self) -> str | None:
        rc = self.proc.poll()
        return None if rc is None else f"exited with code {rc}"

    def _check(self, deadline: float, doing: str) -> None:
        dead = self._why_dead()
        if dead is not None:
            raise WorkerError(f"the {self.name} {dead} (while it was to {doing})")
        if time.monotonic() > deadline:
            raise WorkerError(f"the {self.name} did not {doing} within {self.timeout:g}s (rollout.worker_timeout)")

    def _accept(self, server: socket.socket, deadline: float) -> socket.socket:
        server.settimeout(0.2)
        while True:
            try:
                conn, _ = server.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return conn
            except socket.timeout:
                self._check(deadline, "start")

    def _answer(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        header, payload = recv(self.sock, deadline=deadline, why_dead=self._why_dead, what=f"the {self.name}")
        if not header.get("ok"):
            raise WorkerRefused(f"the {self.name}: {header.get('error', 'failed')}")
        return header, payload

    def _guard(self, fn, *args):
        """Run one exchange; a broken wire (deadline, death) stops the worker for good, an error it
        answered with leaves it serving."""
        if self._broken is not None:
            raise WorkerError(f"the {self.name} was stopped earlier: {self._broken}")
        with self._lock:
            if self._broken is not None:  # broken by the exchange this one waited for (another thread's)
                raise WorkerError(f"the {self.name} was stopped earlier: {self._broken}")
            try:
                return fn(*args)
            except WorkerRefused:
                raise
            except (BackendError, OSError) as exc:  # mid-exchange: the wire's state is unknown, so the worker goes
                try:  # a lost connection is most often a dead worker: say so, with its exit code
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
                dead = self._why_dead()
                msg = str(exc).strip() if dead is None or dead in str(exc) else f"the {self.name} {dead} ({exc})"
                self._broken = msg
                self.kill()
                raise WorkerError(msg) from None
            except BaseException:  # e.g. Ctrl-C mid-request
                self._broken = "interrupted in the middle of a request"
                self.kill()
                raise

    # ------------------------------------------------------------------ requests

    def run(self, workflow: Any, tasks: Sequence[Any], *, samples: int, seed: int,
            policy_versions: Mapping[str, int] | None = None, on_backend_error: str = "raise",
            deadlines: Any = None, scheduler: str = "auto", max_concurrent: int | None = None) -> RunResult:
        """``runtime.executor.run`` in the worker on its copies of the policies (same arguments).

        ``policy_versions``: the versions the caller expects each named policy to hold there (an error
        if it holds another); None: whatever it holds, recorded on every output.

        Raises:
            BackendError: the worker failed (its error), died or passed the deadline (named).
        """
        from srpo_graph.runtime.usercode import Deadlines

        header = {
            "op": "run",
            "workflow": workflow.model_dump_json(),
            "tasks": [t.model_dump(mode="json") for t in tasks],
            "samples": samples,
            "seed": seed,
            "policy_versions": dict(policy_versions or {}),
            "on_backend_error": on_backend_error,
            "deadlines": (deadlines or Deadlines()).model_dump(mode="json"),
            "scheduler": scheduler,
            "max_concurrent": max_concurrent,
        }

        def exchange() -> RunResult:
            t0 = time.monotonic()
            send(self.sock, header)
            answer, payload = self._answer(t0 + self.timeout)
            self.stats["runs"] += 1
            self.stats["run_seconds"] += time.monotonic() - t0
            episodes = [Episode.model_validate_json(line) for line in payload.decode().splitlines() if line]
            return RunResult(episodes, RunStats.model_validate(answer["stats"]))

        return self._guard(exchange)

    def push_weights(self, models: Mapping[str, Any], version: int) -> None:
        """Give the worker each policy's current weights (``{policy name: model}``), tagged ``version``:
        a full model's every weight, a LoRA adapter's matrices only (:func:`weight_pairs`). The
        policies of one call move together: no rollout batch runs between two of them.

        Raises:
            BackendError: a name or shape the worker's model lacks, a worker that died or stalled.
        """

        def push_all() -> None:  # under one hold of the channel: no rollout batch starts between two policies
            for name, model in models.items():
                self._push_one(name, model, int(version))

        self._guard(push_all)

    def _push_one(self, name: str, model: Any, version: int) -> None:
        t0 = deadline = time.monotonic()
        deadline += self.timeout
        send(self.sock, {"op": "weights", "policy": name, "version": version})
        for bucket in buckets(weight_pairs(model), BUCKET_BYTES, None):
            flat = flatten(bucket).cpu()
            send(self.sock, {"op": "bucket", **bucket_header(bucket, flat.numel())})
            work = self.pg.broadcast([flat], broadcast_options())
            while not work.is_completed():
                self._check(deadline, f"take the weights of policy {name!r}")
                time.sleep(0.001)
            try:
                work.wait()  # completed: returns at once, or raises the broadcast's error
            except RuntimeError as exc:
                raise WorkerError(f"the {self.name}: the weight broadcast failed ({exc})") from None
            self.stats["tensors"] += len(bucket)
            self.stats["bytes"] += flat.numel()
        send(self.sock, {"op": "end"})
        self._answer(deadline)
        self.stats["pushes"] += 1
        self.stats["push_seconds"] += time.monotonic() - t0

    # ------------------------------------------------------------------ end

    def close(self, timeout: float = 30.0) -> None:
        """Ask the worker to exit; past ``timeout`` seconds (or while another thread holds it in a
        request that long), it is killed."""
        if self.proc.poll() is None and self._broken is None and self._lock.acquire(timeout=timeout):
            try:
                send(self.sock, {"op": "close"})
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
            finally:
                self._lock.release()
        self.kill()

    def kill(self) -> None:
        """Stop the worker now (idempotent)."""
        _reap(self.proc)
        for f in (getattr(self, "sock", None), self.proc.stdin):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self._finalizer.detach()


class WorkerPolicy:
    """A trained policy's backend when it samples in the rollout worker: ``sync_weights`` pushes the
    weights there; ``generate`` is never called (the whole rollout batch runs in the worker)."""

    def __init__(self, worker: RolloutWorker, name: str, tokenizer: Any):
        self.worker, self.name, self.tokenizer = worker, name, tokenizer
        self.weight_version = 0

    def generate(self, requests: Any) -> list:
        raise WorkerError(
            f"policy {self.name!r} samples in the {self.worker.name}: run the whole batch there (RolloutWorker.run)"
        )

    def sync_weights(self, model: Any, version: int) -> None:
        self.worker.push_weights({self.name: model}, version)
        self.weight_version = int(version)

    def close(self) -> None:
        """The worker is shared by every policy: :func:`close_worker` ends it."""


def worker_of(slots: Sequence[Any]) -> RolloutWorker | None:
    """The rollout worker the slots' policies sample in (None: they sample in this process)."""
    for s in slots:
        if isinstance(s.backend, WorkerPolicy):
            return s.backend.worker
    return None


def close_worker(slots: Sequence[Any]) -> None:
    worker = worker_of(slots)
    if worker is not None:
        worker.close()


def start_for_training(wf: Any, config: Any, slots: Sequence[Any], device: str) -> dict[str, WorkerPolicy]:
    """Start the run's rollout worker, give it every slot's current weights (version 0; a resumed run
    pushes its checkpoint's after) and return each slot's backend."""
    r = config.rollout
    worker = RolloutWorker(
        wf, device=device, dtype=r.dtype, max_batch_size=r.transformers.max_batch_size, timeout=r.worker_timeout
    )
    try:
        worker.push_weights({s.name: s.replica if s.replica is not None else s.model for s in slots}, 0)
    except BaseException:
        worker.kill()
        raise
    return {s.name: WorkerPolicy(worker, s.name, s.tokenizer) for s in slots}
