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


def diagnose(b: SetBatch, *, item_size: torch.Tensor, ratio: torch.Tensor, log_ratio: torch.Tensor,
             adv: torch.Tensor, d: torch.Tensor, comp: torch.Tensor, comp_mem: torch.Tensor, eps_low: float,
             eps_high: float, loss: torch.Tensor, pg_loss: torch.Tensor, kl_loss: torch.Tensor,
             k3: torch.Tensor | None, entropy: torch.Tensor | None, set_weight: torch.Tensor) -> LossDiagnostics:
    """Assemble :class:`LossDiagnostics` from the loss's intermediates (all detached here)."""
    ratio, log_ratio, adv, d = ratio.detach(), log_ratio.detach(), adv.detach(), d.detach()
    upper = ((ratio > 1 + eps_high) & (adv > 0)).float()
    lower = ((ratio < 1 - eps_low) & (adv < 0)).float()
    # set sizes are small integers: bin by the size itself (no sort), then keep sizes present
    raw_count = torch.bincount(item_size)
    sizes = raw_count.nonzero().squeeze(1)
    count = raw_count[sizes].float()

    def by_size(x: torch.Tensor) -> torch.Tensor:
        return torch.bincount(item_size, weights=x.float(), minlength=raw_count.numel())[sizes] / count

    absmax = torch.zeros(raw_count.numel(), device=ratio.device).scatter_reduce_(
        0, item_size, log_ratio.abs().float(), reduce="amax", include_self=False)[sizes]
    set_sizes = b.set_size
    events_by_size = (set_sizes.unsqueeze(1) == sizes.unsqueeze(0)).sum(0)
    x = -d.float()  # old - new
    mismatch = (b.old_logprobs[comp] - b.sampler_logprobs[comp]).abs().float()
    set_adv = b.set_advantage.float()
    ent_mean = ent_pol = None
    if entropy is not None:
        ent = entropy.detach()[comp].float()
        ent_mean = _mean(ent)
        pol = b.member_policy[comp_mem]
        n_pol = max(len(b.policies), int(pol.max()) + 1 if pol.numel() else 0)
        ent_pol = torch.bincount(pol, weights=ent, minlength=n_pol) / torch.bincount(pol, minlength=n_pol).clamp(min=1)
    return LossDiagnostics(
        loss=loss.detach(), pg_loss=pg_loss.detach(), kl_loss=kl_loss.detach(),
        clip_frac_upper=_mean(upper), clip_frac_lower=_mean(lower),
        ratio_min=ratio.min() if ratio.numel() else torch.ones(()), ratio_max=ratio.max() if ratio.numel() else torch.ones(()),
        approx_kl_k3=_mean(x.exp() - x - 1), approx_kl_mean=_mean(x),
        adv_mean=_mean(set_adv), adv_std=set_adv.std() if set_adv.numel() > 1 else torch.zeros(()),
        adv_zero_share=_mean((set_adv == 0).float()),
        mismatch_abs_mean=_mean(mismatch), mismatch_abs_max=mismatch.max() if mismatch.numel() else torch.zeros(()),
        mismatch_weight_mean=_mean(set_weight), mismatch_masked_share=_mean((set_weight == 0).float()),
        sizes=sizes, clip_upper_by_size=by_size(upper), clip_lower_by_size=by_size(lower),
        log_ratio_mean_by_size=by_size(log_ratio), log_ratio_absmax_by_size=absmax,
        ratio_mean_by_size=by_size(ratio), events_by_size=events_by_size,
        num_events=b.num_sets, num_members=b.num_members, num_tokens=int(comp.numel()),
        num_episodes=int(torch.unique(b.set_episode).numel()),
        zero_variance_groups=int(b.stats.get("zero_variance_groups", 0)),
        ref_kl=_mean(k3.detach()) if k3 is not None else None,
        entropy_mean=ent_mean, entropy_by_policy=ent_pol, policies=list(b.policies),
    )
