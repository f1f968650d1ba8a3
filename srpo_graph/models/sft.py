"""The supervised pre-training loop of the recipes (models stage; ``recipes.py``, ``chat_recipe.py``).

Consumes a model and (ids, number of prompt ids) sequences; runs AdamW steps of next-token loss on
the ids after each prompt, in length-bucketed batches, and returns the losses. It knows nothing of
tokenizers or of what the sequences say.
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable


def length_buckets(seqs: list, batch_size: int, steps: int, rng: random.Random) -> list[list]:
    """``steps`` batches: shuffled, then sorted by length within chunks of 16 batches (less padding)."""
    out: list[list] = []
    while len(out) < steps:
        order = list(range(len(seqs)))
        rng.shuffle(order)
        chunk = 16 * batch_size
        for c in range(0, len(order) - batch_size + 1, chunk):
            idx = sorted(order[c : c + chunk], key=lambda i: len(seqs[i][0]))
            group = [
                [seqs[i] for i in idx[b : b + batch_size]] for b in range(0, len(idx) - batch_size + 1, batch_size)
            ]
            rng.shuffle(group)
            out += group
    return out[:steps]


def sft_steps(
    model,
    seqs: list[tuple[list[int], int]],
    pad_id: int,
    steps: int,
    lr: float,
    batch_size: int,
    rng: random.Random,
    log: Callable[[str], None] | None,
    label: str = "",
    loss_of: Callable | None = None,
) -> list[float]:
    """``steps`` AdamW steps (warm-up, then cosine decay) of next-token loss on ``seqs``: (ids, number of
    prompt ids) pairs, the loss on the ids after the prompt. ``loss_of(model, ids, attn, labels)`` replaces
    the model's own loss (chat_recipe.py's pooled softmax). Returns the losses."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )
    batches = length_buckets(seqs, batch_size, steps, rng)
    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    for step, batch in enumerate(batches):
        width = max(len(s) for s, _ in batch)
        ids = torch.full((len(batch), width), pad_id)  # (B, T), right-padded
        labels = torch.full((len(batch), width), -100)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (s, n_prompt) in enumerate(batch):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, n_prompt : len(s)] = torch.tensor(s[n_prompt:])  # loss on the completion + eos only
            attn[i, : len(s)] = 1
        if loss_of is None:
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        else:
            loss = loss_of(model, ids, attn, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log and (step + 1) % 100 == 0:
            log(
                f"  {label}step {step + 1}/{steps}  loss {sum(losses[-100:]) / len(losses[-100:]):.3f}"
                f"  ({time.perf_counter() - t0:.0f} s)"
            )
    return losses
