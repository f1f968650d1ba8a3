"""Per-step diagnostics of the SRPO loss (objective stage).

Consumes the intermediate tensors of :func:`srpo_graph.srpo.loss.srpo_loss` (under
``no_grad``) and produces :class:`LossDiagnostics`. They hold *sums*, maxima and minima (0-d
tensors, or 1-d bins by set size, agent and policy), never means, so the diagnostics of
several micro-batches, mini-batches and epochs combine exactly (:meth:`LossDiagnostics.combine`):
a clip fraction is the clipped items of the whole mini-batch over its items, not a mean of
per-micro-batch fractions. Nothing here forces a device sync; :meth:`LossDiagnostics.to_dict`
reads them as plain floats (keys such as ``clip_upper/k2`` for set size 2, ``clip_upper/solver``
for an agent).

Per-agent statistics are token-weighted: the share of an agent's completion tokens whose item
(set, member or token, by the ratio unit) was clipped, and the mean item ratio over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch

from srpo_graph.compiler.setbatch import SetBatch
from srpo_graph.srpo.mismatch import ItemWeight

# the keys :func:`diagnose` fills (every one, every time): what a reduction over processes sums
SUM_KEYS = ("loss", "pg_loss", "kl_loss", "items", "clip_upper", "clip_lower", "ratio_sum", "tokens", "k3_old",
            "old_minus_new", "events", "adv", "adv_sq", "adv_zero", "mismatch_abs", "mismatch_weight", "masked",
            "truncated", "tokens_masked", "tokens_clipped", "sets_clipped", "members", "ref_k3", "entropy")
SIZE_KEYS = ("items", "clip_upper", "clip_lower", "log_ratio", "ratio", "events", "is_weight", "is_weight_sq",
             "is_truncated", "is_masked", "log_ratio_sq")
AGENT_KEYS = ("tokens", "clip_upper", "clip_lower", "ratio")


def _pad_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = max(a.numel(), b.numel())
    out = torch.zeros(n, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    out[: a.numel()] += a
    out[: b.numel()] += b.to(a.device)
    return out


def _pad_max(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = max(a.numel(), b.numel())
    out = torch.zeros(n, dtype=a.dtype, device=a.device)
    out[: a.numel()] = a
    out[: b.numel()] = torch.maximum(out[: b.numel()], b.to(a.device))
    return out


@dataclass
class LossDiagnostics:
    """What one or more loss evaluations saw, as sums (see the module docstring).

    ``batches``: mini-batches represented (the loss terms are per mini-batch, so they are
    averaged over it); ``passes``: epochs represented (counts of events, members and tokens
    are per pass).
    """

    sums: dict[str, torch.Tensor]
    size_sums: dict[str, torch.Tensor]  # [Z] bins indexed by set size
    size_absmax: torch.Tensor  # [Z] max |log-ratio| per set size
    agent_sums: dict[str, torch.Tensor]  # [A] aligned with ``agents``
    entropy_by_policy_sum: torch.Tensor | None  # [P]
    tokens_by_policy: torch.Tensor | None  # [P]
    ratio_lo: torch.Tensor
    ratio_hi: torch.Tensor
    mismatch_max: torch.Tensor
    has_ref: bool
    has_entropy: bool
    agents: list[str] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    zero_variance_groups: int = 0
    batches: int = 1
    passes: int = 1
    weight_hi: torch.Tensor | None = None  # max uncapped importance weight (None: no correction)

    # -- combining -------------------------------------------------------------------

    @classmethod
    def combine(cls, parts: Sequence["LossDiagnostics"], how: Literal["micro", "mini", "epoch"]) -> "LossDiagnostics":
        """Exact diagnostics of several evaluations: the micro-batches of one mini-batch
        (``micro``), the mini-batches of one epoch (``mini``) or several epochs (``epoch``)."""
        if not parts:
            raise ValueError("nothing to combine")
        first = parts[0]
        out = cls(**{**first.__dict__, "sums": dict(first.sums), "size_sums": dict(first.size_sums),
                     "agent_sums": dict(first.agent_sums)})
        for p in parts[1:]:
            for k in out.sums:
                out.sums[k] = out.sums[k] + p.sums[k].to(out.sums[k].device)
            for k in out.size_sums:
                out.size_sums[k] = _pad_add(out.size_sums[k], p.size_sums[k])
            for k in out.agent_sums:
                out.agent_sums[k] = _pad_add(out.agent_sums[k], p.agent_sums[k])
            out.size_absmax = _pad_max(out.size_absmax, p.size_absmax)
            if (out.entropy_by_policy_sum is not None and p.entropy_by_policy_sum is not None
                    and out.tokens_by_policy is not None and p.tokens_by_policy is not None):  # set together
                out.entropy_by_policy_sum = _pad_add(out.entropy_by_policy_sum, p.entropy_by_policy_sum)
                out.tokens_by_policy = _pad_add(out.tokens_by_policy, p.tokens_by_policy)
            out.ratio_lo = torch.minimum(out.ratio_lo, p.ratio_lo.to(out.ratio_lo.device))
            out.ratio_hi = torch.maximum(out.ratio_hi, p.ratio_hi.to(out.ratio_hi.device))
            out.mismatch_max = torch.maximum(out.mismatch_max, p.mismatch_max.to(out.mismatch_max.device))
            if out.weight_hi is not None and p.weight_hi is not None:
                out.weight_hi = torch.maximum(out.weight_hi, p.weight_hi.to(out.weight_hi.device))
            if how != "micro":
                out.batches += p.batches
            if how == "epoch":
                out.passes += p.passes
        return out

    # -- derived values (0-d tensors) -----------------------------------------------------

    def _ratio(self, num: str, den: str) -> torch.Tensor:
        return self.sums[num] / self.sums[den].clamp(min=1)

    @property
    def loss(self) -> torch.Tensor:
        return self.sums["loss"] / self.batches

    @property
    def pg_loss(self) -> torch.Tensor:
        return self.sums["pg_loss"] / self.batches

    @property
    def kl_loss(self) -> torch.Tensor:
        return self.sums["kl_loss"] / self.batches

    @property
    def clip_frac_upper(self) -> torch.Tensor:
        """Share of items clipped above (ratio > 1 + eps_high with A > 0; CISPO: weight capped)."""
        return self._ratio("clip_upper", "items")

    @property
    def clip_frac_lower(self) -> torch.Tensor:
        return self._ratio("clip_lower", "items")

    @property
    def clip_frac(self) -> torch.Tensor:
        return self.clip_frac_upper + self.clip_frac_lower

    @property
    def ratio_mean(self) -> torch.Tensor:
        return self._ratio("ratio_sum", "items")

    @property
    def ratio_min(self) -> torch.Tensor:
        return self.ratio_lo

    @property
    def ratio_max(self) -> torch.Tensor:
        return self.ratio_hi

    @property
    def approx_kl_k3(self) -> torch.Tensor:
        """Mean over completion tokens of k3 = r - 1 - log r, r = pi_new/pi_old: unbiased for
        KL(pi_old || pi_new) on tokens sampled from pi_old (Note [k3 orientation])."""
        return self._ratio("k3_old", "tokens")

    @property
    def approx_kl_mean(self) -> torch.Tensor:
        """Mean over completion tokens of log pi_old - log pi_new (k1): also unbiased for
        KL(pi_old || pi_new), with a higher variance and possibly negative."""
        return self._ratio("old_minus_new", "tokens")

    @property
    def adv_mean(self) -> torch.Tensor:
        return self._ratio("adv", "events")

    @property
    def adv_std(self) -> torch.Tensor:
        n = self.sums["events"]
        var = (self.sums["adv_sq"] - self.sums["adv"] ** 2 / n.clamp(min=1)) / (n - 1).clamp(min=1)
        return var.clamp(min=0).sqrt()

    @property
    def adv_zero_share(self) -> torch.Tensor:
        return self._ratio("adv_zero", "events")

    @property
    def mismatch_abs_mean(self) -> torch.Tensor:
        return self._ratio("mismatch_abs", "tokens")

    @property
    def mismatch_abs_max(self) -> torch.Tensor:
        return self.mismatch_max

    @property
    def mismatch_weight_mean(self) -> torch.Tensor:
        """Mean applied importance weight over items (events for the set unit)."""
        return self._ratio("mismatch_weight", "items")

    @property
    def mismatch_masked_share(self) -> torch.Tensor:
        """Share of events with at least one item masked (weight 0)."""
        return self._ratio("masked", "events")

    @property
    def tokens_masked_share(self) -> torch.Tensor:
        """Share of completion tokens whose item was masked."""
        return self._ratio("tokens_masked", "tokens")

    @property
    def truncated_share(self) -> torch.Tensor:
        """Share of items whose importance weight was truncated at C."""
        return self._ratio("truncated", "items")

    @property
    def tokens_clipped_share(self) -> torch.Tensor:
        """Share of completion tokens whose item was clipped (either side)."""
        return self._ratio("tokens_clipped", "tokens")

    @property
    def sets_clipped_share(self) -> torch.Tensor:
        """Share of events with at least one item clipped (either side)."""
        return self._ratio("sets_clipped", "events")

    @property
    def ref_kl(self) -> torch.Tensor | None:
        return self._ratio("ref_k3", "tokens") if self.has_ref else None

    @property
    def entropy_mean(self) -> torch.Tensor | None:
        return self._ratio("entropy", "tokens") if self.has_entropy else None

    @property
    def entropy_by_policy(self) -> torch.Tensor | None:
        if self.entropy_by_policy_sum is None or self.tokens_by_policy is None:  # set together
            return None
        return self.entropy_by_policy_sum / self.tokens_by_policy.clamp(min=1)

    @property
    def num_events(self) -> int:
        return round(float(self.sums["events"]) / self.passes)

    @property
    def num_members(self) -> int:
        return round(float(self.sums["members"]) / self.passes)

    @property
    def num_tokens(self) -> int:
        return round(float(self.sums["tokens"]) / self.passes)

    # per set size, aligned with ``sizes``
    @property
    def sizes(self) -> torch.Tensor:
        return self.size_sums["items"].nonzero().squeeze(1)

    def _by_size(self, key: str) -> torch.Tensor:
        z = self.sizes
        return self.size_sums[key].index_select(0, z) / self.size_sums["items"].index_select(0, z)

    @property
    def clip_upper_by_size(self) -> torch.Tensor:
        return self._by_size("clip_upper")

    @property
    def clip_lower_by_size(self) -> torch.Tensor:
        return self._by_size("clip_lower")

    @property
    def log_ratio_mean_by_size(self) -> torch.Tensor:
        return self._by_size("log_ratio")

    @property
    def ratio_mean_by_size(self) -> torch.Tensor:
        return self._by_size("ratio")

    @property
    def log_ratio_rms_by_size(self) -> torch.Tensor:
        """Root mean square of the item log-ratio per set size: its spread (the set ratio's, normalised
        by K^alpha, for the set unit), what decides how often a size's sets reach the clip."""
        return self._by_size("log_ratio_sq").sqrt()

    @property
    def log_ratio_absmax_by_size(self) -> torch.Tensor:
        return self.size_absmax.index_select(0, self.sizes)

    @property
    def events_by_size(self) -> torch.Tensor:
        return (self.size_sums["events"].index_select(0, self.sizes) / self.passes).round().long()

    def to_dict(self) -> dict[str, float]:
        """Plain floats for logging; per size as ``name/k{size}``, per agent ``name/{agent}``, per
        policy ``entropy/{policy}``."""
        out: dict[str, float] = {}
        for name in ("loss", "pg_loss", "kl_loss", "clip_frac", "clip_frac_upper", "clip_frac_lower", "ratio_mean",
                     "ratio_min", "ratio_max", "approx_kl_k3", "approx_kl_mean", "adv_mean", "adv_std",
                     "adv_zero_share", "mismatch_abs_mean", "mismatch_abs_max", "mismatch_weight_mean",
                     "mismatch_masked_share", "tokens_masked_share", "truncated_share", "tokens_clipped_share",
                     "sets_clipped_share", "ref_kl", "entropy_mean"):
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value)
        out.update(num_events=float(self.num_events), num_members=float(self.num_members),
                   num_tokens=float(self.num_tokens), zero_variance_groups=float(self.zero_variance_groups))
        sizes = self.sizes.tolist()
        for name in ("clip_upper_by_size", "clip_lower_by_size", "log_ratio_mean_by_size",
                     "log_ratio_absmax_by_size", "log_ratio_rms_by_size", "ratio_mean_by_size", "events_by_size"):
            stem = name.removesuffix("_by_size")
            for k, v in zip(sizes, getattr(self, name).tolist()):
                out[f"{stem}/k{k}"] = float(v)
        if self.weight_hi is not None:  # importance-weight statistics, overall and by set size
            out["is_weight_max"] = float(self.weight_hi)
            z = self.sizes
            n_z = self.size_sums["items"].index_select(0, z)
            mean = self.size_sums["is_weight"].index_select(0, z) / n_z
            var = (self.size_sums["is_weight_sq"].index_select(0, z) / n_z - mean * mean).clamp(min=0)
            for k, m, v, t, x in zip(sizes, mean.tolist(), var.sqrt().tolist(), self._by_size("is_truncated").tolist(),
                                     self._by_size("is_masked").tolist()):
                out.update({f"is_weight_mean/k{k}": m, f"is_weight_std/k{k}": v, f"is_truncated/k{k}": t,
                            f"is_masked/k{k}": x})
        tok = self.agent_sums["tokens"]
        for i, agent in enumerate(self.agents[: tok.numel()]):
            n = float(tok[i])
            if n > 0:
                for key in ("clip_upper", "clip_lower", "ratio"):
                    name = f"{key}/{agent}" if key != "ratio" else f"ratio_mean/{agent}"
                    out[name] = float(self.agent_sums[key][i]) / n
        ent = self.entropy_by_policy
        if ent is not None:
            for p, v in zip(self.policies, ent.tolist()):
                out[f"entropy/{p}"] = float(v)
        return out


def diagnose(
    b: SetBatch,
    *,
    item_size: torch.Tensor,
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    clipped_upper: torch.Tensor,
    clipped_lower: torch.Tensor,
    item_of_token: torch.Tensor,
    d: torch.Tensor,
    old_c: torch.Tensor,
    comp: torch.Tensor,
    comp_mem: torch.Tensor,
    loss: torch.Tensor,
    pg_loss: torch.Tensor,
    kl_loss: torch.Tensor,
    k3: torch.Tensor | None,
    entropy: torch.Tensor | None,
    weight: ItemWeight | None,
    item_event: torch.Tensor,
) -> LossDiagnostics:
    """Assemble :class:`LossDiagnostics` from the loss's intermediates (detached here).

    Reuses what the loss already gathered (completion positions ``comp``, their members,
    the token log-ratios ``d`` and old log-probs ``old_c``, the surrogate's clip flags);
    only the sampler's log-probs are gathered anew. ``weight`` (the items' importance weights)
    None means the mismatch correction is off (weight 1); ``item_event`` [I] is each item's event.
    """
    dev = ratio.device
    f = torch.float32  # per-item and per-token work in float32; the sums are kept in float64
    ratio, log_ratio, d = ratio.detach().to(f), log_ratio.detach().to(f), d.detach().to(f)
    upper, lower = clipped_upper.to(f), clipped_lower.to(f)
    nbins = b.num_members + 1  # set sizes are at most M: bin by the size itself (no host sync)
    stats = torch.stack([upper, lower, log_ratio, ratio, log_ratio * log_ratio], 1)
    bins = torch.zeros(nbins, 5, dtype=f, device=dev).index_add_(0, item_size, stats)
    items_by_size = torch.bincount(item_size, minlength=nbins).to(f)
    absmax = torch.zeros(nbins, dtype=f, device=dev).scatter_reduce_(
        0, item_size, log_ratio.abs(), reduce="amax", include_self=True
    )
    events_by_size = torch.bincount(b.set_size.to(dev), minlength=nbins).to(f)
    # Note [k3 orientation]: tokens were sampled from pi_old, so with r = pi_new/pi_old (x = new - old,
    # E_old[r] = 1) k3 = r - 1 - log r is unbiased for KL(pi_old || pi_new). The other orientation
    # (x = old - new) has expectation chi^2(pi_old || pi_new) - KL, not a KL. Clamped above only:
    # exp must not overflow, and a very negative x (a token pi_new now excludes) stays finite.
    x = d.clamp(max=20.0)  # new - old
    mismatch = (old_c.detach().to(f) - b.sampler_logprobs.index_select(0, comp).to(f)).abs()
    set_adv = b.set_advantage.to(f)
    # per agent, token-weighted: each completion token carries its item's clip flags and ratio
    n_agents = max(len(b.agents), 1)
    tok_agent = b.member_agent.index_select(0, comp_mem)
    per_tok = torch.stack([upper, lower, ratio], 1).index_select(0, item_of_token)
    agent_bins = torch.zeros(n_agents, 3, dtype=f, device=dev).index_add_(0, tok_agent, per_tok)
    agent_tokens = torch.bincount(tok_agent, minlength=n_agents).to(f)
    ent_sum = tok_pol = None
    ent = entropy.detach().index_select(0, comp).to(f) if entropy is not None else None
    if ent is not None:
        pol = b.member_policy.index_select(0, comp_mem)
        n_pol = max(len(b.policies), 1)
        ent_sum = torch.zeros(n_pol, dtype=f, device=dev).index_add_(0, pol, ent)
        tok_pol = torch.bincount(pol, minlength=n_pol).to(f)
    zero = torch.zeros((), dtype=f, device=dev)
    n_sets = b.num_sets
    clipped = (upper + lower) > 0
    sets_clipped = torch.zeros(n_sets, dtype=f, device=dev).index_add_(0, item_event, clipped.to(f)) > 0
    if weight is None:
        iw = torch.ones_like(ratio)
        trunc = masked_items = torch.zeros_like(ratio, dtype=torch.bool)
    else:
        iw, trunc, masked_items = weight.weight.detach().to(f), weight.truncated, weight.masked
    sets_masked = torch.zeros(n_sets, dtype=f, device=dev).index_add_(0, item_event, masked_items.to(f)) > 0
    w64 = iw.to(torch.float64)  # float64: the std by size is sqrt(E[w^2] - E[w]^2), near 0 on-policy
    w_bins = torch.zeros(nbins, 4, dtype=torch.float64, device=dev).index_add_(
        0, item_size, torch.stack([w64, w64 * w64, trunc.to(torch.float64), masked_items.to(torch.float64)], 1)
    )
    n_items, n_tok = float(ratio.numel()), float(comp.numel())
    sums = {
        k: v.to(torch.float64)
        for k, v in {
            "loss": loss.detach(),
            "pg_loss": pg_loss.detach(),
            "kl_loss": kl_loss.detach(),
            "items": torch.tensor(n_items, device=dev),
            "clip_upper": upper.sum(),
            "clip_lower": lower.sum(),
            "ratio_sum": ratio.sum(),
            "tokens": torch.tensor(n_tok, device=dev),
            "k3_old": (x.exp() - x - 1).sum(),
            "old_minus_new": -d.sum(),
            "events": torch.tensor(float(b.num_sets), device=dev),
            "adv": set_adv.sum(),
            "adv_sq": (set_adv * set_adv).sum(),
            "adv_zero": (set_adv == 0).sum(),
            "mismatch_abs": mismatch.sum(),
            "mismatch_weight": iw.sum(),
            "masked": sets_masked.sum(),
            "truncated": trunc.sum(),
            "tokens_masked": masked_items.index_select(0, item_of_token).sum(),
            "tokens_clipped": clipped.index_select(0, item_of_token).sum(),
            "sets_clipped": sets_clipped.sum(),
            "members": torch.tensor(float(b.num_members), device=dev),
            "ref_k3": k3.detach().sum() if k3 is not None else zero,
            "entropy": ent.sum() if ent is not None else zero,
        }.items()
    }
    return LossDiagnostics(
        sums=sums,
        size_sums={
            "items": items_by_size,
            "clip_upper": bins[:, 0],
            "clip_lower": bins[:, 1],
            "log_ratio": bins[:, 2],
            "ratio": bins[:, 3],
            "events": events_by_size,
            "is_weight": w_bins[:, 0],
            "is_weight_sq": w_bins[:, 1],
            "is_truncated": w_bins[:, 2],
            "is_masked": w_bins[:, 3],
            "log_ratio_sq": bins[:, 4],
        },
        size_absmax=absmax,
        agent_sums={
            "tokens": agent_tokens,
            "clip_upper": agent_bins[:, 0],
            "clip_lower": agent_bins[:, 1],
            "ratio": agent_bins[:, 2],
        },
        entropy_by_policy_sum=ent_sum,
        tokens_by_policy=tok_pol,
        ratio_lo=ratio.min() if ratio.numel() else torch.ones((), dtype=f, device=dev),
        ratio_hi=ratio.max() if ratio.numel() else torch.ones((), dtype=f, device=dev),
        mismatch_max=mismatch.max() if mismatch.numel() else zero,
        has_ref=k3 is not None,
        has_entropy=entropy is not None,
        agents=list(b.agents),
        policies=list(b.policies),
        zero_variance_groups=b.stats.zero_variance_groups,
        weight_hi=None if weight is None else (weight.raw.detach().to(f).max() if weight.raw.numel() else zero),
    )


def staleness_histogram(b: SetBatch, current: dict[str, int]) -> dict[str, float]:
    """How many weight versions old each output of the batch was when the update uses it.

    Staleness of member m = ``current[policy of m] - member_policy_version[m]`` (0 in synchronous
    training). Returns ``{"mean", "max", "s{k}": share of members with staleness k,
    "tokens_s{k}": share of completion tokens}``; empty for an empty batch. A member whose
    policy is missing from ``current`` counts as staleness 0.
    """
    if b.num_members == 0:
        return {}
    cur = torch.tensor([current.get(p, 0) for p in b.policies] or [0], dtype=torch.int64)
    stale = (cur.index_select(0, b.member_policy.cpu()) - b.member_policy_version.cpu()).clamp(min=0)
    mask = b.loss_mask.cpu()
    prefix = torch.zeros(b.num_tokens + 1, dtype=torch.int64)
    torch.cumsum(mask.to(torch.int64), 0, out=prefix[1:])
    off = prefix.index_select(0, b.member_offsets.cpu())
    tokens = (off[1:] - off[:-1]).to(torch.float64)
    n_tok = max(float(tokens.sum()), 1.0)
    out = {"mean": float(stale.double().mean()), "max": float(stale.max())}
    for k in torch.unique(stale).tolist():
        sel = stale == k
        out[f"s{k}"] = float(sel.double().mean())
        out[f"tokens_s{k}"] = float(tokens[sel].sum()) / n_tok
    return out
