"""Per-step diagnostics of the SRPO loss (objective stage).

Consumes the intermediate tensors of :func:`srpo_graph.srpo.loss.srpo_loss` (under
``no_grad``) and produces :class:`LossDiagnostics`: tensors, so computing them never forces a
device sync; :meth:`LossDiagnostics.to_dict` turns them into plain floats for a metrics
logger (keys such as ``clip_frac_upper/k2`` for set size 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from srpo_graph.compiler.setbatch import SetBatch


@dataclass
class LossDiagnostics:
    """What one loss evaluation saw. Scalars are 0-d tensors; ``*_by_size`` align with ``sizes``."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl_loss: torch.Tensor
    clip_frac_upper: torch.Tensor  # share of items clipped above (ratio > 1+eps_high, A > 0)
    clip_frac_lower: torch.Tensor  # share of items clipped below (ratio < 1-eps_low, A < 0)
    ratio_min: torch.Tensor
    ratio_max: torch.Tensor
    approx_kl_k3: torch.Tensor  # mean over completion tokens of k3(old || new)
    approx_kl_mean: torch.Tensor  # mean over completion tokens of old - new
    adv_mean: torch.Tensor  # over events
    adv_std: torch.Tensor
    adv_zero_share: torch.Tensor  # events with advantage exactly 0
    mismatch_abs_mean: torch.Tensor  # mean |old - sampler| over completion tokens
    mismatch_abs_max: torch.Tensor
    mismatch_weight_mean: torch.Tensor  # mean set-level correction weight (1 when off)
    mismatch_masked_share: torch.Tensor  # events with weight 0
    sizes: torch.Tensor  # [Z] the set sizes present among the items
    clip_upper_by_size: torch.Tensor  # [Z]
    clip_lower_by_size: torch.Tensor  # [Z]
    log_ratio_mean_by_size: torch.Tensor  # [Z]
    log_ratio_absmax_by_size: torch.Tensor  # [Z]
    ratio_mean_by_size: torch.Tensor  # [Z]
    events_by_size: torch.Tensor  # [Z] number of events of each size
    num_events: int
    num_members: int
    num_tokens: int  # completion tokens
    num_episodes: int
    zero_variance_groups: int  # from the compiler's stats (the whole compiled batch)
    ref_kl: torch.Tensor | None = None  # mean k3 to the reference policy
    entropy_mean: torch.Tensor | None = None
    entropy_by_policy: torch.Tensor | None = None  # [P], aligned with ``policies``
    policies: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, float]:
        """Plain floats for logging; per-size values as ``name/k{size}``, per policy as ``name/{policy}``."""
        out: dict[str, float] = {}
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                out[name] = float(value)
            elif isinstance(value, int):
                out[name] = float(value)
        sizes = self.sizes.tolist()
        for name in ("clip_upper_by_size", "clip_lower_by_size", "log_ratio_mean_by_size",
                     "log_ratio_absmax_by_size", "ratio_mean_by_size", "events_by_size"):
            stem = name.removesuffix("_by_size")
            for k, v in zip(sizes, getattr(self, name).tolist()):
                out[f"{stem}/k{k}"] = float(v)
        if self.entropy_by_policy is not None:
            for p, v in zip(self.policies, self.entropy_by_policy.tolist()):
                out[f"entropy/{p}"] = float(v)
        return out


def _mean(x: torch.Tensor) -> torch.Tensor:
    return x.float().mean() if x.numel() else torch.zeros((), device=x.device)


def _max(x: torch.Tensor, empty: float) -> torch.Tensor:
    return x.max() if x.numel() else torch.full((), empty, device=x.device)


def diagnose(b: SetBatch, *, item_size: torch.Tensor, ratio: torch.Tensor, log_ratio: torch.Tensor,
             adv: torch.Tensor, d: torch.Tensor, old_c: torch.Tensor, comp: torch.Tensor, comp_mem: torch.Tensor,
             eps_low: float, eps_high: float, loss: torch.Tensor, pg_loss: torch.Tensor, kl_loss: torch.Tensor,
             k3: torch.Tensor | None, entropy: torch.Tensor | None,
             set_weight: torch.Tensor | None) -> LossDiagnostics:
    """Assemble :class:`LossDiagnostics` from the loss's intermediates (detached here).

    Reuses what the loss already gathered (completion positions ``comp``, their members,
    the token log-ratios ``d`` and old log-probs ``old_c``); only the sampler's log-probs
    are gathered anew. ``set_weight`` None means the mismatch correction is off (weight 1).
    """
    ratio, log_ratio, adv, d = ratio.detach(), log_ratio.detach(), adv.detach(), d.detach()
    upper = ((ratio > 1 + eps_high) & (adv > 0)).float()
    lower = ((ratio < 1 - eps_low) & (adv < 0)).float()
    # set sizes are small integers (at most M): bin by the size itself, all statistics in
    # one segment sum, then keep the sizes present
    nbins = b.num_members + 1
    stats = torch.stack([torch.ones_like(ratio), upper, lower, log_ratio, ratio], 1).float()
    sums = torch.zeros(nbins, 5, device=ratio.device).index_add_(0, item_size, stats)
    sizes = sums[:, 0].nonzero().squeeze(1)
    sums = sums.index_select(0, sizes)
    by_size = sums[:, 1:] / sums[:, :1]  # [Z, 4]: clip upper, clip lower, log-ratio, ratio means
    absmax = torch.zeros(nbins, device=ratio.device).scatter_reduce_(
        0, item_size, log_ratio.abs().float(), reduce="amax", include_self=False).index_select(0, sizes)
    events_by_size = torch.zeros(nbins, dtype=torch.int64, device=ratio.device).index_add_(
        0, b.set_size, torch.ones_like(b.set_size)).index_select(0, sizes)
    x = -d.float()  # old - new
    mismatch = (old_c - b.sampler_logprobs.index_select(0, comp).to(old_c.dtype)).abs().float()
    set_adv = b.set_advantage.float()
    ent_mean = ent_pol = None
    if entropy is not None:
        ent = entropy.detach().index_select(0, comp).float()
        ent_mean = _mean(ent)
        pol = b.member_policy.index_select(0, comp_mem)
        n_pol = len(b.policies)
        ent_pol = torch.bincount(pol, weights=ent, minlength=n_pol) / torch.bincount(pol, minlength=n_pol).clamp(min=1)
    if set_weight is None:
        weight_mean, masked_share = torch.ones((), device=ratio.device), torch.zeros((), device=ratio.device)
    else:
        weight_mean, masked_share = _mean(set_weight), _mean((set_weight == 0).float())
    return LossDiagnostics(
        loss=loss.detach(), pg_loss=pg_loss.detach(), kl_loss=kl_loss.detach(),
        clip_frac_upper=_mean(upper), clip_frac_lower=_mean(lower),
        ratio_min=-_max(-ratio, -1.0), ratio_max=_max(ratio, 1.0),
        approx_kl_k3=_mean(x.exp() - x - 1), approx_kl_mean=_mean(x),
        adv_mean=_mean(set_adv), adv_std=set_adv.std() if set_adv.numel() > 1 else torch.zeros(()),
        adv_zero_share=_mean((set_adv == 0).float()),
        mismatch_abs_mean=_mean(mismatch), mismatch_abs_max=_max(mismatch, 0.0),
        mismatch_weight_mean=weight_mean, mismatch_masked_share=masked_share,
        sizes=sizes, clip_upper_by_size=by_size[:, 0], clip_lower_by_size=by_size[:, 1],
        log_ratio_mean_by_size=by_size[:, 2], log_ratio_absmax_by_size=absmax,
        ratio_mean_by_size=by_size[:, 3], events_by_size=events_by_size,
        num_events=b.num_sets, num_members=b.num_members, num_tokens=int(comp.numel()),
        num_episodes=int(torch.unique(b.set_episode).numel()),
        zero_variance_groups=int(b.stats.get("zero_variance_groups", 0)),
        ref_kl=_mean(k3.detach()) if k3 is not None else None,
        entropy_mean=ent_mean, entropy_by_policy=ent_pol, policies=list(b.policies),
    )
