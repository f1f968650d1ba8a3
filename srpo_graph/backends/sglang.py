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
* retries with exponential backoff on connection errors and HTTP 5xx; a read timeout is a
  :class:`BackendError` (the request may still be running; it is not sent twice);
* ``/health`` is checked when the backend starts;
* weights: ``sync_weights`` saves the model with ``save_pretrained`` into ``weight_dir`` (a
  path every server can read) and calls ``/update_weights_from_disk`` on each worker, between
  ``/pause_generation`` and ``/continue_generation`` where the server has them (404 tolerated),
  tagging the version (``weight_version``) that later completions report.

Constrained outputs (``allowed_token_ids``, an agent's ``allow:``) are **not supported**: SGLang
has no per-request token whitelist whose log-probs are the renormalized ones the trainer
recomputes, so such a request raises a :class:`BackendError` instead of sampling something
else. Use the transformers backend for those workflows.
"""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from srpo_graph.backends.base import Completion, GenerationRequest
from srpo_graph.errors import BackendError

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangBackend:
    """Sample from an SGLang server over HTTP.

    Args:
        url: the server or router, e.g. ``http://127.0.0.1:30000``.
        tokenizer: the served model's tokenizer (the runtime tokenizes prompts with it).
        timeout: seconds for one HTTP request (connect + read) before it is an error.
        max_retries: retries of one request after a connection error or a 5xx answer.
        backoff: first retry delay in seconds, doubled each retry.
        concurrency: requests in flight at once.
        worker_urls: where weight updates go (default ``[url]``; a router has no update
            routes, so list its workers here).
        weight_dir: directory, readable by every server, where ``sync_weights`` saves models.
        send_seed: also send ``sampling_seed`` per request (only honoured by servers in
            deterministic mode; off by default because older servers reject the key).
        check_health: call ``/health`` now.
    Raises:
        BackendError: when ``/health`` does not answer 200.
    """

    def __init__(self, url: str, tokenizer: Any, *, timeout: float = 300.0, max_retries: int = 4,
                 backoff: float = 0.5, concurrency: int = 64, worker_urls: Sequence[str] | None = None,
                 weight_dir: str | Path | None = None, send_seed: bool = False, check_health: bool = True):
        import httpx

        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.weight_version = 0
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.worker_urls = [u.rstrip("/") for u in (worker_urls or [self.url])]
        self.weight_dir = Path(weight_dir) if weight_dir else Path.home() / ".cache" / "srpo-graph" / "sglang-weights"
        self.send_seed = send_seed
        self.stats = {"requests": 0, "retries": 0, "retractions": 0}
        self._lock = threading.Lock()
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx.Client(timeout=timeout, limits=limits)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="srpo-sglang")
        if check_health:
            self.check_health()

    # ------------------------------------------------------------------ HTTP

    def _post(self, base: str, route: str, payload: dict[str, Any], *, tolerate_404: bool = False) -> Any:
        """POST with retries (connection errors, 5xx); the decoded JSON answer."""
        import httpx

        url = f"{base}{route}"
        for attempt in range(self.max_retries + 1):
            try:
                resp = self._client.post(url, json=payload)
            except httpx.TimeoutException as exc:
                raise BackendError(f"sglang: {url} did not answer within {self.timeout:g}s ({type(exc).__name__})") from None
            except httpx.TransportError as exc:
                problem = f"connection error: {type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 404 and tolerate_404:
                    return None
                if resp.status_code < 500:
                    if resp.status_code >= 400:
                        raise BackendError(f"sglang: {url} answered HTTP {resp.status_code}: {resp.text[:500]}")
                    try:
                        return resp.json()
                    except ValueError:
                        raise BackendError(f"sglang: {url} answered non-JSON: {resp.text[:200]!r}") from None
                problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
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
            resp = self._client.get(f"{self.url}/health", timeout=min(self.timeout, 10.0))
        except httpx.HTTPError as exc:
            raise BackendError(
                f"sglang: no server answers at {self.url} ({type(exc).__name__}: {exc}). Start one with "
                "`python -m sglang.launch_server --model-path MODEL --port 30000` (see docs/sglang.md) "
                "and pass its address with --url."
            ) from None
        if resp.status_code != 200:
            raise BackendError(f"sglang: {self.url}/health answered HTTP {resp.status_code} (still starting?)")

    # ------------------------------------------------------------------ generation

    def payload(self, req: GenerationRequest) -> dict[str, Any]:
        """The ``/generate`` body for one request (see the module docstring)."""
        if req.allowed_token_ids is not None:
            raise BackendError(
                f"sglang: request {req.request_id!r} is constrained to {len(req.allowed_token_ids)} token ids "
                "(an agent with `allow:`); SGLang cannot sample from the renormalized constrained "
                "distribution, so this workflow needs the transformers backend"
            )
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
        return {"input_ids": [int(t) for t in req.prompt_ids], "sampling_params": params, "return_logprob": True}

    def _one(self, req: GenerationRequest) -> Completion:
        answer = self._post(self.url, "/generate", self.payload(req))
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
        version = meta.get("weight_version")
        try:
            version = int(version)
        except (TypeError, ValueError):
            version = self.weight_version
        return Completion(tuple(ids), tuple(lps), _FINISH[kind], version)  # type: ignore[arg-type]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Send every request concurrently; results in request order.

        Raises:
            BackendError: a constrained request, a failed request after retries, a timeout, or
                a malformed answer.
        """
        for r in requests:
            self.payload(r)  # reject what cannot be sent before sending anything
        return list(self._pool.map(self._one, requests))

    # ------------------------------------------------------------------ weights

    def sync_weights(self, model: Any, version: int) -> None:
        """Save ``model`` (or use a directory path) and load it into every worker, tagged ``version``.

        Raises:
            BackendError: a worker that refuses the update.
        """
        if isinstance(model, (str, Path)):
            path = Path(model)
        else:
            path = self.weight_dir / f"v{int(version)}"
            if path.exists():
                shutil.rmtree(path)
            model.save_pretrained(path, safe_serialization=True)
            if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
                self.tokenizer.save_pretrained(path)
        for worker in self.worker_urls:
            self._post(worker, "/pause_generation", {}, tolerate_404=True)
            try:
                answer = self._post(worker, "/update_weights_from_disk", {
                    "model_path": str(path), "weight_version": str(int(version)), "flush_cache": True})
            finally:
                self._post(worker, "/continue_generation", {}, tolerate_404=True)
            if not isinstance(answer, dict) or not answer.get("success", False):
                msg = answer.get("message") if isinstance(answer, dict) else answer
                raise BackendError(f"sglang: {worker} refused the weight update to {path}: {msg}")
        self.weight_version = int(version)
        if not isinstance(model, (str, Path)):  # keep the new and the previous version on disk
            for old in self.weight_dir.glob("v*"):
                if old.name not in (f"v{int(version)}", f"v{int(version) - 1}") and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
