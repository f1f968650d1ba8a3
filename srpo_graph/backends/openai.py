"""Client of an OpenAI-compatible chat-completions endpoint, for external policies (``openai(...)``).

Backends stage. Text in, text out: each prompt is sent as one user message (after the agent's
``system:`` prompt as a system message, when it has one) to ``<url>/chat/completions`` and the
answer's ``message.content`` comes back; the messages sent are recorded on the output
(``Output.messages``), so ``show`` can print what an external agent was asked. Decision (issue 28):
an external output is recorded as **text only** -- no token ids, no log-probs. Tokenizing the
answer with some local tokenizer would re-tokenize text (architecture rule 3) and give ids with no
log-probs of record; an external policy is always frozen, so its outputs never enter the loss and
need no ids.

Every request has its own deadline (``timeout``) over the whole request and answer, and its answer
a size bounded by its ``max_tokens`` (``bounded_http.py``: Note [A deadline over the whole answer],
Note [An answer's size]); it is retried ``retries`` times with a short backoff (not when the answer
was too large, nor when the request itself was refused), and at most ``concurrency`` are in flight
at once. A request that fails for good is
reported per request (:class:`ChatError` with ``partial`` / ``errors``, the shape the executor
reads for SGLang), its message naming the URL, so the episode fails cleanly and the others go on.
The API key is read from the environment variable the workflow names, never from the file.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from srpo_graph.backends import bounded_http
from srpo_graph.backends.base import Completion, GenerationRequest
from srpo_graph.errors import BackendError
from srpo_graph.exiting import result
from srpo_graph.workflow import ExternalModel


class ChatError(BackendError):
    """Some chat requests failed for good.

    Attributes:
        partial: one entry per request: the answer's text, or None where it failed.
        errors: the error of each failed request (None where it succeeded), naming the URL.
    """

    def __init__(self, message: str, partial: list[Any], errors: list[str | None]):
        super().__init__(message)
        self.partial, self.errors = partial, errors


def messages(system: str | None, prompt: str) -> list[dict[str, str]]:
    """The chat messages of one request: the system prompt (when the agent has one), then the prompt
    as the user message -- what is sent, and what the trace records (``Output.messages``).

    >>> messages("Be brief.", "2+2?")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2?'}]
    """
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}]


@dataclass(frozen=True)
class ChatRequest:
    """One chat request: the user message and the sampling options an API honours."""

    prompt: str
    system: str | None = None  # the agent's `system:` prompt, sent first as the system message
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


class OpenAIChat:
    """A client of one endpoint.

    Args:
        model: the endpoint and its limits (``ExternalModel``, from the workflow).
        backoff: seconds before the first retry (doubled after each).
    Raises:
        BackendError: ``api_key_env`` names a variable that is not set.
    """

    def __init__(self, model: ExternalModel, *, backoff: float = 0.2):
        self.spec, self.backoff = model, backoff
        self.url = model.url.rstrip("/") + "/chat/completions"
        headers = {}
        if model.api_key_env:
            key = os.environ.get(model.api_key_env)
            if not key:
                raise BackendError(f"{model.url}: the API key variable {model.api_key_env} is not set "
                                   f"(export {model.api_key_env}=...)")
            headers["Authorization"] = f"Bearer {key}"
        self._client = bounded_http.client(concurrency=model.concurrency, headers=headers)
        self._pool = ThreadPoolExecutor(max_workers=model.concurrency, thread_name_prefix="openai")
        self.weight_version = 0  # never synced: an external policy is frozen

    def _body(self, r: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.spec.model, "messages": messages(r.system, r.prompt),
                                "max_tokens": r.max_tokens, "temperature": r.temperature, "top_p": r.top_p}
        if r.stop:
            body["stop"] = list(r.stop)
        if r.seed is not None:
            body["seed"] = r.seed
        return body

    def _one(self, r: ChatRequest) -> tuple[str, str]:
        """(text, finish_reason) of one request, retried; raises BackendError naming the URL."""
        import httpx

        last = ""
        for attempt in range(self.spec.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = bounded_http.call(self._client, "POST", self.url, json=self._body(r), timeout=self.spec.timeout,
                                         max_bytes=bounded_http.answer_limit(r.max_tokens),
                                         why=f"max_tokens {r.max_tokens}")
            except bounded_http.AnswerTimeout:
                last = f"no answer within {self.spec.timeout:g} s (the deadline covers the whole answer)"
                continue
            except bounded_http.AnswerTooLarge as exc:  # the endpoint misbehaves: asking again would too
                raise BackendError(str(exc)) from None
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status != 200:
                last = f"HTTP {resp.status}: {resp.text[:200]}"
                if resp.status in (400, 401, 403, 404, 422):  # the request itself is wrong: no retry
                    break
                continue
            try:
                choice = json.loads(resp.body)["choices"][0]
                text = choice["message"]["content"] or ""
                finish = choice.get("finish_reason") or "stop"
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                last = f"not a chat-completions answer ({type(exc).__name__}: {exc}): {resp.text[:200]}"
                continue
            return str(text), "length" if finish == "length" else "stop"
        raise BackendError(f"{self.url}: {last} (after {self.spec.retries + 1} attempts)")

    def chat(self, requests: Sequence[ChatRequest]) -> list[tuple[str, str]]:
        """Every request at once (at most ``concurrency`` in flight); answers in request order.

        Raises:
            ChatError: some requests failed for good; ``partial`` holds the others' answers.
        """
        futures = [self._pool.submit(self._one, r) for r in requests]
        out: list[tuple[str, str] | None] = []
        errors: list[str | None] = []
        try:  # each waited for in slices: a Ctrl-C goes through (exiting.py, Note [A signal reaches the main
            # thread's waits])
            for f in futures:
                try:
                    out.append(result(f))
                    errors.append(None)
                except BackendError as exc:
                    out.append(None)
                    errors.append(str(exc))
        except BaseException:
            for f in futures:  # what has not started is not sent
                f.cancel()
            raise
        failed = [e for e in errors if e is not None]
        if failed:
            raise ChatError(f"{len(failed)} of {len(requests)} requests failed: {failed[0]}",
                            [o[0] if o is not None else None for o in out], errors)
        return [o for o in out if o is not None]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


class OpenAIBackend:
    """The :class:`~srpo_graph.backends.base.Backend` of an external policy: text only.

    ``tokenizer`` is None and ``text_only`` True: the runtime then sends each request's rendered
    prompt as ``prompt_text`` (no ids) and records the answer as a text-only output
    (``Output.source = "text"``). Failed requests come back per request (``partial``/``errors``),
    so the executor fails only their episodes, each error naming the URL. An endpoint is a
    server: the executor's ``auto`` scheduler streams episodes to it (``scheduler``;
    runtime/streaming.py) when every policy's backend is one, up to ``concurrency`` in flight.
    """

    scheduler = "streaming"  # executor.run(scheduler="auto") streams episodes to servers
    text_only = True
    tokenizer: Any = None
    weight_version = 0

    def __init__(self, model: ExternalModel, *, backoff: float = 0.2):
        self.client = OpenAIChat(model, backoff=backoff)
        self.concurrency = int(model.concurrency)  # requests in flight at once (the streaming scheduler's bound)

    @classmethod
    def for_policy(cls, model: ExternalModel) -> "OpenAIBackend":
        return cls(model)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        chats = []
        for r in requests:
            if r.prompt_text is None:
                raise BackendError(f"{self.client.url}: request {r.request_id!r} has no prompt text "
                                   "(an external model takes text, not token ids)")
            chats.append(ChatRequest(r.prompt_text, system=r.system_text, max_tokens=r.max_new_tokens,
                                     temperature=r.temperature,
                                     top_p=r.top_p, stop=r.stop, seed=r.seed))
        try:
            answers = self.client.chat(chats)
        except ChatError as exc:
            exc.partial = [None if t is None else Completion((), (), "stop", text=t)
                           for t in exc.partial]
            raise
        return [Completion((), (), "length" if f == "length" else "stop", text=t) for t, f in answers]

    def sync_weights(self, model: Any, version: int) -> None:
        raise BackendError(f"{self.client.url}: an external policy is frozen; it has no weights to sync")

    def close(self) -> None:
        self.client.close()
