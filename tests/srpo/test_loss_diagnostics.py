"""LossDiagnostics against plain per-event Python loops, and the ``diagnostics=False`` path.

The reference recomputes each event's set log-ratio from the token stream with Python
floats, then the per-size clip fractions, ratio means and log-ratio extremes by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig, RatioUnit


@pytest.fixture(scope="module")
def batch():
    return compile(synthetic_episodes(4, 4, seed=11, max_set=4, policies=("p0", "p1")),
                   CompileConfig(micro_batch_tokens=120))


def _new(b, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        b.old_logprobs.double() + 0.3 * torch.randn(b.num_tokens, generator=g, dtype=torch.float64)
    ).requires_grad_()


def test_set_unit_diagnostics_match_plain_loops(batch):
    cfg = LossConfig(eps_low=0.1, eps_high=0.15)
    new = _new(batch)
    _, diag = srpo_loss(new, batch, cfg)
    new = new.detach()
    offsets, mask = batch.member_offsets.tolist(), batch.loss_mask.tolist()
    per_size: dict[int, list[tuple[float, float, float]]] = {}
    for s in range(batch.num_sets):
        ms = [m for m in range(batch.num_members) if int(batch.member_set[m]) == s]
        L = sum(
            float(new[t]) - float(batch.old_logprobs[t])
            for m in ms
            for t in range(offsets[m], offsets[m + 1])
            if mask[t]
        )
        L *= len(ms) ** -0.5
        per_size.setdefault(len(ms), []).append((L, math.exp(L), float(batch.set_advantage[s])))
    assert diag.sizes.tolist() == sorted(per_size)
    for i, k in enumerate(sorted(per_size)):
        rows = per_size[k]
        up = sum(r > 1.15 and a > 0 for _, r, a in rows) / len(rows)
        lo = sum(r < 0.9 and a < 0 for _, r, a in rows) / len(rows)
        assert diag.clip_upper_by_size[i].item() == pytest.approx(up, abs=1e-6)
        assert diag.clip_lower_by_size[i].item() == pytest.approx(lo, abs=1e-6)
        assert diag.ratio_mean_by_size[i].item() == pytest.approx(sum(r for _, r, _ in rows) / len(rows), rel=1e-5)
        assert diag.log_ratio_mean_by_size[i].item() == pytest.approx(sum(L for L, _, _ in rows) / len(rows), abs=1e-5)
        assert diag.log_ratio_absmax_by_size[i].item() == pytest.approx(max(abs(L) for L, _, _ in rows), rel=1e-5)
        rms = math.sqrt(sum(L * L for L, _, _ in rows) / len(rows))
        assert diag.log_ratio_rms_by_size[i].item() == pytest.approx(rms, rel=1e-5)
        assert diag.to_dict()[f"log_ratio_rms/k{k}"] == pytest.approx(rms, rel=1e-5)
        assert diag.events_by_size[i].item() == len(rows)
    assert diag.clip_frac_upper.item() > 0 and diag.clip_frac_lower.item() > 0  # both sides exercised
    ratios = [r for rows in per_size.values() for _, r, _ in rows]
    assert diag.ratio_min.item() == pytest.approx(min(ratios), rel=1e-5)
    assert diag.ratio_max.item() == pytest.approx(max(ratios), rel=1e-5)
    toks = [t for t in range(batch.num_tokens) if mask[t]]
    x = [float(new[t]) - float(batch.old_logprobs[t]) for t in toks]  # log r, r = pi_new / pi_old
    assert diag.approx_kl_k3.item() == pytest.approx(sum(math.exp(v) - v - 1 for v in x) / len(x), rel=1e-5)
    mis = [abs(float(batch.old_logprobs[t]) - float(batch.sampler_logprobs[t])) for t in toks]
    assert diag.mismatch_abs_mean.item() == pytest.approx(sum(mis) / len(mis), abs=1e-7)
    assert diag.num_tokens == len(toks)


def test_approx_kl_estimates_the_exact_kl_of_old_to_new_on_a_categorical():
    """Tokens sampled from a small pi_old, scored under a pi_new: the logged k3 and the mean of
    old - new must estimate the exact KL(pi_old || pi_new) = sum_v p_old(v) log(p_old(v)/p_new(v)),
    not KL(pi_new || pi_old) (1.063 here) nor chi^2 - KL (1.427, the other k3 orientation)."""
    p_old, p_new = [0.5, 0.4, 0.1], [0.1, 0.2, 0.7]
    exact = sum(a * math.log(a / b) for a, b in zip(p_old, p_new))  # 0.887
    reverse = sum(b * math.log(b / a) for a, b in zip(p_old, p_new))
    b = compile(
        synthetic_episodes(8, 8, seed=3, max_set=4, completion_len=(60, 90), transition_rewards=False),
        CompileConfig(micro_batch_tokens=100_000),
    )
    comp = b.loss_mask.nonzero().squeeze(1)
    g = torch.Generator().manual_seed(0)
    tok = torch.multinomial(torch.tensor(p_old), comp.numel(), replacement=True, generator=g)
    old, new = b.old_logprobs.double().clone(), b.old_logprobs.double().clone()
    old[comp], new[comp] = torch.tensor(p_old).log().double()[tok], torch.tensor(p_new).log().double()[tok]
    b.old_logprobs, b.sampler_logprobs = old.to(b.old_logprobs.dtype), old.to(b.sampler_logprobs.dtype)
    _, diag = srpo_loss(new.requires_grad_(), b, LossConfig())
    n = comp.numel()
    assert n > 10_000
    # sampling error: the per-token k3 has variance 1.2 here, so 4 standard errors < 0.05
    assert diag.approx_kl_k3.item() == pytest.approx(exact, abs=4 * (1.2 / n) ** 0.5)
    assert diag.approx_kl_mean.item() == pytest.approx(exact, abs=4 * (2.0 / n) ** 0.5)
    assert abs(diag.approx_kl_k3.item() - reverse) > 0.1


@pytest.mark.parametrize("unit", list(RatioUnit))
def test_without_diagnostics_the_loss_and_gradient_are_identical(batch, unit):
    cfg = LossConfig(ratio_unit=unit, kl_coef=0.05)
    D = loss_denominator(batch, cfg)
    ref = batch.old_logprobs.double() + 0.05
    a, b_ = _new(batch, 1), _new(batch, 1)
    la, da = srpo_loss(a, batch, cfg, denominator=D, ref_logprobs=ref)
    lb, db = srpo_loss(b_, batch, cfg, denominator=D, ref_logprobs=ref, diagnostics=False)
    assert db is None and da is not None and da.num_events == batch.num_sets
    assert la.item() == lb.item()
    (ga,) = torch.autograd.grad(la, a)
    (gb,) = torch.autograd.grad(lb, b_)
    assert torch.equal(ga, gb)
