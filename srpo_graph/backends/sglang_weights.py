"""The weight routes of an SGLang server: a sync of new weights, pause and continue (backends stage).

Consumes a model (or a saved folder) and a version; produces nothing but the served weights and
their version on every worker, its prefix cache flushed. :class:`ServerWeights` is the half of
:class:`~srpo_graph.backends.sglang.SGLangBackend` that moves weights (the other half samples);
the process-group route itself is ``weight_sync.py``'s.

Note [Weight sync that loses nothing]
    ``sync_weights`` saves the model with ``save_pretrained`` into ``weight_dir/v<version>``
    and calls ``/update_weights_from_disk {model_path, weight_version, flush_cache: true}`` on
    every worker: the radix cache holds KV of the old weights, and the update flushes it itself
    (weight_sync.py, Note [The update flushes the cache]: the ``/flush_cache`` route costs a
    ``gc.collect()`` of the server on CPU). It does **not** call ``/pause_generation`` (whose
    default mode aborts requests in flight): SGLang's update takes the model-update writer lock,
    which waits for running ``/generate`` requests to finish, and the trainer syncs only between
    rollouts anyway. SGLang 0.5.23 refuses an update's own flush, failing the call although the
    weights were loaded, when requests are still queued; then ``/flush_cache?timeout=T`` waits
    for the server to be idle and flushes (a busy answer is retried until ``timeout``; a server
    without the route has nothing to flush).
    Every answer's ``meta_info.weight_version`` (and ``weight_versions`` per token span) is
    read back: a completion spanning several versions reports the oldest. ``weight_dir`` follows
    the one ownership rule of ``weight_dir.py`` (a manifest naming the owning run and the folders
    it wrote; only those are ever replaced or deleted, the newest two kept; a second live run on
    the same folder is refused).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srpo_graph.errors import BackendError

if TYPE_CHECKING:
    from srpo_graph.backends.weight_dir import WeightFolder


class ServerWeights:
    """``sync_weights``, ``save_weights``, ``pause_generation``, ``continue_generation`` of
    :class:`~srpo_graph.backends.sglang.SGLangBackend`, which holds the state they use."""

    tokenizer: Any
    weight_version: int
    worker_urls: list[str]
    weights: WeightFolder
    sync: str
    sync_options: dict[str, Any]
    timeout: float
    backoff: float
    _streamer: Any
    _paused: bool

    if TYPE_CHECKING:
        def _post(self, base: str, route: str, payload: dict[str, Any], *, tolerate_404: bool = False,
                  max_tokens: Any = None) -> Any: ...

        def _read(self, url: str, payload: dict[str, Any], timeout: float, max_bytes: int = ...,
                  why: str = ...) -> tuple[int, bytes]: ...

    def save_weights(self, model: Any, version: int) -> Path:
        """Save ``model`` (and the tokenizer) as ``weight_dir/v<version>``; record it in the manifest.

        Raises:
            BackendError: that folder exists but was not written by srpo-graph (it is left alone), or
                another live run owns the weight folder (``weight_dir.WeightFolder``).
        """
        path = self.weights.claim(f"v{int(version)}")
        model.save_pretrained(path, safe_serialization=True)
        if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
            self.tokenizer.save_pretrained(path)
        return path

    def sync_weights(self, model: Any, version: int) -> None:
        """Load ``model``'s weights into every worker, tagged ``version``: streamed over a
        process group (``sync="distributed"``, or ``"auto"`` where the workers join one), or
        saved into ``weight_dir`` and loaded from there (``"disk"``; also for a directory path).

        Raises:
            BackendError: a worker that refuses, stalls or dies during the update (named).
        """
        from srpo_graph.backends.weight_sync import UNFLUSHED

        streamed = None if self.sync == "disk" or isinstance(model, (str, Path)) else self._stream(model, version)
        if streamed is not None:
            for worker in streamed:  # loaded, their own flush refused (requests queued): flushed once idle
                self._flush_cache(worker)
            self.weight_version = int(version)
            return
        path = Path(model) if isinstance(model, (str, Path)) else self.save_weights(model, version)
        unflushed = []
        for worker in self.worker_urls:
            try:
                answer = self._post(worker, "/update_weights_from_disk", {
                    "model_path": str(path), "weight_version": str(int(version)), "flush_cache": True,
                    "torch_empty_cache": False, "abort_all_requests": False})
            except BackendError as exc:
                if UNFLUSHED not in str(exc):
                    raise
                unflushed.append(worker)  # (Note [The update flushes the cache])
                continue
            if not isinstance(answer, dict) or not answer.get("success", False):
                msg = answer.get("message") if isinstance(answer, dict) else answer
                raise BackendError(f"sglang: {worker} refused the weight update to {path}: {msg}")
        for worker in unflushed:
            self._flush_cache(worker)
        self.weight_version = int(version)
        if not isinstance(model, (str, Path)):  # keep the new and the previous version on disk
            self.weights.keep_only({f"v{int(version)}", f"v{int(version) - 1}"})

    def pause_generation(self) -> None:
        """Pause every worker, its running requests retracted to its queue (``/pause_generation``,
        ``mode = "retract"``: KV recomputed on resume): a weight update then runs at once instead of
        waiting for them, and they go on with the new weights (partial rollouts: their
        ``meta_info.weight_versions`` then has a span per version; the version of record is the oldest)."""
        for worker in self.worker_urls:
            self._post(worker, "/pause_generation", {"mode": "retract"})
        self._paused = True  # _flush_cache: a paused server is flushed at once (its queue is ignored)

    def continue_generation(self) -> None:
        """Resume every worker paused by :meth:`pause_generation` (``/continue_generation``)."""
        self._paused = False
        for worker in self.worker_urls:
            self._post(worker, "/continue_generation", {})

    def _stream(self, model: Any, version: int) -> list[str] | None:
        """Stream ``model`` over the workers' weight-update groups: the workers whose cache still
        needs a flush (:meth:`DistributedSync.push`); None: ``auto`` fell back to disk."""
        from srpo_graph.backends.weight_sync import DistributedSync

        if self._streamer is None:
            device = next(iter(model.parameters())).device if hasattr(model, "parameters") else None
            on_gpu = device is not None and device.type == "cuda"  # NCCL from the GPU, gloo from the CPU: one path
            self._streamer = DistributedSync(**{"backend": "nccl" if on_gpu else "gloo",
                                                "device": str(device) if on_gpu else "cpu", **self.sync_options})
            if self.sync == "auto":
                try:
                    for worker in self.worker_urls:
                        self._streamer.connect(worker)
                except BackendError as exc:
                    import warnings

                    warnings.warn(f"rollout.sglang.sync=auto: weights go by disk ({exc})", stacklevel=2)
                    self.sync = "disk"
                    return None
        return self._streamer.push(self.worker_urls, model, version)

    def _flush_cache(self, worker: str) -> None:
        """Empty ``worker``'s prefix cache once it is idle (Note [Weight sync that loses nothing])."""
        import httpx

        deadline = time.monotonic() + self.timeout
        url, attempt = f"{worker}/flush_cache", 0
        while True:
            # paused (partial rollouts): timeout 0 flushes at once, ignoring the retracted requests queued
            # (SGLang defers a flush with a timeout until the queue is empty too, which a pause never reaches)
            wait = 0.0 if self._paused else max(0.0, deadline - time.monotonic())
            try:
                status, body = self._read(f"{url}?timeout={wait:.1f}", {}, max(0.0, deadline - time.monotonic()) + 5.0)
            except (httpx.HTTPError, BackendError) as exc:
                raise BackendError(f"sglang: {url} failed after the weight update ({type(exc).__name__}: {exc}); "
                                   "the new weights are loaded, its prefix cache may hold KV of the old ones") from None
            if status < 300 or status == 404:  # flushed, or a server without the route (nothing to flush)
                return
            if status != 400 or time.monotonic() >= deadline:
                raise BackendError(f"sglang: {url} answered HTTP {status} after the weight update: "
                                   f"{body.decode('utf-8', errors='replace')[:300]} (still busy after "
                                   f"{self.timeout:g}s?)")
            time.sleep(min(self.backoff * 2**attempt, 2.0))  # busy (or another flush running): ask again
            attempt += 1
