r"""The SRPO objective and its baselines, in one code path (objective stage).

Consumes a :class:`~srpo_graph.compiler.setbatch.SetBatch` and the current policies'
log-probs on its packed token stream (``new_logprobs[T]``, each member's from its own
policy's model, see ``logprobs.py``); produces a scalar loss to minimize and
:class:`LossDiagnostics`. Knows nothing about models, optimizers or traces.

The objective (SRPO, Yang et al. 2026; DESIGN.md). For event e with active set S_e of
K_e members, member j with completion tokens u, advantage A_e::

    ell_j = sum_u m_u (log pi_theta - log pi_old)        (or the mean over u: "length-normalized")
    L_e   = K_e^(-alpha) * sum_{j in S_e} ell_j          (alpha = 1/2: the sqrt(K) normalization)
    rho_e = exp(clamp(L_e, -c, c))
    s_e   = min(rho_e A_e, clip(rho_e, 1 - eps_low, 1 + eps_high) A_e)
    J     = (1/D) sum_e w_e * s_e                       loss = -J  (+ kl_coef * KL_k3)

The *ratio unit* chooses what one ratio and one clip cover: ``set`` (SRPO: one per event),
``member`` (one per output: GSPO with length-normalized log-ratios, or independent members
sharing their set's advantage) or ``token`` (GRPO / Dr. GRPO / DAPO). The *surrogate* (``SURROGATES``)
turns an item's log-ratio into its objective: PPO's clip above, CISPO's clipped stop-gradient
weight, or GMPO's log-space token clip. The *reduction* gives the weights w of the items
(events, members or tokens) and the denominator D; see Note [Packing and loss normalization]
below. The options are :class:`~srpo_graph.srpo.options.LossConfig` (``options.py``, no torch);
named objectives (each a row with its compile options and paper) live in
``objectives.OBJECTIVES``, and ``objectives.loss_preset(name)`` gives a row's loss part. This
module knows nothing of that table.

Note [Packing and loss normalization]
    The batch is one packed stream; every per-member, per-set and per-episode quantity is a
    segment sum (``index_add``) over segment ids, never a Python loop over events. The
    weights w_i of a reduction are computed inside one event (events are never split),
    except the per-episode mean, which needs how many events of each episode the
    *mini-batch* holds: the compiler records that in ``set_episode_events`` and
    micro-batches keep the mini-batch's counts. The denominator D depends on the whole
    mini-batch, so the trainer calls :func:`loss_denominator` once per mini-batch and passes
    it to every micro-batch: the sum of the micro-batch losses then equals the mini-batch
    loss whatever the split (a test checks it).

Worked example: one event, K = 3, A_e = 1.5, computed by hand (docs/algorithm.md).
    Token log-ratios (new - old) 0.10, 0.05 | -0.02 | 0.04, 0.03, 0.00 give member
    log-ratios 0.15, -0.02, 0.07; L = 0.20 / sqrt(3) = 0.115470; rho = e^L = 1.122401,
    inside [0.8, 1.2], so s = rho * A = 1.683601 and, the batch being this one event
    (D = 1), loss = -1.683601. Every completion token gets the gradient
    -A * rho * 3^(-1/2) / D = -0.972028. Doubling every log-ratio gives rho = 1.259784 > 1.2
    with A > 0: clipped, s = 1.2 * 1.5 = 1.8 and no gradient.

    >>> from srpo_graph.compiler.synthetic import one_event_batch
    >>> b = one_event_batch([[-1.0, -0.5], [-2.0], [-0.3, -0.2, -0.1]], advantage=1.5)
    >>> d = torch.tensor([0.10, 0.05, -0.02, 0.04, 0.03, 0.00], dtype=torch.float64)
    >>> new = b.old_logprobs.double().index_put((b.loss_mask,), b.old_logprobs.double()[b.loss_mask] + d)
    >>> new.requires_grad_(True).shape
    torch.Size([9])
    >>> loss, _ = srpo_loss(new, b)
    >>> loss.backward()
    >>> round(loss.item(), 6), round(new.grad[b.loss_mask][0].item(), 6), new.grad[~b.loss_mask].abs().max().item()
    (-1.683601, -0.972028, 0.0)
    >>> new2 = new.detach().index_put((b.loss_mask,), b.old_logprobs.double()[b.loss_mask] + 2 * d).requires_grad_(True)
    >>> loss2, _ = srpo_loss(new2, b)
    >>> loss2.backward()
    >>> round(loss2.item(), 6), new2.grad.abs().max().item()
    (-1.8, 0.0)

Departures from the paper (whose PDF was not available; DESIGN.md):
    1. eps_low = eps_high = 0.2 and the std eps = 1e-6 are our choices: the paper's values
       were not recovered.
    2. The log-ratio is clamped to +-20 before exp (verl's guard); gradients beyond it are 0.
    3. KL (k3, to a reference policy) is a separate token-level term outside the set ratio,
       weighted like the items it belongs to (not by the mismatch weight unless
       kl_mismatch_weight), its log-ratio clamped like the ratio's; off by default (kl_coef = 0).
    4. Sampler/trainer mismatch correction (truncated or masked set-level importance weight
       exp(sum_j sum_u (log pi_old - log mu)), or decoupled PPO's per-item weight, mismatch.py)
       is an addition; off by default.
    5. Reductions other than the event mean, the token/member units and the CISPO/GMPO
       surrogates exist for the baselines; the paper uses the event mean and the clip.
    6. dual_clip (off by default) bounds a negative-advantage event's objective at c*A (with the
       clip and gmpo surrogates; refused with cispo, whose weight is already capped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.srpo.diagnostics import LossDiagnostics, diagnose
from srpo_graph.srpo.mismatch import item_weight
from srpo_graph.srpo.options import LossConfig, MemberLogRatio, RatioUnit, Reduction, Surrogate

# --------------------------------------------------------------------------- items


@dataclass
class _Ctx:
    """Segment ids and sizes of one batch, on the loss device (no host sync to build)."""

    comp: torch.Tensor  # [C] indices of completion tokens in the stream
    comp_mem: torch.Tensor  # [C] their members (non-decreasing)
    mem_set: torch.Tensor  # [M]
    K: torch.Tensor  # [S] set sizes (members present), float
    K_scale: torch.Tensor  # [S] the K of the K^(-alpha) scale: K, plus frozen members with frozen_in_k
    mem_len: torch.Tensor  # [M] completion tokens per member, float
    set_len: torch.Tensor  # [S] completion tokens per set, float
    num_sets: int
    num_members: int


def _context(b: SetBatch, dt: torch.dtype, frozen_in_k: bool = False) -> _Ctx:
    """Completion-token positions and per-member / per-set sizes, computed once per call.

    ``nonzero`` is the only host sync of the loss path (its output size is data-dependent);
    every other size comes from ``numel`` or a prefix sum read at the member offsets.
    """
    mask = b.loss_mask
    comp = mask.nonzero().squeeze(1)
    prefix = torch.zeros(b.num_tokens + 1, dtype=torch.int64, device=mask.device)
    torch.cumsum(mask, 0, out=prefix[1:])
    offsets = prefix.index_select(0, b.member_offsets)
    mem_len = offsets[1:] - offsets[:-1]  # [M] int
    # completion tokens are in stream order, so their members are runs of mem_len
    comp_mem = torch.repeat_interleave(torch.arange(b.num_members, device=mask.device), mem_len,
                                       output_size=comp.numel())
    mem_len_f = mem_len.to(dt)
    set_len = torch.zeros(b.num_sets, dtype=dt, device=mask.device).index_add_(0, b.member_set, mem_len_f)
    K = b.set_size.to(dt)
    K_scale = K + b.set_frozen_size.to(device=K.device, dtype=dt) if frozen_in_k else K
    return _Ctx(comp, comp_mem, b.member_set, K, K_scale, mem_len_f, set_len, b.num_sets, b.num_members)


@dataclass
class _Items:
    """What one ratio covers: items of events ``event[I]``; ``aggregate`` maps token log-ratios to theirs.

    ``aggregate`` is linear (a segment sum, mean or scale), so a surrogate may transform the
    token log-ratios first (GMPO clips them) and aggregate after.
    """

    aggregate: Callable[[torch.Tensor], torch.Tensor]  # [C] -> [I]
    event: torch.Tensor  # [I]
    tokens: torch.Tensor  # [I] completion tokens covered (float)
    per_event: torch.Tensor  # [I] how many items the item's event has (float)
    per_member: torch.Tensor  # [I] members the item stands for / items of its member (member-mean weight)
    of_token: Callable[[], torch.Tensor]  # -> [C] the item each completion token belongs to
    member: torch.Tensor | None  # [I] the member of each item (None: set items, which span members)

    def advantage(self, b: SetBatch, dt: torch.dtype) -> torch.Tensor:
        """[I]: the set's advantage for set items, the member's own for member and token items
        (they differ only in the per-member Dr. MAS mode)."""
        if self.member is None:
            return b.set_advantage.to(dt).index_select(0, self.event)
        return b.member_advantage.to(dt).index_select(0, self.member)


def _member_log_ratio(d: torch.Tensor, ctx: _Ctx, cfg: LossConfig) -> torch.Tensor:
    ell = torch.zeros(ctx.num_members, dtype=d.dtype, device=d.device).index_add_(0, ctx.comp_mem, d)
    if cfg.member_logratio is MemberLogRatio.MEAN:
        ell = ell / ctx.mem_len.clamp(min=1)
    return ell  # [M]


def _set_items(ctx: _Ctx, cfg: LossConfig) -> _Items:
    scale = ctx.K_scale.clamp(min=1).pow(-cfg.alpha)  # frozen members: Note [Frozen members] in docs/algorithm.md

    def aggregate(d: torch.Tensor) -> torch.Tensor:
        ell = _member_log_ratio(d, ctx, cfg)
        return torch.zeros(ctx.num_sets, dtype=d.dtype, device=d.device).index_add_(0, ctx.mem_set, ell) * scale

    ones = torch.ones(ctx.num_sets, dtype=ctx.K.dtype, device=ctx.K.device)
    return _Items(aggregate, torch.arange(ctx.num_sets, device=ctx.K.device), ctx.set_len, ones, ctx.K,
                  lambda: ctx.mem_set.index_select(0, ctx.comp_mem), None)


def _member_items(ctx: _Ctx, cfg: LossConfig) -> _Items:
    members = torch.arange(ctx.num_members, device=ctx.K.device)
    return _Items(lambda d: _member_log_ratio(d, ctx, cfg), ctx.mem_set, ctx.mem_len,
                  ctx.K.index_select(0, ctx.mem_set), torch.ones_like(ctx.mem_len), lambda: ctx.comp_mem, members)


def _token_items(ctx: _Ctx, cfg: LossConfig) -> _Items:
    event = ctx.mem_set.index_select(0, ctx.comp_mem)
    ones = torch.ones(ctx.comp.numel(), dtype=ctx.K.dtype, device=ctx.K.device)
    return _Items(lambda d: d, event, ones, ctx.set_len.index_select(0, event),
                  1.0 / ctx.mem_len.index_select(0, ctx.comp_mem),
                  lambda: torch.arange(ctx.comp.numel(), device=ctx.K.device), ctx.comp_mem)


UNITS: dict[RatioUnit, Callable[[_Ctx, LossConfig], _Items]] = {
    RatioUnit.SET: _set_items,
    RatioUnit.MEMBER: _member_items,
    RatioUnit.TOKEN: _token_items,
}


# --------------------------------------------------------------------------- surrogates


@dataclass
class _Surr:
    """A surrogate's per-item outputs: the objective to maximize and what the diagnostics read."""

    objective: torch.Tensor  # [I] s_i (with grad)
    log_ratio: torch.Tensor  # [I] the unclipped item log-ratio
    ratio: torch.Tensor  # [I] exp of it (clamped in log space)
    clipped_upper: torch.Tensor  # [I] bool: the clip removed this item's gradient (or capped its weight) above
    clipped_lower: torch.Tensor  # [I] bool: ... below


def _dual_clip(surr: torch.Tensor, adv: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """For A < 0 the objective is at least c*A: a bounded gradient (clip and gmpo; refused with cispo)."""
    if cfg.dual_clip is None:
        return surr
    return torch.where(adv < 0, torch.maximum(surr, cfg.dual_clip * adv), surr)


def _clip_surrogate(d: torch.Tensor, items: _Items, adv: torch.Tensor, cfg: LossConfig) -> _Surr:
    """PPO: ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``, optionally dual-clipped."""
    L = items.aggregate(d)
    ratio = L.clamp(-cfg.logratio_clamp, cfg.logratio_clamp).exp()
    surr = _dual_clip(torch.minimum(ratio * adv, ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high) * adv), adv, cfg)
    return _Surr(surr, L, ratio, (ratio > 1 + cfg.eps_high) & (adv > 0), (ratio < 1 - cfg.eps_low) & (adv < 0))


def _cispo_surrogate(d: torch.Tensor, items: _Items, adv: torch.Tensor, cfg: LossConfig) -> _Surr:
    """CISPO: ``sg(clip(rho, 1 - eps_low, 1 + eps_high)) A L``. Its gradient is the clipped IS weight
    times A times the gradient of the log-prob (L differs from log pi_theta by a constant), so
    no item ever loses its gradient; the value is the objective up to that constant."""
    L = items.aggregate(d)
    ratio = L.clamp(-cfg.logratio_clamp, cfg.logratio_clamp).exp()
    weight = ratio.detach().clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    return _Surr(weight * adv * L, L, ratio, ratio > 1 + cfg.eps_high, ratio < 1 - cfg.eps_low)


def _gmpo_surrogate(d: torch.Tensor, items: _Items, adv: torch.Tensor, cfg: LossConfig) -> _Surr:
    """GMPO: token log-ratios clipped in log space to ``[-eps_low, eps_high]`` on the side the
    advantage pushes (sign(A) * min(sign(A) x, sign(A) clip(x))), aggregated by the unit (a
    mean per member: the geometric mean of the token ratios), then ``A * exp(.)``."""
    adv_tok = adv.index_select(0, items.of_token())
    sign = torch.where(adv_tok < 0, -1.0, 1.0).to(d.dtype)
    clipped = sign * torch.minimum(sign * d, sign * d.clamp(-cfg.eps_low, cfg.eps_high))
    L = items.aggregate(d)
    Lc = items.aggregate(clipped)
    c = cfg.logratio_clamp
    item_of = items.of_token()
    n = adv.numel()
    up = torch.zeros(n, dtype=torch.bool, device=d.device).index_put_((item_of,), (clipped < d) & (adv_tok > 0),
                                                                       accumulate=True)
    low = torch.zeros(n, dtype=torch.bool, device=d.device).index_put_((item_of,), (clipped > d) & (adv_tok < 0),
                                                                        accumulate=True)
    # for A < 0 a token log-ratio is clipped only below, so a blown-up ratio is bounded by dual_clip alone
    return _Surr(_dual_clip(adv * Lc.clamp(-c, c).exp(), adv, cfg), L, L.clamp(-c, c).exp(), up, low)


SURROGATES: dict[Surrogate, Callable[[torch.Tensor, _Items, torch.Tensor, LossConfig], _Surr]] = {
    Surrogate.CLIP: _clip_surrogate,
    Surrogate.CISPO: _cispo_surrogate,
    Surrogate.GMPO: _gmpo_surrogate,
}


# --------------------------------------------------------------------------- reductions


WEIGHTS: dict[Reduction, Callable[[_Items, _Ctx, SetBatch], torch.Tensor]] = {
    Reduction.EVENT_MEAN: lambda it, ctx, b: 1.0 / it.per_event,
    Reduction.MEMBER_MEAN: lambda it, ctx, b: it.per_member,
    Reduction.EPISODE_MEAN: lambda it, ctx, b: (
        1.0 / (it.per_event * b.set_episode_events.index_select(0, it.event).to(it.tokens.dtype))
    ),
    Reduction.SET_SIZE: lambda it, ctx, b: ctx.K.index_select(0, it.event) / it.per_event,
    Reduction.TOKEN: lambda it, ctx, b: it.tokens,
    Reduction.CONSTANT: lambda it, ctx, b: torch.ones_like(it.tokens),
}


def _d_constant(b: SetBatch, cfg: LossConfig) -> float:
    """Dr. GRPO's constant: outputs x the longest generation budget of the mini-batch (the paper's
    MAX_TOKENS, TRL's B x max_completion_length): every output's tokens are divided by the same
    number, whatever its agent's own ``max_tokens``."""
    if cfg.constant_denominator is not None:
        return cfg.constant_denominator
    return float(b.num_members * int(b.member_max_tokens.max())) if b.num_members else 1.0


DENOMINATORS: dict[Reduction, Callable[[SetBatch, LossConfig], float]] = {
    Reduction.EVENT_MEAN: lambda b, cfg: float(b.num_sets),
    Reduction.MEMBER_MEAN: lambda b, cfg: float(b.num_members),
    Reduction.EPISODE_MEAN: lambda b, cfg: float(torch.unique(b.set_episode).numel()),
    Reduction.SET_SIZE: lambda b, cfg: float(b.set_size.sum()),
    Reduction.TOKEN: lambda b, cfg: float(b.loss_mask.sum()),
    Reduction.CONSTANT: _d_constant,
}


def loss_denominator(batch: SetBatch, config: LossConfig) -> float:
    """The denominator D of ``config.reduction`` over a whole mini-batch (at least 1).

    Compute it once per mini-batch and pass it to :func:`srpo_loss` for every micro-batch
    (it reads the device, so passing it also keeps the loss free of host syncs).

    Args:
        batch: the mini-batch. config: the loss options.
    Returns:
        D as a float.
    """
    return max(DENOMINATORS[config.reduction](batch, config), 1.0)


# --------------------------------------------------------------------------- the loss


def srpo_loss(
    new_logprobs: torch.Tensor,
    batch: SetBatch,
    config: LossConfig = LossConfig(),
    *,
    denominator: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    diagnostics: bool = True,
) -> tuple[torch.Tensor, LossDiagnostics | None]:
    """The SRPO loss (to minimize) of one (micro-)batch.

    Args:
        new_logprobs: [T] log pi_theta of every token of the packed stream (only completion
            tokens are read), with grad; float32 or float64.
        batch: the SetBatch (moved to ``new_logprobs``'s device if needed).
        config: :class:`LossConfig`.
        denominator: D from :func:`loss_denominator` on the whole mini-batch; None = this batch's.
        ref_logprobs: [T] reference-policy log-probs, needed when ``kl_coef > 0``.
        entropy: [T] per-token entropy of pi_theta, for the diagnostics only.
        diagnostics: compute :class:`LossDiagnostics` (under ``no_grad``, from the loss's own
            intermediates); False returns None in its place and skips that work.
    Returns:
        (loss, diagnostics): a scalar tensor and :class:`LossDiagnostics` (None when
        ``diagnostics=False``). With ``denominator`` given, the loss itself makes one host
        sync (the completion-token ``nonzero``); the diagnostics are tensors too, read only
        by :meth:`LossDiagnostics.to_dict`.
    Raises:
        ValueError: shapes disagree, or ``kl_coef > 0`` without ``ref_logprobs``.

    >>> from srpo_graph.compiler.compile import compile
    >>> from srpo_graph.compiler.synthetic import synthetic_episodes
    >>> b = compile(synthetic_episodes(2, 2, seed=0))
    >>> loss, diag = srpo_loss(b.old_logprobs.clone(), b)   # pi = pi_old: ratio 1, loss = -mean(A)
    >>> round(loss.item(), 5) == round(-b.set_advantage.mean().item(), 5), diag.ratio_max.item()
    (True, 1.0)
    """
    b = batch.to(new_logprobs.device)
    if new_logprobs.shape != (b.num_tokens,):
        raise ValueError(f"new_logprobs has shape {tuple(new_logprobs.shape)}, the batch has {b.num_tokens} tokens")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the reference policy's log-probs)")
    dt = torch.promote_types(new_logprobs.dtype, torch.float32)
    D = loss_denominator(b, config) if denominator is None else float(denominator)
    ctx = _context(b, dt, config.frozen_in_k)

    new_c = new_logprobs.index_select(0, ctx.comp).to(dt)  # [C]; backward: one index_add
    old_c = b.old_logprobs.index_select(0, ctx.comp).to(dt)
    d = new_c - old_c  # [C] token log-ratios
    items = UNITS[config.ratio_unit](ctx, config)
    adv = items.advantage(b, dt)
    sr = SURROGATES[config.surrogate](d, items, adv, config)
    w = WEIGHTS[config.reduction](items, ctx, b).to(dt)
    iw = item_weight(
        old_c - b.sampler_logprobs.index_select(0, ctx.comp).to(dt),
        token_set=ctx.mem_set.index_select(0, ctx.comp_mem),
        num_sets=ctx.num_sets,
        event=items.event,
        aggregate=items.aggregate,
        cfg=config,
        item_of_token=items.of_token(),
    )
    w_pg = w if iw is None else w * iw.weight
    pg_loss = -(w_pg * sr.objective).sum() / D

    k3 = None
    if ref_logprobs is not None:
        c = config.logratio_clamp  # clamped in log space: exp never overflows
        x = (ref_logprobs.index_select(0, ctx.comp).to(dt) - new_c).clamp(-c, c)
        k3 = x.exp() - x - 1  # [C]
        w_kl = w_pg if config.kl_mismatch_weight else w
        tok_w = (w_kl / items.tokens.clamp(min=1)).index_select(0, items.of_token())
        kl_loss = config.kl_coef * (tok_w * k3).sum() / D
        loss = pg_loss + kl_loss
    else:
        kl_loss = torch.zeros((), dtype=dt, device=d.device)
        loss = pg_loss
    if not diagnostics:
        return loss, None
    with torch.no_grad():
        diag = diagnose(
            b,
            item_size=b.set_size.index_select(0, items.event),
            ratio=sr.ratio,
            log_ratio=sr.log_ratio,
            adv=adv,
            clipped_upper=sr.clipped_upper,
            clipped_lower=sr.clipped_lower,
            item_of_token=items.of_token(),
            d=d,
            old_c=old_c,
            comp=ctx.comp,
            comp_mem=ctx.comp_mem,
            loss=loss,
            pg_loss=pg_loss,
            kl_loss=kl_loss,
            k3=k3,
            entropy=entropy,
            weight=iw,
            item_event=items.event,
        )
    return loss, diag
