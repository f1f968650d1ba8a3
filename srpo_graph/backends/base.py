"""The one ``Backend`` protocol every inference engine implements.

A backend is purely token ids in, token ids and log-probs out. It knows nothing about
workflows, agents or traces. The runtime tokenizes prompts with ``backend.tokenizer`` once,
hands the backend many requests at a time, and records what comes back exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class GenerationRequest:
    """One sampling request.

    Attributes:
        prompt_ids: the prompt token ids, exactly as sent.
        max_new_tokens: at most this many completion tokens (>= 1).
        temperature: > 0 samples from softmax(logits / temperature); 0 is greedy.
        top_p, top_k: nucleus / top-k filters (1.0 and 0 = off).
        logprobs: the log-prob of record under top-k/top-p: ``full`` (the full temperature-scaled
            distribution, or the constrained one) or ``sampled`` (the truncated distribution
            actually sampled, renormalized); the trainer recomputes the same (Note [Log-probs of
            record] in ``sampling.py``).
        stop_token_ids: generation stops after sampling one of these (it is kept in the ids).
        allowed_token_ids: if set, every completion token is sampled from the distribution
            renormalized over these ids, and its log-prob is the renormalized one.
        seed: a per-request seed (reproducible sampling), or None.
        request_id: an id for logs and servers.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    seed: int | None = None
    request_id: str = ""
    logprobs: Literal["full", "sampled"] = "full"
    # text-only backends (an external model, ``text_only = True``): the rendered prompt, sent as text
    # (``prompt_ids`` is then empty), and the stop strings the server applies
    prompt_text: str | None = None
    stop: tuple[str, ...] = ()
    # text-only backends: the agent's rendered `system:` prompt, sent as the system message
    system_text: str | None = None


@dataclass(frozen=True)
class Completion:
    """What a backend sampled for one request."""

    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per completion token
    finish_reason: FinishReason
    weight_version: int = 0
    text: str | None = None  # a text-only backend's answer (then no ids and no log-probs)


def context_length_of(config: Any) -> int | None:
    """The most positions a model takes (prompt + completion), from its config: the text
    config's ``max_position_embeddings`` (``n_positions`` or ``max_sequence_length`` in older
    configs); None when the config says none.

    >>> from types import SimpleNamespace
    >>> context_length_of(SimpleNamespace(max_position_embeddings=32768)), context_length_of(None)
    (32768, None)
    """
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@runtime_checkable
class Backend(Protocol):
    """An inference engine. ``tokenizer`` is a Hugging Face tokenizer for its model.

    A backend may also say ``context_length`` (int, or None when unknown): the most positions
    its model takes, prompt and completion together; the executor fails an episode whose next
    request would not fit (runtime/executor.py) instead of sending it.
    """

    tokenizer: Any
    weight_version: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Sample every request (many at once); results in request order."""
        ...

    def sync_weights(self, model: Any, version: int) -> None:
        """Make the engine sample from ``model``'s current weights, tagged ``version``."""
        ...

    def close(self) -> None:
        ...
