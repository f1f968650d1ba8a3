"""``LossConfig``: the options of the SRPO objective and its baselines, and their enums (objective stage).

Consumed by :func:`~srpo_graph.srpo.loss.srpo_loss` (each option picks a variant from one of
``loss.py``'s tables: ``UNITS``, ``SURROGATES``, ``WEIGHTS``/``DENOMINATORS``; ``mismatch.py``'s
corrections), by the rows of ``objectives.OBJECTIVES`` (a named objective's loss part) and by
the training config's ``loss`` section. No torch: this module knows the options, their units
and ranges, not how the loss computes them.

>>> LossConfig().alpha, LossConfig(ratio_unit="token").ratio_unit
(0.5, <RatioUnit.TOKEN: 'token'>)
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class RatioUnit(str, Enum):
    TOKEN = "token"
    MEMBER = "member"
    SET = "set"


class MemberLogRatio(str, Enum):
    SUM = "sum"  # masked token sum (the paper)
    MEAN = "mean"  # length-normalized (GSPO)


class Reduction(str, Enum):
    EVENT_MEAN = "event_mean"  # mean over events (the paper); items of an event share its weight
    MEMBER_MEAN = "member_mean"  # mean over members (GRPO's per-output mean)
    EPISODE_MEAN = "episode_mean"  # mean over events per episode, then over episodes
    SET_SIZE = "set_size"  # events weighted by K_e, / sum K
    TOKEN = "token"  # items weighted by their completion tokens, / all completion tokens (DAPO)
    CONSTANT = "constant"  # plain sum / a constant (Dr. GRPO)


class Surrogate(str, Enum):
    CLIP = "clip"  # PPO's min(rho A, clip(rho) A) (SRPO, GRPO, DAPO, GSPO)
    CISPO = "cispo"  # sg(clip(rho)) A log-ratio: the IS weight is clipped, no item loses its gradient
    GMPO = "gmpo"  # A exp(agg(clip_log(token log-ratios))): geometric mean, tokens clipped in log space


class Mismatch(str, Enum):
    NONE = "none"
    TIS = "tis"  # truncated event-level importance weight min(exp(H_e), C)
    MASK = "mask"  # drop the whole event when exp(H_e) leaves [C_low, C]
    DECOUPLED = "decoupled"  # decoupled PPO: ratio to pi_old (proximal), weight pi_old / mu per item


class DecoupledCap(str, Enum):
    TRUNCATE = "truncate"  # min(w, C)
    MASK = "mask"  # w = 0 outside [mismatch_low or 0, C] (AReaL)
    NONE = "none"  # untruncated


class DecoupledWeight(str, Enum):
    NORMALIZED = "normalized"  # pi_prox / mu aggregated like the ratio: the set's (pi_prox(S)/mu(S))^(K^-alpha)
    JOINT = "joint"  # the item's full probability ratio exp(sum of its token gaps): the set's pi_prox(S)/mu(S)


class LossConfig(BaseModel):
    """Options of :func:`~srpo_graph.srpo.loss.srpo_loss`; the defaults are the SRPO paper's (where known).

    A named objective's options: ``objectives.loss_preset(name)``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ratio_unit: RatioUnit = Field(RatioUnit.SET, description="What one ratio and one clip cover: token | member | set.")
    alpha: float = Field(0.5, ge=0.0, le=2.0, description=(
        "Set log-ratio scale K^(-alpha), unitless in [0, 2]: 0.5 = sqrt(K) (paper), 1 = mean, 0 = sum. "
        "Used only by the set unit."))
    member_logratio: MemberLogRatio = Field(MemberLogRatio.SUM, description=(
        "Member log-ratio: token 'sum' (paper) or length-normalized 'mean' (GSPO)."))
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip: ratio >= 1 - eps_low; unitless in [0, 1].")
    eps_high: float = Field(0.2, ge=0.0, le=10.0, description="Upper clip: ratio <= 1 + eps_high; DAPO uses 0.28.")
    reduction: Reduction = Field(Reduction.EVENT_MEAN, description="Item weights and denominator; see Reduction.")
    surrogate: Surrogate = Field(Surrogate.CLIP, description=(
        "The per-item objective (SURROGATES): 'clip' (PPO), 'cispo' (clipped stop-gradient IS weight x "
        "log-ratio), 'gmpo' (geometric mean, token log-ratios clipped to [-eps_low, eps_high])."))
    dual_clip: float | None = Field(None, gt=1.0, description=(
        "Dual-clip c > 1 for negative advantages: the surrogate is at least c*A, bounding the gradient of an "
        "event whose ratio blew up (verl uses 3); None = off. With surrogate 'clip' or 'gmpo' (both leave a "
        "negative-advantage ratio unbounded above); refused with 'cispo', whose weight is already capped."))
    constant_denominator: float | None = Field(None, gt=0.0, description=(
        "D of the 'constant' reduction; None = outputs x the largest max_new_tokens of the mini-batch's "
        "outputs (Dr. GRPO's MAX_TOKENS; TRL's B x max_completion_length), also with agents of different budgets."))
    logratio_clamp: float = Field(
        20.0, gt=0.0, le=80.0, description="Log-ratios are clamped to +-this before exp (nats)."
    )
    kl_coef: float = Field(0.0, ge=0.0, description="Weight of the k3 KL to a reference policy (GRPO: 0.04); 0 = off.")
    kl_mismatch_weight: bool = Field(
        False,
        description=(
            "Also multiply the KL term by the set-level mismatch weight (off: the KL regularizes every token as "
            "sampled)."
        ),
    )
    frozen_in_k: bool = Field(
        False,
        description=(
            "Count the members of frozen/external policies in K for the set log-ratio scale K^(-alpha) "
            "(their log-ratio is 0 either way). False (default) = K counts the trainable members only, so a "
            "solver whose output a frozen verifier reads is normalized as if alone (docs/algorithm.md, "
            "'Frozen members'); True = K is the whole active set's size."
        ),
    )
    mismatch: Mismatch = Field(
        Mismatch.NONE,
        description=(
            "Sampler/trainer (or stale-rollout) correction: none | tis | mask (one event-level weight exp(H_e) "
            "on pi_old / sampler) | decoupled (decoupled PPO, AReaL: the ratio's denominator is pi_old, the "
            "trainer's proximal policy, and the sampler's log-probs enter only an importance weight pi_old / "
            "sampler of the ratio unit's own items; docs/algorithm.md). Unset, a training run resolves it: "
            "decoupled with rollout.max_staleness >= 1 on every backend (none is then refused), else the "
            "backend's default (tis on sglang, none on transformers)."
        ),
    )
    mismatch_threshold: float = Field(
        2.0,
        gt=1.0,
        description=(
            "C: the TIS cap and the mask's upper bound on exp(H_e); with 'decoupled', the cap of the item weight."
        ),
    )
    mismatch_low: float | None = Field(
        None, gt=0.0, lt=1.0, description=("The mask's lower bound; None = 1/C (mask) or 0 (decoupled_cap = mask).")
    )
    decoupled_cap: DecoupledCap = Field(
        DecoupledCap.TRUNCATE,
        description=(
            "With mismatch = decoupled: 'truncate' the item weight at C, 'mask' items whose weight exceeds C "
            "(AReaL's behav_imp_weight_cap; also below mismatch_low when set), or 'none' (untruncated)."
        ),
    )

    decoupled_weight: DecoupledWeight = Field(
        DecoupledWeight.NORMALIZED,
        description=(
            "With mismatch = decoupled, the behaviour weight of an item: 'normalized' = pi_old / sampler aggregated "
            "like the ratio (set unit: (pi_old(S)/mu(S))^(K^-alpha); member mean: the length-normalized mean), so "
            "ratio x weight is the unit's own ratio against the sampler, with its variance; 'joint' = the item's "
            "full probability ratio exp(sum of its token gaps) (set unit: pi_old(S)/mu(S), the set's importance "
            "weight as one action; larger: 2.23 vs 1.49 at 0.2 nats per member, K = 4). Same for the token unit "
            "and for member sums (docs/algorithm.md, 'The behaviour weight of a set')."
        ),
    )

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_needs_the_clip(cls, v: float | None, info: ValidationInfo) -> float | None:
        surrogate = info.data.get("surrogate", Surrogate.CLIP)
        if v is not None and surrogate is Surrogate.CISPO:
            raise ValueError(
                "dual_clip does nothing with the 'cispo' surrogate (its stop-gradient weight is already capped at "
                "1 + eps_high, so the gradient is bounded): remove dual_clip, or use surrogate 'clip' or 'gmpo'"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> "LossConfig":
        if self.mismatch_low is not None and self.mismatch_low >= self.mismatch_threshold:
            raise ValueError("mismatch_low must be below mismatch_threshold")
        return self


__all__ = ["DecoupledCap", "LossConfig", "MemberLogRatio", "Mismatch", "RatioUnit", "Reduction", "Surrogate"]
