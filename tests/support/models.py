"""The tiny model as the tests use it, a second small model beside it, and wrappers that take
optional forward arguments away.

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


def tiny_and_small(family: str = "qwen2") -> list:
    """``[tiny, small]``: the built tiny model (Llama, tied head) and a freshly initialised small
    model of ``family`` on its vocabulary (seed 0): ``"qwen2"`` (biased q/k/v projections, their
    biases drawn so they count -- transformers zero-initializes them -- grouped kv heads, an
    untied head) or ``"llama"`` (a tied head). Both in eval mode: the log-prob tests' two policies."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from srpo_graph.models.tiny import ensure_tiny_model

    tiny = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model())).eval()
    assert tiny.config.tie_word_embeddings and tiny.lm_head.weight is tiny.get_input_embeddings().weight
    torch.manual_seed(0)
    shape = dict(vocab_size=tiny.config.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=256)
    if family == "llama":
        return [tiny, LlamaForCausalLM(LlamaConfig(**shape, num_key_value_heads=4, tie_word_embeddings=True)).eval()]
    if family != "qwen2":
        raise ValueError(f"unknown family {family!r}: qwen2 or llama")
    small = Qwen2ForCausalLM(Qwen2Config(**shape, num_key_value_heads=2, tie_word_embeddings=False,
                                         use_sliding_window=False)).eval()
    with torch.no_grad():
        for name, p in small.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return [tiny, small]
