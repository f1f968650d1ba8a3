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
from srpo_graph.srpo.loss import LossConfig, MemberLogRatio, Mismatch, RatioUnit, Reduction, loss_denominator, srpo_loss


def naive_loss(new: torch.Tensor, b, cfg: LossConfig, ref: torch.Tensor | None = None) -> torch.Tensor:
    offsets = b.member_offsets.tolist()
    mask = b.loss_mask.tolist()
    old = b.old_logprobs.double().tolist()
    sampler = b.sampler_logprobs.double().tolist()
    member_set = b.member_set.tolist()
    adv = b.set_advantage.double().tolist()
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
        D = cfg.constant_denominator or M * max(len(toks_of[m]) for m in range(M))
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
            r = torch.exp(torch.clamp(lr, -c, c)) if torch.is_tensor(lr) else torch.tensor(math.exp(lr), dtype=torch.float64)
            clipped = torch.clamp(r, 1 - cfg.eps_low, 1 + cfg.eps_high)
            total = total + w * wm * torch.minimum(r * A, clipped * A)
            if ref is not None:
                for t in toks:
                    x = ref[t] - new[t]
                    kl_total = kl_total + w / max(len(toks), 1) * (torch.exp(x) - x - 1)
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


@pytest.mark.parametrize("name", list(LossConfig.PRESETS))
def test_presets_match_naive(batch, name):
    _check(batch, LossConfig.preset(name), seed=2)


def test_denominator_is_what_the_naive_code_divides_by(batch):
    assert loss_denominator(batch, LossConfig()) == batch.num_sets
    assert loss_denominator(batch, LossConfig(reduction="token")) == int(batch.loss_mask.sum())
    assert loss_denominator(batch, LossConfig(reduction="constant", constant_denominator=7.0)) == 7.0


def test_bad_shapes_and_missing_reference_are_errors(batch):
    with pytest.raises(ValueError, match="shape"):
        srpo_loss(torch.zeros(3), batch, LossConfig())
    with pytest.raises(ValueError, match="ref_logprobs"):
        srpo_loss(batch.old_logprobs.clone(), batch, LossConfig(kl_coef=0.1))
