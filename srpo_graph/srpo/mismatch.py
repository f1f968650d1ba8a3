r"""Sampler/trainer corrections of the SRPO loss: the importance weight of each item (objective stage).

The loss's ratio is ``pi_theta / pi_old`` where ``pi_old`` is the trainer's recomputation of
the sampling policy before the update (``SetBatch.old_logprobs``). The tokens were drawn from
the *behaviour* policy mu (``SetBatch.sampler_logprobs``): a different numeric path (SGLang vs
the trainer), or older weights when rollouts are stale (asynchronous RL). ``mismatch`` picks
how that gap enters the loss, as a stop-gradient weight m_i on each item's objective:

* ``none``: m_i = 1 (on-policy, or an exact sampler).
* ``tis`` / ``mask``: one weight per *event*, exp(H_e) with H_e = sum_j sum_u (log pi_old - log mu),
  truncated at C (``tis``) or the event dropped outside [C_low, C] (``mask``); every item of the
  event shares it, whatever the ratio unit.
* ``decoupled``: decoupled PPO (AReaL; Hilton et al. 2022, "Batch size-invariance for policy
  optimization"). ``pi_old`` is the *proximal* policy: the ratio pi_theta / pi_prox is clipped
  as before, and the behaviour policy appears only in the importance weight
  pi_prox / mu of the *same unit* as the ratio: per token for ``token``, per member for
  ``member`` (sum or length-normalized mean, like the ratio), per event for ``set`` (the
  K^(-alpha)-scaled sum, like the ratio). So ratio x weight is the unit's ratio against the
  behaviour policy, and the clip acts only on the step the update takes. ``decoupled_cap``:
  ``truncate`` (min(w, C)), ``mask`` (AReaL's ``behav_imp_weight_cap``: items with w > C, or
  below ``mismatch_low`` when set, get weight 0) or ``none``. ``decoupled_weight``: ``normalized``
  (the default, just described) or ``joint``: each item's full probability ratio
  exp(sum of its token gaps), for the set unit pi_prox(S) / mu(S) = exp(sum_j l_j), the importance
  weight of the set as one action (docs/algorithm.md, "The behaviour weight of a set").

Weights are computed once per loss call from the token gaps ``old - sampler`` and carry no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from srpo_graph.srpo.options import DecoupledCap, DecoupledWeight, LossConfig, Mismatch


@dataclass
class ItemWeight:
    """Per-item importance weights [I] (stop-gradient) and what their cap did."""

    weight: torch.Tensor  # [I] applied weight
    raw: torch.Tensor  # [I] uncapped weight (clamped in log space)
    truncated: torch.Tensor  # [I] bool: capped at C
    masked: torch.Tensor  # [I] bool: weight set to 0


def item_weight(h_tok: torch.Tensor, *, token_set: torch.Tensor, num_sets: int, event: torch.Tensor,
                aggregate: Callable[[torch.Tensor], torch.Tensor], cfg: LossConfig,
                item_of_token: torch.Tensor | None = None) -> ItemWeight | None:
    """The importance weight of every item, or None when ``cfg.mismatch`` is ``none``.

    Args:
        h_tok: [C] token gaps log pi_old - log mu on completion tokens (detached).
        token_set: [C] the event of each completion token. num_sets: events in the batch.
        event: [I] the event of each item. aggregate: the ratio unit's token -> item map.
        cfg: the loss options (``mismatch``, its threshold and cap, ``decoupled_weight``).
        item_of_token: [C] the item of each completion token (needed by ``decoupled_weight = joint``).
    """
    mode = Mismatch(cfg.mismatch)
    if mode is Mismatch.NONE:
        return None
    h_tok = h_tok.detach()
    c = cfg.logratio_clamp
    C = cfg.mismatch_threshold
    if mode is Mismatch.DECOUPLED:
        if DecoupledWeight(cfg.decoupled_weight) is DecoupledWeight.JOINT:
            if item_of_token is None:
                raise ValueError("decoupled_weight = joint needs item_of_token")
            log_w = torch.zeros(event.numel(), dtype=h_tok.dtype, device=h_tok.device)
            log_w = log_w.index_add_(0, item_of_token, h_tok)  # the item's full log-ratio: sum of its tokens
        else:
            log_w = aggregate(h_tok)  # like the ratio: the set's K^(-alpha)-scaled sum, a member's sum or mean
        raw = log_w.clamp(-c, c).exp()
        cap = DecoupledCap(cfg.decoupled_cap)
        no = torch.zeros_like(raw, dtype=torch.bool)
        if cap is DecoupledCap.TRUNCATE:
            return ItemWeight(raw.clamp(max=C), raw, raw > C, no)
        if cap is DecoupledCap.MASK:
            low = cfg.mismatch_low if cfg.mismatch_low is not None else 0.0
            drop = (raw > C) | (raw < low)
            return ItemWeight(torch.where(drop, torch.zeros_like(raw), raw), raw, no, drop)
        return ItemWeight(raw, raw, no, no)
    H = torch.zeros(num_sets, dtype=h_tok.dtype, device=h_tok.device).index_add_(0, token_set, h_tok)
    raw = H.clamp(-c, c).exp().index_select(0, event)
    if mode is Mismatch.TIS:
        return ItemWeight(raw.clamp(max=C), raw, raw > C, torch.zeros_like(raw, dtype=torch.bool))
    low = cfg.mismatch_low if cfg.mismatch_low is not None else 1.0 / C
    keep = (raw >= low) & (raw <= C)
    return ItemWeight(keep.to(raw.dtype), raw, torch.zeros_like(keep), ~keep)


__all__ = ["ItemWeight", "item_weight"]
