"""Trainer stage: the update's memory options, bf16 autocast and gradient checkpointing.

Consumes the trained models and ``optim.autocast`` / ``optim.gradient_checkpointing``
(train/config/loading.py); produces a context for the update's log-prob forwards. What each costs and
saves is measured in benchmarks/bench_real_models.py (docs/performance.md, P8).

* ``autocast = "bfloat16"``: the forwards of the update (and of the old log-probs, so the ratio
  compares like with like) run under ``torch.autocast(bfloat16)``: matmuls in bf16, weights,
  gradients and Adam states stay in their own dtype (float32 by default), the log-softmax in
  float32 (srpo/lm_head.py).
* ``gradient_checkpointing``: each decoder layer (transformers' ``GradientCheckpointingLayer``)
  keeps only its input for backward and recomputes its activations then (non-reentrant
  ``torch.utils.checkpoint``). transformers checkpoints a layer only in training mode, and the
  trainer keeps models in eval mode (no dropout), so :func:`update_forward` sets the flag on those
  layers alone (not on their attention or MLP, so dropout stays off) while the forwards run. The
  log-prob forward's ``prefix`` layout needs the KV cache, which checkpointing turns off: with it,
  ``auto`` picks ``padded``.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Iterator, Sequence

import torch

AUTOCAST_DTYPES = {"off": None, "bfloat16": torch.bfloat16}


def _checkpoint_layers(model: Any) -> list[torch.nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_gradient_checkpointing(model: Any) -> int:
    """Turn on gradient checkpointing in every decoder layer of ``model`` (a transformers causal
    LM, or a wrapper whose ``modules()`` are its modules); returns how many layers.

    Raises:
        ValueError: ``model`` has no checkpointable layer.
    """
    layers = _checkpoint_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no transformers GradientCheckpointingLayer to checkpoint")
    fn = partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    for layer in layers:
        setattr(layer, "gradient_checkpointing", True)  # what transformers' set_gradient_checkpointing sets
        setattr(layer, "_gradient_checkpointing_func", fn)
    return len(layers)


@contextlib.contextmanager
def update_forward(models: Sequence[Any], autocast: str = "off") -> Iterator[None]:
    """The context of the update's forwards: bf16 autocast if asked (``autocast`` is a key of
    ``AUTOCAST_DTYPES``), and the checkpointed layers of ``models`` in training mode so that
    transformers checkpoints them (Note in the module docstring)."""
    layers = [layer for m in models if m is not None for layer in _checkpoint_layers(m)
              if getattr(layer, "gradient_checkpointing", False) and not layer.training]
    dtype = AUTOCAST_DTYPES[autocast]
    device = next((p.device.type for m in models if m is not None for p in m.parameters()), "cpu")
    for layer in layers:
        layer.training = True
    try:
        with torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext():
            yield
    finally:
        for layer in layers:
            layer.training = False
