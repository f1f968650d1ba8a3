"""Trainer stage, policies: one trained policy's parts (:class:`PolicySlot`) and its optimizer.

Consumes a built model and the run's ``optim`` config; produces the slot every later stage reads:
the rollout stage samples from ``backend`` (attached by ``rollout/backends.py``), the learner
updates ``model`` with ``optimizer`` and ``scheduler``, the sync stage (``train/sync.py``) hands
the new weights to ``backend`` and bumps ``version``, the checkpointer saves them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch


@dataclass
class PolicySlot:
    """One trainable policy: its model, optimizer, scheduler and the backend sampling from it.

    Attributes:
        name: the policy's name in the workflow.
        base: the resolved base model path (the KL reference's source).
        model, tokenizer, optimizer, scheduler: what the learner updates and the checkpointer saves.
        backend: what samples from it (None on a rank that does not sample).
        ref_model: the frozen KL reference (None when the KL coefficient is 0).
        version: the weight version the backend has (the step of its last sync).
        replica: fsdp with an in-process backend: rank 0's unsharded copy it samples from.
        stream: fsdp with a server backend: the sync streams gathered buckets (every rank).
    """

    name: str
    base: str
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    backend: Any
    ref_model: Any = None
    version: int = 0
    replica: Any = None
    stream: bool = False


def lr_lambda(config: Any, updates_total: int) -> Callable[[int], float]:
    """The learning-rate factor after ``n`` optimizer steps: warm-up, then ``optim.schedule``.

    >>> from srpo_graph.train.config.schema import TrainConfig
    >>> f = lr_lambda(TrainConfig.model_validate({"optim": {"warmup_steps": 2, "schedule": "linear"}}), 10)
    >>> [round(f(n), 3) for n in (0, 1, 2, 6, 10)]
    [0.5, 1.0, 1.0, 0.5, 0.0]
    """
    o = config.optim

    def factor(n: int) -> float:  # n = optimizer steps taken
        if o.warmup_steps and n < o.warmup_steps:
            return (n + 1) / o.warmup_steps
        frac = min(1.0, (n - o.warmup_steps) / max(1, updates_total - o.warmup_steps))
        return {"constant": 1.0, "linear": 1.0 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[o.schedule]

    return factor


def make_optimizer(params: Iterable[torch.nn.Parameter], config: Any) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over ``params`` with ``config.optim``'s settings, and its LR schedule over the run's
    ``steps x epochs x mini_batches`` optimizer steps."""
    o = config.optim
    opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    updates_total = config.steps * o.epochs * o.mini_batches
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(config, updates_total))
