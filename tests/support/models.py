"""The tiny model as the tests use it, and wrappers that take optional forward arguments away.

``NoKeep`` and ``NoCache`` are real causal LMs (they call the wrapped model) whose ``forward``
lacks an argument some callers use: ``logits_to_keep`` (the log-prob code must then take the full
``[tokens, vocab]`` logits) or a KV cache (like the FSDP ordering wrapper), so the layout choice
and the full-logits path can be tested on the real tiny model.
"""

from __future__ import annotations

from pathlib import Path

import torch


class NoKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (the full-logits path)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids, use_cache=False):
        return self.inner(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache)


class NoCache(torch.nn.Module):
    """A causal LM wrapper whose forward takes no KV cache (like the fsdp ordering wrapper)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids=None, use_cache=False, logits_to_keep=0):
        return self.inner(
            input_ids=input_ids, position_ids=position_ids, use_cache=use_cache, logits_to_keep=logits_to_keep
        )


def tiny_backend_at(path: str | Path):
    """A :class:`TransformersBackend` on the tiny model at ``path``, on one thread (the tests'
    numbers are compared bit for bit, and a float sum split over threads rounds differently)."""
    from srpo_graph.backends.transformers import TransformersBackend

    torch.set_num_threads(1)
    return TransformersBackend.from_pretrained(str(path))
