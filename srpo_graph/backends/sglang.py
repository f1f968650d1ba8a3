"""The ``sglang`` backend: a client of a running SGLang server (or sglang-router).

Backends stage. Consumes :class:`GenerationRequest` batches; produces :class:`Completion`
objects, through SGLang's native ``POST /generate`` API (token ids in, token ids and log-probs
out; see docs/sglang.md and shared/reference/sglang.md for the wire format):

* one HTTP request per sample, sent concurrently from a thread pool (a router spreads them
  over its workers; a batched ``/generate`` would go to one worker) -- but one call per wave
  where the caller uses the answers together (:meth:`SGLangBackend.generate_together`, Note [A
  wave in one call]);
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

Note [A wave in one call]
    The streaming scheduler sends an episode's pending agents -- a wave -- together and hands
    their answers back together, when the last returns (runtime/streaming.py, Note [Waves]). So
    nothing waits longer if the wave is one batched ``/generate`` call (``input_ids`` a list of
    lists, every other field a list with one entry per request; the answer a list in the same
    order), and the server's per-call work -- its HTTP and request parsing, ~6 ms of CPU a call
    on the 2-core machine, more than the ~1 ms of each request in it -- is paid once a wave
    (benchmarks/bench_sglang_batch.py: coord_par2's 256 requests a step as 128 calls of two, 1.7x
    less CPU and wall time than 256 calls). Not where the call would change what happens: behind a
    router (several ``worker_urls``) each request stays a call of its own, so the router can
    spread them; and ``generate`` (the lockstep scheduler's, one call for many episodes) keeps
    one call per request, so a failed request loses only its own episode. In a wave a failed
    call fails every request in it, which fails the same single episode a failed request would;
    its deadline and retries are the call's, its size bound the sum of its requests'.

The weight routes (``sync_weights``, ``pause_generation``, ``continue_generation``) are
``sglang_weights.py``'s (Note [Weight sync that loses nothing]).
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
from srpo_graph.backends.sglang_weights import ServerWeights  # noqa: E402
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


class SGLangBackend(ServerWeights):
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
              max_tokens: int | Sequence[int] | None = None) -> Any:
        """POST with retries (connection errors, 5xx); the decoded JSON answer, at most
        ``answer_limit(max_tokens)`` bytes (the sum over a batch's requests; a control route's limit
        without ``max_tokens``)."""
        import httpx

        url = f"{base}{route}"
        if max_tokens is None:
            limit, why = bounded_http.CONTROL_LIMIT, f"the route {route}"
        elif isinstance(max_tokens, int):
            limit, why = bounded_http.answer_limit(max_tokens), f"max_new_tokens {max_tokens}"
        else:
            limit = sum(bounded_http.answer_limit(m) for m in max_tokens)
            why = f"{len(max_tokens)} requests of max_new_tokens {max(max_tokens)} or fewer"
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
        return self._collect(requests, results)

    def generate_together(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """:meth:`generate` for requests whose answers are used together -- an episode's wave -- in
        one batched ``/generate`` call where the server is one worker (Note [A wave in one call]).

        Raises:
            BackendError: a request that cannot be sent (checked before anything is sent).
            BatchError: the call failed (every request with it), or some answers were malformed.
        """
        if len(requests) < 2 or len(self.worker_urls) > 1:
            return self.generate(requests)
        payloads = [self.payload(r) for r in requests]
        body = {key: [p.get(key) for p in payloads] for key in dict.fromkeys(k for p in payloads for k in p)}
        results: list[Completion | BackendError]
        try:
            answer = self._post(self.url, "/generate", body, max_tokens=[int(r.max_new_tokens) for r in requests])
            if not isinstance(answer, list) or len(answer) != len(requests):
                got = f"{len(answer)} answers" if isinstance(answer, list) else f"a {type(answer).__name__}"
                raise BackendError(f"sglang: {self.url}/generate answered {got} to a call of {len(requests)} requests")
        except BackendError as exc:
            results = [exc] * len(requests)
        else:
            with self._lock:
                self.stats["requests"] += len(requests)
            results = []
            for req, item in zip(requests, answer):
                try:
                    results.append(self._parse(req, item))
                except BackendError as exc:
                    results.append(exc)
        return self._collect(requests, results)

    def _collect(self, requests: Sequence[GenerationRequest], results: Sequence[Completion | BackendError],
                 ) -> list[Completion]:
        """The completions, or a :class:`BatchError` carrying those that came back."""
        errors = [str(r) if isinstance(r, BackendError) else None for r in results]
        bad = [e for e in errors if e is not None]
        if bad:
            with self._lock:
                self.stats["failed"] += len(bad)
            partial = [None if isinstance(r, BackendError) else r for r in results]
            raise BatchError(f"{bad[0]}" + (f" (and {len(bad) - 1} more of {len(requests)} requests failed)"
                                            if len(bad) > 1 else ""), partial, errors)
        return [r for r in results if not isinstance(r, BackendError)]  # all of them: none failed

    def close(self) -> None:
        self.weights.close()  # the weight folder's lease, if this backend took it (weight_lease.py)
        if self._streamer is not None:
            self._streamer.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
