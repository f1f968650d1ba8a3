"""Decoupled PPO (``loss.mismatch = decoupled``) against a plain-loop reference, for every ratio unit.

The reference loops over events, members and tokens with Python floats (scalar autograd in
float64) and shares nothing with the vectorized loss but the SetBatch it reads: the ratio is
pi_theta / pi_old (the proximal policy), clipped; the behaviour policy (the sampler) enters only
the importance weight pi_old / mu of the same item, capped as ``decoupled_cap`` says. Also: the
importance-weight, clipped- and masked-share diagnostics and the staleness histogram, each
against plain loops.
"""

from __future__ import annotations

import math

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.diagnostics import staleness_histogram
from srpo_graph.srpo.loss import srpo_loss
from srpo_graph.srpo.options import DecoupledCap, DecoupledWeight, LossConfig, MemberLogRatio, RatioUnit, Reduction


def _items(b, cfg: LossConfig):
    """[(event, member or None, tokens, agg)] where agg(values by token) is the unit's log-ratio."""
    offsets, mask = b.member_offsets.tolist(), b.loss_mask.tolist()
    member_set = b.member_set.tolist()
    out = []
    for s in range(b.num_sets):
        ms = [m for m in range(b.num_members) if member_set[m] == s]
        toks = {m: [t for t in range(offsets[m], offsets[m + 1]) if mask[t]] for m in ms}

        def member_agg(m, v, toks=toks):
            x = sum(v(t) for t in toks[m])
            return x / max(len(toks[m]), 1) if cfg.member_logratio == MemberLogRatio.MEAN else x

        if cfg.ratio_unit == RatioUnit.SET:
            scale = len(ms) ** (-cfg.alpha)
            out.append((s, None, [t for m in ms for t in toks[m]],
                        lambda v, ms=ms, member_agg=member_agg, scale=scale: scale * sum(member_agg(m, v) for m in ms)))
        elif cfg.ratio_unit == RatioUnit.MEMBER:
            for m in ms:
                out.append((s, m, toks[m], lambda v, m=m, member_agg=member_agg: member_agg(m, v)))
        else:
            for m in ms:
                for t in toks[m]:
                    out.append((s, m, [t], lambda v, t=t: v(t)))
    return out


def naive_decoupled(new: torch.Tensor, b, cfg: LossConfig):
    """The loss, and per item (event, raw weight, applied weight, clipped) for the diagnostics."""
    old = b.old_logprobs.double().tolist()
    mu = b.sampler_logprobs.double().tolist()
    adv, member_adv = b.set_advantage.double().tolist(), b.member_advantage.double().tolist()
    items = _items(b, cfg)
    per_event: dict[int, int] = {}
    for s, *_ in items:
        per_event[s] = per_event.get(s, 0) + 1
    D = b.num_sets if cfg.reduction == Reduction.EVENT_MEAN else sum(b.loss_mask.tolist())
    c, C = cfg.logratio_clamp, cfg.mismatch_threshold
    total, rows = 0.0, []
    for s, m, toks, agg in items:
        lr = agg(lambda t: new[t] - old[t])
        if not torch.is_tensor(lr):
            lr = torch.tensor(float(lr), dtype=torch.float64)
        if cfg.decoupled_weight == DecoupledWeight.JOINT:  # the item's full probability ratio pi_old / mu
            log_w = sum(old[t] - mu[t] for t in toks)
        else:  # aggregated like the ratio (the set's K^-alpha-scaled sum, a member's mean)
            log_w = agg(lambda t: old[t] - mu[t])
        raw = math.exp(max(-c, min(c, log_w)))
        if cfg.decoupled_cap == DecoupledCap.TRUNCATE:
            wm = min(raw, C)
        elif cfg.decoupled_cap == DecoupledCap.MASK:
            wm = raw if (cfg.mismatch_low or 0.0) <= raw <= C else 0.0
        else:
            wm = raw
        a = adv[s] if m is None else member_adv[m]
        r = torch.exp(torch.clamp(lr, -c, c))
        surr = torch.minimum(r * a, torch.clamp(r, 1 - cfg.eps_low, 1 + cfg.eps_high) * a)
        w = 1 / per_event[s] if cfg.reduction == Reduction.EVENT_MEAN else len(toks)
        total = total + w * wm * surr
        rf = float(r.detach())
        rows.append((s, raw, wm, (rf > 1 + cfg.eps_high and a > 0) or (rf < 1 - cfg.eps_low and a < 0), len(toks)))
    return -total / D, rows


@pytest.fixture(scope="module")
def stale_batch():
    """A batch whose sampler log-probs differ from pi_old by up to ~0.4 nats a token (stale rollouts)."""
    eps = synthetic_episodes(3, 4, seed=7, max_set=5, policies=("p0", "p1", "p2"))
    b = compile(eps, CompileConfig(micro_batch_tokens=80))
    g = torch.Generator().manual_seed(3)
    mu = b.old_logprobs - 0.15 * torch.randn(b.num_tokens, generator=g) * b.loss_mask
    return b.with_(sampler_logprobs=mu.float())


def _new(b, seed=0, scale=0.25):
    g = torch.Generator().manual_seed(seed)
    return (
        b.old_logprobs.double() + torch.randn(b.num_tokens, generator=g, dtype=torch.float64) * scale
    ).requires_grad_()


def _check(b, cfg, seed=0):
    new = _new(b, seed)
    loss, diag = srpo_loss(new, b, cfg)
    (g,) = torch.autograd.grad(loss, new)
    new2 = _new(b, seed)
    want, rows = naive_decoupled(new2, b, cfg)
    (g2,) = torch.autograd.grad(want, new2)
    assert loss.item() == pytest.approx(want.item(), abs=1e-6, rel=1e-6)
    assert torch.allclose(g, g2, atol=1e-7, rtol=1e-6), (g - g2).abs().max()
    return diag, rows


@pytest.mark.parametrize("weight", list(DecoupledWeight))
@pytest.mark.parametrize("cap", list(DecoupledCap))
@pytest.mark.parametrize("unit", list(RatioUnit))
@pytest.mark.parametrize("member", list(MemberLogRatio))
def test_decoupled_matches_plain_loop_every_unit(stale_batch, cap, unit, member, weight):
    cfg = LossConfig(ratio_unit=unit, member_logratio=member, mismatch="decoupled", decoupled_cap=cap,
                     mismatch_threshold=1.3, decoupled_weight=weight)
    diag, rows = _check(stale_batch, cfg)
    acts = member == MemberLogRatio.SUM or unit == RatioUnit.TOKEN  # length-normalized weights stay near 1
    if cap == DecoupledCap.TRUNCATE and acts:
        assert diag.truncated_share.item() > 0  # the cap acts on this batch
    if cap == DecoupledCap.MASK and acts:
        assert any(r[2] == 0 for r in rows) and diag.tokens_masked_share.item() > 0


@pytest.mark.parametrize("unit", list(RatioUnit))
@pytest.mark.parametrize("reduction", [Reduction.EVENT_MEAN, Reduction.TOKEN])
def test_decoupled_matches_plain_loop_alpha_and_reduction(stale_batch, unit, reduction):
    for alpha in (0.0, 1.0):
        _check(
            stale_batch,
            LossConfig(
                ratio_unit=unit,
                reduction=reduction,
                alpha=alpha,
                mismatch="decoupled",
                decoupled_cap="mask",
                mismatch_threshold=1.5,
                mismatch_low=0.7,
            ),
            seed=1,
        )


@pytest.mark.parametrize("unit", list(RatioUnit))
def test_decoupled_unclipped_equals_the_ratio_to_the_behaviour_policy(stale_batch, unit):
    """With no clip and no cap, ratio x weight = pi_theta / mu: the loss equals the plain loss whose
    pi_old is the sampler's log-probs (the identity decoupled PPO rests on)."""
    wide = {"eps_low": 1.0, "eps_high": 10.0}
    new = _new(stale_batch, 2, scale=0.05)
    a, _ = srpo_loss(new, stale_batch, LossConfig(ratio_unit=unit, mismatch="decoupled", decoupled_cap="none", **wide))
    behav = stale_batch.with_(old_logprobs=stale_batch.sampler_logprobs)
    b_, _ = srpo_loss(new, behav, LossConfig(ratio_unit=unit, **wide))
    assert a.item() == pytest.approx(b_.item(), rel=1e-9, abs=1e-12)
    # ... and it clips differently: with the default clip, decoupled (clip around pi_old) != clip around mu
    c, _ = srpo_loss(new, stale_batch, LossConfig(ratio_unit=unit, mismatch="decoupled", decoupled_cap="none"))
    d, _ = srpo_loss(new, behav, LossConfig(ratio_unit=unit))
    assert c.item() != pytest.approx(d.item(), rel=1e-6)


@pytest.mark.parametrize("unit", list(RatioUnit))
def test_decoupled_is_plain_ppo_when_sampler_equals_pi_old(stale_batch, unit):
    b = stale_batch.with_(sampler_logprobs=stale_batch.old_logprobs)
    new = _new(b, 3)
    a, da = srpo_loss(new, b, LossConfig(ratio_unit=unit, mismatch="decoupled"))
    p, _ = srpo_loss(new, b, LossConfig(ratio_unit=unit))
    assert a.item() == pytest.approx(p.item(), rel=1e-12)
    assert da is not None and da.mismatch_weight_mean.item() == pytest.approx(1.0)


@pytest.mark.parametrize("unit", list(RatioUnit))
@pytest.mark.parametrize("mode", ["decoupled", "tis", "mask"])
def test_weight_clip_and_mask_diagnostics_match_plain_loops(stale_batch, unit, mode):
    """Importance-weight statistics by set size, the shares of tokens and sets clipped or masked."""
    b = stale_batch
    cfg = LossConfig(ratio_unit=unit, mismatch=mode, decoupled_cap="mask", mismatch_threshold=1.2, mismatch_low=0.8)
    new = _new(b, 4)
    _, diag = srpo_loss(new, b, cfg)
    assert diag is not None
    old, mu = b.old_logprobs.double().tolist(), b.sampler_logprobs.double().tolist()
    K = {s: int(b.set_size[s]) for s in range(b.num_sets)}
    rows = []  # (event, raw, applied, clipped, tokens)
    if mode == "decoupled":
        _, rows = naive_decoupled(new.detach(), b, cfg)
    else:  # one event-level weight shared by the event's items
        _, plain = naive_decoupled(new.detach(), b, cfg.model_copy(update={"mismatch": "none"}))
        H: dict[int, float] = {}
        for s, (lo, hi) in enumerate(zip(b.member_offsets[:-1].tolist(), b.member_offsets[1:].tolist())):
            ev = int(b.member_set[s])
            H[ev] = H.get(ev, 0.0) + sum(old[t] - mu[t] for t in range(lo, hi) if b.loss_mask[t])
        for s, _, _, clipped, n in plain:
            raw = math.exp(H[s])
            wm = min(raw, 1.2) if mode == "tis" else float(0.8 <= raw <= 1.2)
            rows.append((s, raw, wm, clipped, n))
    n_tok = sum(r[4] for r in rows)
    masked = [r for r in rows if r[2] == 0]
    assert diag.tokens_masked_share.item() == pytest.approx(sum(r[4] for r in masked) / n_tok, abs=1e-6)
    assert diag.mismatch_masked_share.item() == pytest.approx(len({r[0] for r in masked}) / b.num_sets, abs=1e-6)
    assert diag.tokens_clipped_share.item() == pytest.approx(sum(r[4] for r in rows if r[3]) / n_tok, abs=1e-6)
    assert diag.sets_clipped_share.item() == pytest.approx(len({r[0] for r in rows if r[3]}) / b.num_sets, abs=1e-6)
    assert diag.truncated_share.item() == pytest.approx(
        sum(mode == "tis" and r[1] > 1.2 for r in rows) / len(rows), abs=1e-6
    )
    assert diag.mismatch_weight_mean.item() == pytest.approx(sum(r[2] for r in rows) / len(rows), rel=1e-5)
    d = diag.to_dict()
    assert d["is_weight_max"] == pytest.approx(max(r[1] for r in rows), rel=1e-5)
    for k in sorted(set(K.values())):
        ws = [r[2] for r in rows if K[r[0]] == k]
        mean = sum(ws) / len(ws)
        assert d[f"is_weight_mean/k{k}"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
        assert d[f"is_weight_std/k{k}"] == pytest.approx(
            math.sqrt(max(sum(w * w for w in ws) / len(ws) - mean * mean, 0.0)), abs=1e-3
        )
        assert d[f"is_masked/k{k}"] == pytest.approx(sum(w == 0 for w in ws) / len(ws), abs=1e-6)
    assert diag.tokens_clipped_share.item() > 0
    if mode == "tis":
        assert diag.truncated_share.item() > 0 and diag.tokens_masked_share.item() == 0
    else:
        assert 0 < diag.tokens_masked_share.item() < 1


def test_diagnostics_combine_over_micro_batches(stale_batch):
    """The new sums combine exactly: two halves' diagnostics equal the whole batch's."""
    from srpo_graph.srpo.diagnostics import LossDiagnostics
    from srpo_graph.srpo.loss import loss_denominator

    cfg = LossConfig(mismatch="decoupled", decoupled_cap="mask", mismatch_threshold=1.2, mismatch_low=0.8)
    b = stale_batch
    D = loss_denominator(b, cfg)
    new = _new(b, 5).detach()
    _, whole = srpo_loss(new, b, cfg, denominator=D)
    parts, start = [], 0
    micro = b.micro_batches()
    assert len(micro) > 1
    for mb in micro:  # whole sets in stream order: each micro-batch is the next slice of tokens
        parts.append(srpo_loss(new[start : start + mb.num_tokens], mb, cfg, denominator=D)[1])
        start += mb.num_tokens
    assert start == b.num_tokens
    comb = LossDiagnostics.combine(parts, "micro")
    for k in ("tokens_masked_share", "sets_clipped_share", "tokens_clipped_share", "mismatch_weight_mean"):
        assert getattr(comb, k).item() == pytest.approx(getattr(whole, k).item(), rel=1e-5, abs=1e-7)
    assert comb.to_dict()["is_weight_max"] == pytest.approx(whole.to_dict()["is_weight_max"], rel=1e-6)


def test_staleness_histogram_matches_a_plain_loop(stale_batch):
    b = stale_batch
    g = torch.Generator().manual_seed(0)
    versions = torch.randint(3, 7, (b.num_members,), generator=g)
    b = b.with_(member_policy_version=versions)
    current = {p: 6 + i % 2 for i, p in enumerate(b.policies)}
    h = staleness_histogram(b, current)
    counts: dict[int, int] = {}
    toks: dict[int, int] = {}
    offsets, mask = b.member_offsets.tolist(), b.loss_mask.tolist()
    for m in range(b.num_members):
        k = current[b.policies[int(b.member_policy[m])]] - int(versions[m])
        counts[k] = counts.get(k, 0) + 1
        toks[k] = toks.get(k, 0) + sum(mask[offsets[m] : offsets[m + 1]])
    assert len(counts) >= 3
    for k, n in counts.items():
        assert h[f"s{k}"] == pytest.approx(n / b.num_members)
        assert h[f"tokens_s{k}"] == pytest.approx(toks[k] / sum(mask))
    assert h["max"] == max(counts)
    assert h["mean"] == pytest.approx(sum(k * n for k, n in counts.items()) / b.num_members)
    assert staleness_histogram(
        b.with_(member_policy_version=torch.zeros_like(versions)), {p: 0 for p in b.policies}
    ) == {"mean": 0.0, "max": 0.0, "s0": 1.0, "tokens_s0": 1.0}


def test_the_two_set_weights_differ_as_derived(stale_batch):
    """Set unit: the joint weight is the normalized one to the power K^alpha (log w_joint = K^alpha log
    w_normalized, docs/algorithm.md), so they agree on sets of one member and differ on larger ones;
    and the issue's example: 0.2 nats per member, K = 4 -> 1.49 vs 2.23; K = 8 -> 1.76 vs 4.95."""
    cfgs = {w: LossConfig(mismatch="decoupled", decoupled_cap="none", decoupled_weight=w) for w in DecoupledWeight}
    rows = {w: naive_decoupled(_new(stale_batch), stale_batch, c)[1] for w, c in cfgs.items()}
    sizes = stale_batch.set_size.tolist()
    for (s, raw_n, *_), (_, raw_j, *_) in zip(rows[DecoupledWeight.NORMALIZED], rows[DecoupledWeight.JOINT]):
        assert math.log(raw_j) == pytest.approx(sizes[s] ** 0.5 * math.log(raw_n), abs=1e-9)
    assert any(k > 1 for k in sizes) and any(k == 1 for k in sizes)
    for k, n, j in ((4, 1.49, 2.23), (8, 1.76, 4.95)):
        assert math.exp(k ** -0.5 * 0.2 * k) == pytest.approx(n, abs=0.01)
        assert math.exp(0.2 * k) == pytest.approx(j, abs=0.01)
