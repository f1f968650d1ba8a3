"""srpo_loss against an independent, naive per-event Python implementation (values and grads).

The reference below loops over events, members and tokens with Python floats / scalar
autograd in float64; it shares nothing with the vectorized code but the SetBatch it reads.
"""

from __future__ import annotations

import math

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.objectives import OBJECTIVES, loss_preset
from srpo_graph.srpo.options import LossConfig, MemberLogRatio, Mismatch, RatioUnit, Reduction, Surrogate


def naive_loss(new: torch.Tensor, b, cfg: LossConfig, ref: torch.Tensor | None = None) -> torch.Tensor:
    offsets = b.member_offsets.tolist()
    mask = b.loss_mask.tolist()
    old = b.old_logprobs.double().tolist()
    sampler = b.sampler_logprobs.double().tolist()
    member_set = b.member_set.tolist()
    adv = b.set_advantage.double().tolist()
    member_adv = b.member_advantage.double().tolist()
    set_episode = b.set_episode.tolist()
    S, M = b.num_sets, b.num_members
    events_of_episode: dict[int, int] = {}
    for e in set_episode:
        events_of_episode[e] = events_of_episode.get(e, 0) + 1
    members_of = {s: [m for m in range(M) if member_set[m] == s] for s in range(S)}
    toks_of = {m: [t for t in range(offsets[m], offsets[m + 1]) if mask[t]] for m in range(M)}
    # denominator
    if cfg.reduction == Reduction.EVENT_MEAN:
        D = S
    elif cfg.reduction in (Reduction.MEMBER_MEAN, Reduction.SET_SIZE):
        D = M
    elif cfg.reduction == Reduction.EPISODE_MEAN:
        D = len(events_of_episode)
    elif cfg.reduction == Reduction.TOKEN:
        D = sum(mask)
    else:
        D = cfg.constant_denominator or sum(b.member_max_tokens.tolist())
    c = cfg.logratio_clamp
    total = 0.0
    kl_total = 0.0
    for s in range(S):
        ms = members_of[s]
        K = len(ms)
        A = adv[s]
        # the set-level mismatch weight
        H = sum(old[t] - sampler[t] for m in ms for t in toks_of[m])
        rH = math.exp(max(-c, min(c, H)))
        if cfg.mismatch == Mismatch.TIS:
            wm = min(rH, cfg.mismatch_threshold)
        elif cfg.mismatch == Mismatch.MASK:
            low = cfg.mismatch_low or 1 / cfg.mismatch_threshold
            wm = 1.0 if low <= rH <= cfg.mismatch_threshold else 0.0
        else:
            wm = 1.0
        # items: (log_ratio, tokens covered, member or None)
        items = []
        if cfg.ratio_unit == RatioUnit.SET:
            L = 0.0
            for m in ms:
                ell = sum(new[t] - old[t] for t in toks_of[m])
                if cfg.member_logratio == MemberLogRatio.MEAN:
                    ell = ell / max(len(toks_of[m]), 1)
                L = L + ell
            items.append((L * K ** (-cfg.alpha), [t for m in ms for t in toks_of[m]], None))
        elif cfg.ratio_unit == RatioUnit.MEMBER:
            for m in ms:
                ell = sum(new[t] - old[t] for t in toks_of[m])
                if cfg.member_logratio == MemberLogRatio.MEAN:
                    ell = ell / max(len(toks_of[m]), 1)
                items.append((ell, toks_of[m], m))
        else:
            for m in ms:
                for t in toks_of[m]:
                    items.append((new[t] - old[t], [t], m))
        for lr, toks, m in items:
            if cfg.reduction == Reduction.EVENT_MEAN:
                w = 1 / len(items)
            elif cfg.reduction == Reduction.MEMBER_MEAN:
                w = K if m is None else 1 / sum(1 for it in items if it[2] == m)
            elif cfg.reduction == Reduction.EPISODE_MEAN:
                w = 1 / (len(items) * events_of_episode[set_episode[s]])
            elif cfg.reduction == Reduction.SET_SIZE:
                w = K / len(items)
            elif cfg.reduction == Reduction.TOKEN:
                w = len(toks)
            else:
                w = 1.0
            a = A if m is None else member_adv[m]  # set items: the set's; member/token items: the member's
            if not torch.is_tensor(lr):
                lr = torch.tensor(float(lr), dtype=torch.float64)
            r = torch.exp(torch.clamp(lr, -c, c))
            if cfg.surrogate == Surrogate.CISPO:
                surr = torch.clamp(r.detach(), 1 - cfg.eps_low, 1 + cfg.eps_high) * a * lr
            elif cfg.surrogate == Surrogate.GMPO:
                # each token's log-ratio clipped on the side the advantage pushes, then the same aggregation
                def clipped_d(t):
                    x = new[t] - old[t]
                    lo_hi = torch.clamp(x, -cfg.eps_low, cfg.eps_high)
                    return torch.minimum(x, lo_hi) if a >= 0 else torch.maximum(x, lo_hi)
                if cfg.ratio_unit == RatioUnit.TOKEN:
                    lc = clipped_d(toks[0])
                elif cfg.ratio_unit == RatioUnit.MEMBER:
                    lc = sum(clipped_d(t) for t in toks) / (
                        max(len(toks), 1) if cfg.member_logratio == MemberLogRatio.MEAN else 1
                    )
                else:
                    lc = sum(
                        sum(clipped_d(t) for t in toks_of[mm])
                        / (max(len(toks_of[mm]), 1) if cfg.member_logratio == MemberLogRatio.MEAN else 1)
                        for mm in ms
                    ) * K ** (-cfg.alpha)
                if not torch.is_tensor(lc):
                    lc = torch.tensor(float(lc), dtype=torch.float64)
                surr = a * torch.exp(torch.clamp(lc, -c, c))
                if cfg.dual_clip is not None and a < 0:
                    surr = torch.maximum(surr, torch.tensor(cfg.dual_clip * a, dtype=torch.float64))
            else:
                clipped = torch.clamp(r, 1 - cfg.eps_low, 1 + cfg.eps_high)
                surr = torch.minimum(r * a, clipped * a)
                if cfg.dual_clip is not None and a < 0:
                    surr = torch.maximum(surr, torch.tensor(cfg.dual_clip * a, dtype=torch.float64))
            total = total + w * wm * surr
            if ref is not None:
                wk = w * wm if cfg.kl_mismatch_weight else w
                for t in toks:
                    x = torch.clamp(ref[t] - new[t], -c, c)
                    kl_total = kl_total + wk / max(len(toks), 1) * (torch.exp(x) - x - 1)
    return -total / D + cfg.kl_coef * kl_total / D


@pytest.fixture(scope="module")
def batch():
    eps = synthetic_episodes(3, 4, seed=7, max_set=5, policies=("p0", "p1", "p2"))
    return compile(eps, CompileConfig(micro_batch_tokens=80))


def _new(b, seed=0, scale=0.25):
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(b.num_tokens, generator=g, dtype=torch.float64) * scale
    return (b.old_logprobs.double() + noise).requires_grad_()


def _check(b, cfg, ref=None, seed=0):
    new = _new(b, seed)
    loss, diag = srpo_loss(new, b, cfg, ref_logprobs=ref)
    (g,) = torch.autograd.grad(loss, new)
    new2 = _new(b, seed)
    want = naive_loss(new2, b, cfg, ref)
    (g2,) = torch.autograd.grad(want, new2)
    assert loss.item() == pytest.approx(want.item(), abs=1e-6, rel=1e-6)
    assert torch.allclose(g, g2, atol=1e-7, rtol=1e-6), (g - g2).abs().max()
    return diag


@pytest.mark.parametrize("unit", list(RatioUnit))
@pytest.mark.parametrize("reduction", list(Reduction))
def test_matches_naive_every_unit_and_reduction(batch, unit, reduction):
    diag = _check(batch, LossConfig(ratio_unit=unit, reduction=reduction))
    # the batch is random enough that both clip sides are exercised
    assert diag.clip_frac_upper.item() > 0 and diag.clip_frac_lower.item() > 0


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("member", list(MemberLogRatio))
def test_matches_naive_alpha_and_member_ratio(batch, alpha, member):
    _check(batch, LossConfig(alpha=alpha, member_logratio=member, eps_low=0.1, eps_high=0.3), seed=1)


@pytest.mark.parametrize("mode", [Mismatch.TIS, Mismatch.MASK])
def test_matches_naive_with_mismatch_correction(batch, mode):
    g = torch.Generator().manual_seed(3)
    old = batch.sampler_logprobs + 0.2 * torch.randn(batch.num_tokens, generator=g) * batch.loss_mask
    b = batch.with_(old_logprobs=old.float())
    diag = _check(b, LossConfig(mismatch=mode, mismatch_threshold=1.5))
    assert diag.mismatch_abs_mean.item() > 0
    if mode == Mismatch.MASK:
        assert 0 < diag.mismatch_masked_share.item() < 1


@pytest.mark.parametrize("unit", list(RatioUnit))
def test_matches_naive_with_k3_kl(batch, unit):
    ref = batch.old_logprobs.double() + 0.1
    _check(batch, LossConfig(ratio_unit=unit, kl_coef=0.04), ref=ref)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_presets_match_naive(batch, name):
    cfg = loss_preset(name)
    _check(batch, cfg, ref=batch.old_logprobs.double() + 0.1 if cfg.kl_coef > 0 else None, seed=2)


@pytest.fixture(scope="module")
def agent_batch():
    """Per-member (Dr. MAS) advantages: members of one set differ."""
    eps = synthetic_episodes(3, 4, seed=7, max_set=5, policies=("p0", "p1", "p2"))
    b = compile(eps, CompileConfig(advantage="agent", micro_batch_tokens=80))
    assert not torch.equal(b.member_advantage, b.set_advantage[b.member_set])
    return b


@pytest.mark.parametrize("surrogate", list(Surrogate))
@pytest.mark.parametrize("unit", list(RatioUnit))
@pytest.mark.parametrize("member", list(MemberLogRatio))
def test_surrogates_match_naive(batch, agent_batch, surrogate, unit, member):
    for b in (batch, agent_batch):
        _check(
            b,
            LossConfig(ratio_unit=unit, surrogate=surrogate, member_logratio=member, eps_low=0.3, eps_high=0.4),
            seed=4,
        )


@pytest.mark.parametrize("unit", list(RatioUnit))
def test_dual_clip_and_kl_weighting_match_naive(batch, unit):
    g = torch.Generator().manual_seed(5)
    old = batch.sampler_logprobs + 0.3 * torch.randn(batch.num_tokens, generator=g) * batch.loss_mask
    b = batch.with_(old_logprobs=old.float())
    ref = b.old_logprobs.double() - 0.2
    for kl_w in (False, True):
        _check(
            b,
            LossConfig(ratio_unit=unit, dual_clip=3.0, kl_coef=0.1, mismatch="tis", kl_mismatch_weight=kl_w),
            ref=ref,
            seed=6,
        )


@pytest.mark.parametrize("unit", list(RatioUnit))
def test_dual_clip_with_gmpo_matches_naive(batch, unit):
    g = torch.Generator().manual_seed(5)
    old = batch.sampler_logprobs + 0.6 * torch.randn(batch.num_tokens, generator=g) * batch.loss_mask
    b = batch.with_(old_logprobs=old.float())
    _check(b, LossConfig(ratio_unit=unit, surrogate="gmpo", dual_clip=1.05), seed=6)
    new = _new(b, 6)  # the bound is active on some item: the loss differs from gmpo without it
    assert srpo_loss(new, b, LossConfig(ratio_unit=unit, surrogate="gmpo", dual_clip=1.05))[0].item() != pytest.approx(
        srpo_loss(new, b, LossConfig(ratio_unit=unit, surrogate="gmpo"))[0].item(), abs=1e-9
    )


def test_dual_clip_with_cispo_is_a_config_error_naming_the_field():
    from srpo_graph.errors import ConfigError
    from srpo_graph.train.config.loading import validate

    with pytest.raises(ConfigError, match=r"field `loss.dual_clip`.*'cispo'") as info:
        validate({"objective": "cispo", "loss": {"dual_clip": 3.0}})
    assert "fix:" in str(info.value)
    validate({"loss": {"surrogate": "gmpo", "dual_clip": 3.0}})  # bounded there: accepted


@pytest.mark.parametrize("surrogate", [Surrogate.CLIP, Surrogate.GMPO])
def test_dual_clip_bounds_a_blown_up_negative_advantage_event(surrogate):
    """One event, A < 0, ratio near the log clamp: the plain clip (and GMPO, which clips a negative
    advantage's token log-ratios only below) keep a gradient of ~A*rho (e^20); dual-clip (c = 3)
    caps the objective at c*A, so the gradient is 0 there."""
    from srpo_graph.compiler.synthetic import one_event_batch

    b = one_event_batch([[-5.0, -5.0]], advantage=-1.0)
    new = b.old_logprobs.double().index_put((b.loss_mask,), b.old_logprobs.double()[b.loss_mask] + 9.0)
    plain = new.clone().requires_grad_()
    loss, _ = srpo_loss(plain, b, LossConfig(surrogate=surrogate))
    loss.backward()
    assert plain.grad.abs().max().item() > 1e6
    dual = new.clone().requires_grad_()
    loss_d, _ = srpo_loss(dual, b, LossConfig(surrogate=surrogate, dual_clip=3.0))
    loss_d.backward()
    assert loss_d.item() == pytest.approx(3.0) and dual.grad.abs().max().item() == 0.0


def test_k3_kl_is_finite_far_from_the_reference(batch):
    ref = batch.old_logprobs.double() + 200.0 * batch.loss_mask  # exp(200) overflows float64 without the clamp
    new = batch.old_logprobs.double().clone().requires_grad_()
    loss, diag = srpo_loss(new, batch, LossConfig(kl_coef=0.1), ref_logprobs=ref)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all() and diag.ref_kl is not None


def test_denominator_is_what_the_naive_code_divides_by(batch):
    assert loss_denominator(batch, LossConfig()) == batch.num_sets
    assert loss_denominator(batch, LossConfig(reduction="token")) == int(batch.loss_mask.sum())
    assert loss_denominator(batch, LossConfig(reduction="constant", constant_denominator=7.0)) == 7.0


def test_bad_shapes_and_missing_reference_are_errors(batch):
    with pytest.raises(ValueError, match="shape"):
        srpo_loss(torch.zeros(3), batch, LossConfig())
    with pytest.raises(ValueError, match="ref_logprobs"):
        srpo_loss(batch.old_logprobs.clone(), batch, LossConfig(kl_coef=0.1))
