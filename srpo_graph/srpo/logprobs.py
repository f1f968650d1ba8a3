"""Log-probs of the packed stream under the current policies (objective stage).

Consumes a :class:`~srpo_graph.compiler.setbatch.SetBatch` and one causal LM per policy id
(``batch.policies[i]`` is run by ``models[i]``); produces ``logprobs[T]`` and ``entropy[T]``
on the completion tokens (0 elsewhere), with gradients flowing into each member's own
policy. Knows nothing about losses or optimizers.

How the members of one policy are laid out for the forward is a choice of this module only
(Note [Layouts]); the SetBatch, and so the loss, never sees it:

* ``packed`` -- ONE row whose ``position_ids`` restart at 0 for each member; transformers
  builds the block-diagonal causal mask from the positions. With a variable-length kernel
  (flash-attention's varlen, FlexAttention's block masks) attention costs the sum of the
  members' squared lengths. Exact only with ``use_cache=False`` and no 2-D attention mask
  (shared/reference/transformers-cpu.md: with the cache on, results are silently wrong).
* ``padded`` -- members sorted by length into buckets (:func:`length_buckets`), each bucket
  one right-padded [rows, L] batch with plain causal attention and no mask at all: a real
  token only ever attends to earlier real tokens of its own row, so the padding is never
  seen. This is the fast layout where no varlen kernel exists (sdpa or eager on CPU build a
  dense [n, n] float mask and attend over all n packed tokens).
* ``prefix`` -- padded, except that what members of one policy share, token for token, runs
  once: the G samples of a task (one prompt), an aggregator's prompt and its question, and a
  chat agent's turns, whose turn k prompt is turn k-1's prompt + its sampled completion + the new
  messages (runtime/chat.py). The unit is a member's INPUT, its tokens but the last (the logits
  at positions first completion - 1 .. len - 2 score its completion), so ``prefix_tree.py``
  builds the prefix tree of the inputs (nested: a task's prompt, then each sample's first turn,
  then its second turn, ...; a node wherever sharing saves ``MIN_SHARED_TOKENS`` slots) and an
  earlier turn's completion is scored from the rows its later turn runs anyway. A policy whose
  tree would run more than ``MAX_TREE_SHARE`` of its tokens takes the padded way. The tree runs
  level by level (:func:`prefix_forward`): each level's segments right-padded in length
  buckets, the KV cache on; a node's cache rows are repeated to the segments that continue it
  (a differentiable gather, so a shared row's gradient is the sum of its readers') and those
  attend to them through a 2-D mask hiding the padding above. Prompts are most of the tokens
  (72-89% on the CPU study workflows) and chat turns repeat each other:
  benchmarks/bench_layouts.py and benchmarks/bench_chat_prefix.py have what sharing saves.
  Needs a model whose forward takes ``attention_mask`` and a KV cache (``past_key_values`` or
  ``cache``), full attention in every layer (no sliding window, no linear-attention layers) and
  no gradient checkpointing; others get ``padded``, and so does a policy whose cache is not
  plain key/value layers (``_can_repeat`` in ``prefix_tree.py``).
* ``auto`` (the default) -- packed for flash/flex attention, otherwise prefix where the model
  takes a cache, else padded (:func:`choose_layout`).

Each member's distribution is the sampler's: ``log_softmax(logits / T)``, renormalized over
its allowed tokens when the output was constrained.

Note [Layouts]: the layout only changes which rows the same per-member computations are
batched into. Every completion token's log-prob is a function of its own member's tokens,
so the results equal across layouts up to float rounding (tests/srpo/test_logprob_layouts.py
checks log-probs, losses and gradients, packed vs padded vs other bucketings, against a
one-member-at-a-time reference), and events are never split: the layout works inside a
micro-batch, per policy (so the prefix tree shares only within one micro-batch). In the
``prefix`` layout several members may read one hidden state (a cell of a shared node): it is the
same function of the same tokens for each of them, so nothing changes but the count of
forwards, and its gradient is the sum of theirs, as if each had run it.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.srpo.forwards import BUCKET_OVERHEAD_TOKENS, cache_kwarg, packed_forward, padded_forward
from srpo_graph.srpo.lm_head import (
    FLOOR,
    SelectedLogSoftmax,
    head_logprobs,
    hidden_states_of,
    output_head,
    sampler_mask,
)
from srpo_graph.srpo.prefix_tree import prefix_forward

Layout = Literal["auto", "packed", "padded", "prefix"]
# attention implementations (``config._attn_implementation``) that run packed rows with a
# variable-length kernel, so packing costs nothing in attention: flash-attention's varlen
# (transformers passes cu_seqlens from the restarting position_ids) and FlexAttention's
# block-sparse masks. Every other one (sdpa, eager) gets the padded layout.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention implementation of ``model`` (or of the model it wraps); "" if none is set."""
    for m in model.modules():  # ``model`` itself first, then what it wraps
        impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
        if isinstance(impl, str) and impl:
            return impl
    return ""


def choose_layout(model: torch.nn.Module, layout: Layout = "auto") -> Literal["packed", "padded", "prefix"]:
    """The micro-batch layout for ``model``: ``layout`` itself unless it is ``auto``, which
    picks ``packed`` for a varlen attention kernel (``VARLEN_ATTENTION`` or a kernels-hub
    flash kernel), ``prefix`` for a model that takes a KV cache and ``padded`` otherwise
    (Note [Layouts]). ``prefix`` asked of a model without a cache is ``padded``.

    Raises:
        ValueError: ``layout`` is not one of auto, packed, padded, prefix.
    """
    if layout == "prefix":
        return "prefix" if cache_kwarg(model) else "padded"
    if layout in ("packed", "padded"):
        return layout
    if layout != "auto":
        raise ValueError(f"layout must be 'auto', 'packed', 'padded' or 'prefix', got {layout!r}")
    impl = attention_implementation(model)
    if impl in VARLEN_ATTENTION or "flash" in impl:
        return "packed"
    return "prefix" if cache_kwarg(model) else "padded"


def packed_logprobs(models: Sequence[torch.nn.Module], batch: SetBatch, *, layout: Layout = "auto",
                    bucket_overhead: int = BUCKET_OVERHEAD_TOKENS, head_chunk: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of every completion token under its member's policy.

    Args:
        models: causal LMs (transformers ``PreTrainedModel``), indexed by policy id; a policy
            with no member in the batch is not run.
        batch: the SetBatch (any device; moved to the models' device); usually one
            micro-batch.
        layout: how each policy's members are batched for the forward: ``packed``,
            ``padded``, ``prefix`` or ``auto`` (per model, :func:`choose_layout`); Note
            [Layouts]. The results do not depend on it (up to float rounding).
        bucket_overhead: the padded and prefix layouts' cost of one more forward, in token slots
            (:func:`length_buckets`); 0 = a bucket per distinct length.
        head_chunk: completion rows per chunk of the lm_head + log-softmax (Note [Chunked head]
            in ``lm_head.py``): None = about 2**24 logits per chunk, 0 = no chunking (the whole
            [completion tokens, V] block, held for backward). Same results either way.
    Returns:
        (logprobs [T], entropy [T]) float32 on the models' device; 0 on prompt tokens.
        ``logprobs`` carries gradients; ``entropy`` is computed from the same distribution,
        detached (a diagnostic). Memory: the lm_head and the log-softmax run on completion
        positions only (hidden states are gathered there first), ``head_chunk`` rows at a
        time in forward and backward, so no [tokens, V] block is held (models whose head is
        not a plain Linear, e.g. FSDP-sharded or LoRA-wrapped, get the whole [completion
        tokens, V] block per forward: size micro-batches for them).
    Raises:
        ValueError: a member's policy id has no model; an unknown ``layout``.
    """
    device = next(models[0].parameters()).device
    b = batch.to(device)
    T = b.num_tokens
    out_lp = torch.zeros(T, dtype=torch.float32, device=device)
    out_ent = torch.zeros(T, dtype=torch.float32, device=device)
    used = torch.unique(b.member_policy).tolist()
    if used and max(used) >= len(models):
        raise ValueError(f"batch uses policy id {max(used)} ({b.policies[max(used)]!r}) but only {len(models)} "
                         f"models given")
    lp_parts, ent_parts, where_parts = [], [], []
    allow: list[torch.Tensor] = []  # the [A, V] allowed-token mask, built on first use
    for p in used:
        model = models[p]
        chosen = choose_layout(model, layout)
        head = output_head(model) if head_chunk != 0 else None  # Note [Chunked head]
        with hidden_states_of(head):  # with a head: ``logits`` below are hidden states [c, H]
            if chosen == "packed":
                scored = packed_forward(model, b, p)
            elif chosen == "prefix":
                scored = prefix_forward(model, b, p, bucket_overhead)
            else:
                scored = padded_forward(model, b, p, bucket_overhead)
        for logits, where, tmem in scored:
            target = b.input_ids.index_select(0, where)
            temp = b.member_temperature.index_select(0, tmem)
            mask_ = sampler_mask(b, tmem, allow)
            if head is not None:
                lp, ent = head_logprobs(logits, head, target, temp, mask_, head_chunk)
            else:
                # a fresh [c, V] tensor of the sampler's logits (temperature, then constraint);
                # ``logits`` is dropped so only this block stays alive
                scaled = logits.float() / temp.unsqueeze(1)
                del logits
                # in place: ``scaled`` is a fresh tensor that no backward formula reads
                mask_(scaled, 0, scaled.shape[0])
                lp, ent = SelectedLogSoftmax.apply(scaled, target)
            lp_parts.append(lp.clamp(min=FLOOR))  # only a now-excluded token can be below it
            ent_parts.append(ent)
            where_parts.append(where)
    if where_parts:
        where = torch.cat(where_parts)
        out_lp = out_lp.index_put((where,), torch.cat(lp_parts))
        out_ent = out_ent.index_put((where,), torch.cat(ent_parts))
    return out_lp, out_ent
