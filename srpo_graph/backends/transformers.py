"""The embedded ``transformers`` backend: in-process batched sampling with a KV cache.

Backends stage. Consumes :class:`GenerationRequest` batches (token ids in); produces
:class:`Completion` objects (token ids and the sampler's log-probs out). It knows nothing about
workflows. Any Hugging Face causal LM works; ``"tiny"`` is the built-in default model.

The sampling loop is our own (not ``model.generate``) so that the log-probs of record are
exactly those of the distribution sampled (see Note [Log-probs of record] in
``srpo_graph.backends.sampling``) and every request draws from its own seeded generator.
Requests are sorted by prompt length and cut into chunks of ``max_batch_size``; each chunk is
left-padded, prefilled once and decoded step by step until every row stopped. Rows with the same
prompt (the G samples of a task) share one prefill: its KV cache row and last logits are
repeated to each (``batch_select_indices``), so a group of G costs one prompt forward; the
prefill keeps the last position's logits only (``logits_to_keep=1``).
"""

from __future__ import annotations

import inspect
import random
from typing import Any, Sequence

import torch

from srpo_graph.backends.base import Completion, GenerationRequest, context_length_of
from srpo_graph.backends.sampling import RowParams, sample
from srpo_graph.errors import BackendError


def cache_of(out: Any) -> Any:
    """The KV cache of a forward's output: ``cache`` (the role adapters' wrapper), else ``past_key_values``."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def end_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """Every id that ends a sample: the model config's ``eos_token_id`` (an id or a list), its
    ``generation_config``'s (instruct models list more there, e.g. Qwen2.5's ``<|im_end|>`` and
    ``<|endoftext|>``) and the tokenizer's ``eos_token_id`` -- the set SGLang stops at, so both
    backends end a sample at the same token."""
    found: list[Any] = []
    for source in (getattr(model, "config", None), getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        found += list(eos) if isinstance(eos, (list, tuple)) else [eos]
    return tuple(sorted({int(e) for e in found if e is not None}))


class TransformersBackend:
    """Sample from an in-process Hugging Face causal LM.

    Args:
        model: a ``PreTrainedModel`` (causal LM).
        tokenizer: its tokenizer.
        device: where the model runs.
        max_batch_size: most rows decoded together.
        share_prefill: rows with the same prompt share one prefill (the same samples either way,
            up to float rounding; off: one prefill row per request, a baseline for benchmarks).
    """

    def __init__(self, model: Any, tokenizer: Any, *, device: str = "cpu", max_batch_size: int = 256,
                 share_prefill: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.share_prefill = share_prefill
        self.weight_version = 0
        self.model.to(self.device)
        self.model.eval()
        self.eos_ids = end_ids(model, tokenizer)
        self.context_length = context_length_of(getattr(model, "config", None))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        # transformers 5.x renamed ``past_key_values`` to ``cache``; accept both
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, device: str = "cpu", dtype: Any = None, **kw: Any
    ) -> "TransformersBackend":
        """Load a model by name or path (``"tiny"`` = the built-in tiny model).

        Raises:
            BackendError: when the model or tokenizer cannot be loaded.
        """
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from srpo_graph.models import resolve_model
        from srpo_graph.models.tiny import load_tokenizer

        path = resolve_model(name_or_path)
        hf_logging.disable_progress_bar()
        try:
            tokenizer = load_tokenizer(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype if dtype is not None else torch.float32)
        except (OSError, ValueError) as exc:
            raise BackendError(
                f"cannot load model {name_or_path!r} ({path}): {exc}\n(a model must be a local"
                " directory or already in the Hugging Face cache; `--model tiny` runs the built-in"
                " tiny model)"
            ) from None
        return cls(model, tokenizer, device=device, **kw)

    # ------------------------------------------------------------------ generation

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Sample every request; results in request order (see the module docstring)."""
        for i, r in enumerate(requests):
            if not r.prompt_ids or r.max_new_tokens < 1:
                raise BackendError(f"request {i} ({r.request_id!r}): empty prompt or max_new_tokens < 1")
            bad = [t for t in (*r.prompt_ids, *(r.allowed_token_ids or ())) if not 0 <= t < self.vocab_size]
            if bad:
                raise BackendError(f"request {i} ({r.request_id!r}): token ids {bad[:5]} outside the vocabulary")
        order = sorted(range(len(requests)), key=lambda i: (len(requests[i].prompt_ids), i))
        out: list[Completion | None] = [None] * len(requests)
        with torch.inference_mode():
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                for i, c in zip(chunk, self._generate_chunk([requests[i] for i in chunk])):
                    out[i] = c
        return out  # type: ignore[return-value]

    def _row_params(self, reqs: Sequence[GenerationRequest]) -> RowParams:
        gens = []
        for r in reqs:
            g = torch.Generator()
            g.manual_seed(r.seed if r.seed is not None else random.getrandbits(63))
            gens.append(g)
        allowed = None
        if any(r.allowed_token_ids is not None for r in reqs):
            allowed = torch.ones(len(reqs), self.vocab_size, dtype=torch.bool)
            for row, r in enumerate(reqs):
                if r.allowed_token_ids is not None:
                    allowed[row] = False
                    allowed[row, list(r.allowed_token_ids)] = True
            allowed = allowed.to(self.device)
        return RowParams(
            temperature=torch.tensor([r.temperature for r in reqs], dtype=torch.float32, device=self.device),
            top_k=torch.tensor([r.top_k for r in reqs], dtype=torch.long, device=self.device),
            top_p=torch.tensor([r.top_p for r in reqs], dtype=torch.float32, device=self.device),
            allowed=allowed,
            generators=gens,
            sampled_logprobs=torch.tensor(
                [r.logprobs == "sampled" for r in reqs], dtype=torch.bool, device=self.device
            ),
        )

    def _prefill(self, prompts: Sequence[tuple[int, ...]]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One left-padded forward of ``prompts`` (every prompt ends at the last column): the KV cache,
        the last logits, the attention mask and the positions."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **self._last_logits_only
        )
        return cache_of(out), out.logits[:, -1, :], mask, positions

    def _generate_chunk(self, reqs: Sequence[GenerationRequest]) -> list[Completion]:
        n = len(reqs)
        rows_of: dict[tuple[int, ...], int] = {}  # each distinct prompt -> its row in the prefill
        prompts: list[tuple[int, ...]] = []  # the prefill's rows
        row_of = []
        for r in reqs:
            key = tuple(r.prompt_ids) if self.share_prefill else (len(prompts), *r.prompt_ids)
            if key not in rows_of:
                rows_of[key] = len(prompts)
                prompts.append(tuple(r.prompt_ids))
            row_of.append(rows_of[key])
        params = self._row_params(reqs)
        stops = [set(r.stop_token_ids) | set(self.eos_ids) for r in reqs]
        limit = torch.tensor([r.max_new_tokens for r in reqs], device=self.device)
        tokens: list[list[int]] = [[] for _ in reqs]
        logprobs: list[list[float]] = [[] for _ in reqs]
        finish: list[str | None] = [None] * n

        past, logits, mask, positions = self._prefill(prompts)
        step = 0
        if len(prompts) < n:  # one prefill per distinct prompt, repeated to its rows
            rows = torch.tensor(row_of, device=self.device)
            if hasattr(past, "reorder_cache"):  # every layer kind (attention, linear-attention states), repeats allowed
                past.reorder_cache(rows)
                logits, mask, positions = (
                    logits.index_select(0, rows),
                    mask.index_select(0, rows),
                    positions.index_select(0, rows),
                )
            else:  # a cache that cannot repeat rows (legacy tuples): one prefill row per request after all
                past, logits, mask, positions = self._prefill([tuple(r.prompt_ids) for r in reqs])
        next_pos = positions[:, -1] + 1
        while True:
            tok, lp = sample(logits, params)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            for row in range(n):
                if finish[row] is not None:
                    continue
                tokens[row].append(tok_l[row])
                logprobs[row].append(lp_l[row])
                if tok_l[row] in stops[row]:
                    finish[row] = "stop"
                elif len(tokens[row]) >= reqs[row].max_new_tokens:
                    finish[row] = "length"
            step += 1
            if all(f is not None for f in finish) or step >= int(limit.max()):
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=self.device)], dim=1)
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                use_cache=True,
                **{self._cache_kw: past},
            )
            past, logits, next_pos = cache_of(out), out.logits[:, -1, :], next_pos + 1
        return [
            Completion(tuple(t), tuple(lp), f or "length", self.weight_version)  # type: ignore[arg-type]
            for t, lp, f in zip(tokens, logprobs, finish)
        ]

    # ------------------------------------------------------------------ weights

    def sync_weights(self, model: Any, version: int) -> None:
        """Sample from ``model``'s weights from now on, tagged ``version``.

        When ``model`` is the very object this backend samples from (the trainer shares it),
        nothing is copied; otherwise its state dict is loaded into ours.
        """
        if model is not self.model:
            try:
                self.model.load_state_dict(model.state_dict())
            except RuntimeError as exc:
                raise BackendError(f"sync_weights: the model does not match the backend's: {exc}") from None
        self.model.eval()
        self.weight_version = int(version)

    def close(self) -> None:
        """Nothing to release (the model is garbage-collected with the backend)."""
