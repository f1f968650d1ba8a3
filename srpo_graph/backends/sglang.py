"""The ``sglang`` backend: a client of a running SGLang server (or sglang-router).

Backends stage. Consumes :class:`GenerationRequest` batches; produces :class:`Completion`
objects, through SGLang's native ``POST /generate`` API (token ids in, token ids and log-probs
out; see docs/sglang.md and shared/reference/sglang.md for the wire format):

* one HTTP request per sample, sent concurrently from a thread pool (a router spreads them
  over its workers; a batched ``/generate`` would go to one worker);
* sampling parameters always explicit: ``max_new_tokens``, ``temperature``, ``top_p``,
  ``top_k`` (``-1`` = off), ``stop_token_ids``, ``skip_special_tokens: false``,
  ``no_stop_trim: true`` -- and nothing else unless asked (0.5.23 rejects unknown keys);
* ``output_ids`` and ``meta_info.output_token_logprobs`` read back exactly (they must agree);
  the server's log-prob is ``log softmax(logits / T)`` over the full vocabulary, as ours;
* retries with exponential backoff on connection errors and HTTP 5xx; ``timeout`` is a
  **deadline per request** (connect, headers and the whole body: a server that drips bytes
  slowly is cut off too); a request past it is a :class:`BackendError` and is not sent twice;
  an answer is bounded in size by its ``max_new_tokens`` (``bounded_http.py``);
* a failed request does not lose the others: ``generate`` answers every request it can, then
  raises a :class:`BatchError` carrying the partial results, so the runtime fails only the
  episodes that waited on the failed ones;
* ``/health`` is checked when the backend starts.

Note [Constrained outputs on SGLang]
    An agent's ``allow:`` (``allowed_token_ids``) goes to SGLang as its own *custom logit
    processor* ``DisallowedTokensLogitsProcessor`` (shipped with SGLang; the server must run
    with ``--enable-custom-logit-processor``) with ``custom_params.token_ids`` = every other
    id of the vocabulary: the server sets those logits to -inf **before** sampling and before
    it computes the returned log-prob, so both are those of ``softmax(logits / T)``
    renormalized over the allowed ids -- what ``srpo/logprobs.py`` recomputes (verified against
    a transformers forward in tests/backends/test_sglang_real.py). SGLang names a processor
    by a JSON string ``{"callable": <hex>}`` where <hex> is a *by-reference* pickle of the class
    (the constant ``_DISALLOW_CALLABLE`` below: module + class name, no code; we never build or
    load a pickle). The server merges all rows that carry the same string and this processor
    requires one id list per group, so the string also carries a digest of the allowed set
    (``{"callable": ..., "srpo_graph_allow": <digest>}``; SGLang reads only ``callable``):
    requests with different ``allow:`` lists never share a group.

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

import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from srpo_graph.backends import bounded_http
from srpo_graph.backends.base import Completion, FinishReason, GenerationRequest
from srpo_graph.errors import BackendError
from srpo_graph.exiting import result

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
# pickle protocol 4 of `sglang.srt.sampling.custom_logit_processor.DisallowedTokensLogitsProcessor`,
# by reference (= DisallowedTokensLogitsProcessor.to_str() in sglang 0.5.23); see Note above.
_DISALLOW_CALLABLE = ("80049552000000000000008c2a73676c616e672e7372742e73616d706c696e672e637573746f6d5f6c6f6769745f"
                      "70726f636573736f72948c1f446973616c6c6f776564546f6b656e734c6f6769747350726f636573736f729493942e")
from srpo_graph.backends.weight_dir import MANIFEST, WeightFolder  # noqa: E402,F401 - MANIFEST: re-exported


class BatchError(BackendError):
    """Some requests of a batch failed for good.

    Attributes:
        partial: one entry per request, in order: its :class:`Completion`, or None where it failed.
        errors: the error message of each failed request (None where it succeeded).
    """

    def __init__(self, message: str, partial: list[Completion | None], errors: list[str | None]):
        super().__init__(message)
        self.partial, self.errors = partial, errors


def allow_processor(allowed: Sequence[int]) -> str:
    """The ``custom_logit_processor`` string for one allowed set (see Note [Constrained outputs on SGLang]).

    >>> json.loads(allow_processor([5, 3]))["callable"] == _DISALLOW_CALLABLE
    True
    >>> allow_processor([3, 5]) == allow_processor([5, 3]) != allow_processor([3])
    True
    """
    digest = hashlib.blake2b(json.dumps(sorted({int(t) for t in allowed})).encode(), digest_size=8).hexdigest()
    return json.dumps({"callable": _DISALLOW_CALLABLE, "srpo_graph_allow": digest})


class SGLangBackend:
    """Sample from an SGLang server over HTTP.

    A server batches continuously, so the executor's ``auto`` scheduler streams episodes to it
    (``scheduler``; runtime/streaming.py), up to ``concurrency`` requests in flight.

    Args:
        url: the server or router, e.g. ``http://127.0.0.1:30000``.
        tokenizer: the served model's tokenizer (the runtime tokenizes prompts with it).
        timeout: seconds one request may take in all (connect + answer + the whole body), > 0.
        max_retries: retries of one request after a connection error or a 5xx answer.
        backoff: first retry delay in seconds, doubled each retry.
        concurrency: requests in flight at once.
        worker_urls: where weight updates go (default ``[url]``; a router has no update
            routes, so list its workers here).
        weight_dir: directory, readable by every server, where ``sync_weights`` saves models.
        vocab_size: the model's vocabulary size (logit rows); needed for ``allow:`` requests.
        context_length: the most positions the served model takes (prompt + completion; None:
            unknown). The executor fails an episode whose request would not fit, naming the
            agent and turn, instead of sending it (the server would refuse it).
        send_seed: also send ``sampling_seed`` per request (only honoured by servers in
            deterministic mode; off by default because older servers reject the key).
        sync: how ``sync_weights`` moves weights: ``"distributed"`` (streamed over a process
            group, :mod:`srpo_graph.backends.weight_sync`), ``"disk"`` (saved into ``weight_dir``,
            loaded by each worker), ``"auto"`` (the group where the workers can join one, else disk).
        sync_options: keyword arguments of :class:`~srpo_graph.backends.weight_sync.DistributedSync`
            (``backend``, ``bucket_bytes``, ``master_address``, ``timeout``).
        check_health: call ``/health`` now.
    Raises:
        BackendError: when ``/health`` does not answer 200.
    """

    scheduler = "streaming"  # executor.run(scheduler="auto") streams episodes to servers

    def __init__(self, url: str, tokenizer: Any, *, timeout: float = 300.0, max_retries: int = 4,
                 backoff: float = 0.5, concurrency: int = 64, worker_urls: Sequence[str] | None = None,
                 weight_dir: str | Path | None = None, vocab_size: int | None = None,
                 context_length: int | None = None, send_seed: bool = False,
                 check_health: bool = True, weight_owner: str | None = None, sync: str = "disk",
                 sync_options: dict[str, Any] | None = None):
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.concurrency = int(concurrency)  # requests in flight at once (the streaming scheduler's bound)
        self.weight_version = 0
        self.reports_weight_versions = True  # completions carry the server's weight_version (the executor checks it)
        self.timeout, self.max_retries, self.backoff = float(timeout), int(max_retries), float(backoff)
        self.worker_urls = [u.rstrip("/") for u in (worker_urls or [self.url])]
        self.weight_dir = Path(weight_dir) if weight_dir else Path.home() / ".cache" / "srpo-graph" / "sglang-weights"
        self.weights = WeightFolder(self.weight_dir, weight_owner)  # who may write/delete there (weight_dir.py)
        self.vocab_size = int(vocab_size) if vocab_size else None
        self.context_length = int(context_length) if context_length else None
        self.send_seed = send_seed
        if sync not in ("auto", "distributed", "disk"):
            raise BackendError(f"field `rollout.sglang.sync`: {sync!r} is not one of auto, distributed, disk")
        self.sync, self.sync_options = sync, {"timeout": self.timeout, **(sync_options or {})}
        self._streamer: Any = None
        self._paused = False
        self.stats = {"requests": 0, "retries": 0, "retractions": 0, "failed": 0}
        self._lock = threading.Lock()
        self._disallowed: dict[tuple[int, ...], list[int]] = {}
        self._client = bounded_http.client(concurrency=concurrency)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="srpo-sglang")
        if check_health:
            self.check_health()

    # ------------------------------------------------------------------ HTTP

    def _read(self, url: str, payload: dict[str, Any], timeout: float,
              max_bytes: int = bounded_http.CONTROL_LIMIT, why: str = "a control route") -> tuple[int, bytes]:
        """One POST whose headers and body must all arrive within ``timeout`` seconds and
        ``max_bytes`` bytes (Note [A deadline over the whole answer]: httpx's own timeouts are per read)."""
        answer = bounded_http.call(self._client, "POST", url, json=payload, timeout=timeout, max_bytes=max_bytes,
                                   why=why)
        return answer.status, answer.body

    def _post(self, base: str, route: str, payload: dict[str, Any], *, tolerate_404: bool = False,
              max_tokens: int | None = None) -> Any:
        """POST with retries (connection errors, 5xx); the decoded JSON answer, at most
        ``answer_limit(max_tokens)`` bytes (a control route's limit without ``max_tokens``)."""
        import httpx

        url = f"{base}{route}"
        limit, why = ((bounded_http.answer_limit(max_tokens), f"max_new_tokens {max_tokens}") if max_tokens is not None
                      else (bounded_http.CONTROL_LIMIT, f"the route {route}"))
        for attempt in range(self.max_retries + 1):
            try:
                status, body = self._read(url, payload, self.timeout, limit, why)
            except bounded_http.AnswerTimeout:
                raise BackendError(f"sglang: {url} did not answer within {self.timeout:g}s (the deadline covers the "
                                   "whole answer)") from None
            except bounded_http.AnswerTooLarge as exc:
                raise BackendError(f"sglang: {exc}") from None
            except httpx.TransportError as exc:
                problem = f"connection error: {type(exc).__name__}: {exc}"
            else:
                text = body.decode("utf-8", errors="replace")
                if status == 404 and tolerate_404:
                    return None
                if status < 500:
                    if status >= 400:
                        raise BackendError(f"sglang: {url} answered HTTP {status}: {text[:500]}")
                    try:
                        return json.loads(text)
                    except ValueError:
                        raise BackendError(f"sglang: {url} answered non-JSON: {text[:200]!r}") from None
                problem = f"HTTP {status}: {text[:200]}"
            if attempt == self.max_retries:
                raise BackendError(f"sglang: {url} failed after {self.max_retries + 1} attempts; last: {problem}")
            with self._lock:
                self.stats["retries"] += 1
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")

    def check_health(self) -> None:
        """Raise :class:`BackendError` unless ``GET /health`` answers 200."""
        import httpx

        try:
            resp = bounded_http.call(self._client, "GET", f"{self.url}/health", timeout=min(self.timeout, 10.0),
                                     max_bytes=bounded_http.CONTROL_LIMIT, why="a health check")
        except (httpx.HTTPError, BackendError) as exc:
            raise BackendError(
                f"sglang: no server answers at {self.url} ({type(exc).__name__}: {exc}). Start one with "
                "`python -m sglang.launch_server --model-path MODEL --port 30000 --enable-custom-logit-processor` "
                "(see docs/sglang.md) and pass its address with --url, or let `srpo-graph train` launch it "
                "(rollout.sglang.launch)."
            ) from None
        if resp.status != 200:
            raise BackendError(f"sglang: {self.url}/health answered HTTP {resp.status} (still starting?)")

    # ------------------------------------------------------------------ generation

    def _disallowed_ids(self, req: GenerationRequest) -> list[int]:
        allowed = tuple(sorted({int(t) for t in req.allowed_token_ids or ()}))
        if self.vocab_size is None:
            raise BackendError(f"sglang: request {req.request_id!r} is constrained (an agent with `allow:`) but the "
                               "backend does not know the model's vocab_size; pass vocab_size= (load_backend does)")
        if not allowed or allowed[0] < 0 or allowed[-1] >= self.vocab_size:
            raise BackendError(f"sglang: request {req.request_id!r}: allowed token ids {list(allowed)[:8]} must be "
                               f"non-empty and inside the vocabulary [0, {self.vocab_size})")
        with self._lock:
            hit = self._disallowed.get(allowed)
            if hit is None:
                keep = set(allowed)
                hit = self._disallowed[allowed] = [t for t in range(self.vocab_size) if t not in keep]
        return hit

    def payload(self, req: GenerationRequest) -> dict[str, Any]:
        """The ``/generate`` body for one request (see the module docstring).

        Raises:
            BackendError: what SGLang cannot sample as asked -- ``logprobs="sampled"`` (the
                truncated distribution's log-probs) with top-k/top-p on: SGLang returns the
                full distribution's; a constraint outside the vocabulary.
        """
        if getattr(req, "logprobs", "full") == "sampled" and (req.top_k > 0 or req.top_p < 1.0):
            raise BackendError.at("sglang", f"request {req.request_id!r} asks for the log-probs of the top-k/top-p "
                                  "truncated distribution (logprobs='sampled'); SGLang returns those of the full "
                                  "distribution", fix="logprobs='full', or the transformers backend")
        params: dict[str, Any] = {
            "max_new_tokens": int(req.max_new_tokens),
            "temperature": float(req.temperature),
            "top_p": float(req.top_p),
            "top_k": int(req.top_k) if req.top_k > 0 else -1,
            "stop_token_ids": [int(t) for t in req.stop_token_ids],
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if self.send_seed and req.seed is not None:
            params["sampling_seed"] = int(req.seed % 2**31)
        body: dict[str, Any] = {"input_ids": [int(t) for t in req.prompt_ids], "sampling_params": params,
                                "return_logprob": True}
        if req.allowed_token_ids is not None:
            params["custom_params"] = {"token_ids": self._disallowed_ids(req)}
            body["custom_logit_processor"] = allow_processor(req.allowed_token_ids)
        return body

    def _one(self, req: GenerationRequest) -> Completion:
        answer = self._post(self.url, "/generate", self.payload(req), max_tokens=int(req.max_new_tokens))
        with self._lock:
            self.stats["requests"] += 1
        return self._parse(req, answer)

    def _parse(self, req: GenerationRequest, answer: Any) -> Completion:
        where = f"sglang: /generate answer for request {req.request_id!r}"
        if isinstance(answer, list) and len(answer) == 1:
            answer = answer[0]
        try:
            ids = [int(t) for t in answer["output_ids"]]
            meta = answer["meta_info"]
            pairs = meta["output_token_logprobs"]
            lps = [float(p[0]) for p in pairs]
            lp_ids = [int(p[1]) for p in pairs]
            finish = meta.get("finish_reason") or {"type": "length"}
            kind = finish["type"] if isinstance(finish, dict) else str(finish)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"{where} is malformed ({type(exc).__name__}: {exc}); "
                               f"expected output_ids and meta_info.output_token_logprobs") from None
        if lp_ids != ids:
            raise BackendError(f"{where}: output_token_logprobs ids {lp_ids[:8]} disagree with output_ids {ids[:8]}")
        if kind not in _FINISH:
            raise BackendError(f"{where}: unknown finish_reason {finish!r}")
        retractions = meta.get("num_retractions", meta.get("total_retractions", 0)) or 0
        with self._lock:
            self.stats["retractions"] += int(retractions)
        return Completion(tuple(ids), tuple(lps), _FINISH[kind], self._version_of(meta))

    def _version_of(self, meta: dict[str, Any]) -> int:
        """The weight version that produced a completion: the oldest of its spans' (see Note)."""
        tags: list[Any] = [seg.get("version") for seg in meta.get("weight_versions") or [] if isinstance(seg, dict)]
        tags = tags or [meta.get("weight_version")]
        versions = []
        for tag in tags:
            try:
                versions.append(int(tag))
            except (TypeError, ValueError):  # "default": the weights the server started with
                versions.append(0 if tag == "default" else self.weight_version)
        return min(versions)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Send every request concurrently; results in request order.

        Raises:
            BackendError: a request that cannot be sent (checked before anything is sent).
            BatchError: some requests failed after retries, timed out or were answered
                malformed; it carries every result that did come back.
        """
        for r in requests:
            self.payload(r)  # reject what cannot be sent before sending anything

        def guarded(req: GenerationRequest) -> Completion | BackendError:
            try:
                return self._one(req)
            except BackendError as exc:
                return exc

        futures = [self._pool.submit(guarded, r) for r in requests]
        try:  # waited for in slices: a Ctrl-C goes through (exiting.py, Note [A signal reaches the main thread's
            # waits])
            results = [result(f) for f in futures]
        except BaseException:
            for f in futures:  # what has not started is not sent (as Executor.map does)
                f.cancel()
            raise
        errors = [str(r) if isinstance(r, BackendError) else None for r in results]
        bad = [e for e in errors if e is not None]
        if bad:
            with self._lock:
                self.stats["failed"] += len(bad)
            partial = [None if isinstance(r, BackendError) else r for r in results]
            raise BatchError(f"{bad[0]}" + (f" (and {len(bad) - 1} more of {len(requests)} requests failed)"
                                            if len(bad) > 1 else ""), partial, errors)
        return [r for r in results if not isinstance(r, BackendError)]  # all of them: none failed

    # ------------------------------------------------------------------ weights

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

    def close(self) -> None:
        self.weights.close()  # the weight folder's lease, if this backend took it (weight_lease.py)
        if self._streamer is not None:
            self._streamer.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
