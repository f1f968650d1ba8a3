"""Invariances and special cases of srpo_loss (trace order, micro-batch split, GSPO, GRPO, REINFORCE)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.objectives import loss_preset
from srpo_graph.srpo.options import LossConfig, RatioUnit, Reduction


def content_logprobs(b) -> torch.Tensor:
    """New log-probs that depend only on a token's content and place, not on the batch order."""
    x = b.input_ids.double() * 1.3 + b.position_ids.double() * 0.7
    tok_mem = b.token_member
    x = x + b.member_temperature.double()[tok_mem]
    return b.old_logprobs.double() + 0.3 * torch.sin(x)


@pytest.mark.parametrize("reduction", list(Reduction))
@pytest.mark.parametrize("unit", list(RatioUnit))
def test_trace_order_does_not_change_the_loss(unit, reduction):
    eps = synthetic_episodes(3, 4, seed=11)
    shuffled = eps[:]
    random.Random(0).shuffle(shuffled)
    cfg = LossConfig(ratio_unit=unit, reduction=reduction)
    a, b = compile(eps), compile(shuffled)
    assert b.set_size.tolist() != a.set_size.tolist()  # the order really changed
    la, _ = srpo_loss(content_logprobs(a), a, cfg)
    lb, _ = srpo_loss(content_logprobs(b), b, cfg)
    assert la.item() == pytest.approx(lb.item(), abs=1e-6)


@pytest.mark.parametrize("reduction", list(Reduction))
@pytest.mark.parametrize("unit", list(RatioUnit))
def test_micro_batch_split_does_not_change_loss_or_gradient(unit, reduction):
    whole = compile(synthetic_episodes(3, 4, seed=5), CompileConfig(micro_batch_tokens=0))
    # a mini-batch of some sets (shuffled), then split into small micro-batches
    idx = list(range(whole.num_sets))
    random.Random(1).shuffle(idx)
    mini = whole.select_sets(idx[: 2 * len(idx) // 3]).with_micro_batch_tokens(50)
    assert mini.num_micro_batches > 2
    cfg = LossConfig(ratio_unit=unit, reduction=reduction)
    D = loss_denominator(mini, cfg)
    new = content_logprobs(mini).requires_grad_()
    full, _ = srpo_loss(new, mini, cfg)
    (g_full,) = torch.autograd.grad(full, new)
    total, grads = 0.0, []
    for mb in mini.micro_batches():
        lp = content_logprobs(mb).requires_grad_()
        part, _ = srpo_loss(lp, mb, cfg, denominator=D)
        total += part.item()
        grads.append(torch.autograd.grad(part, lp)[0])
    assert total == pytest.approx(full.item(), abs=1e-9)
    # micro-batches are contiguous slices of the mini-batch's stream
    assert torch.allclose(torch.cat(grads), g_full, atol=1e-12)
    assert g_full.abs().sum() > 0


def test_micro_batches_never_split_a_set_and_cover_every_token():
    b = compile(synthetic_episodes(4, 4, seed=2), CompileConfig(micro_batch_tokens=40))
    parts = b.micro_batches()
    assert sum(p.num_sets for p in parts) == b.num_sets
    assert torch.equal(torch.cat([p.input_ids for p in parts]), b.input_ids)
    for p in parts:
        assert int(p.set_tokens.sum()) <= 40 or p.num_sets == 1  # over budget only when alone
        assert torch.equal(p.set_size, torch.bincount(p.member_set, minlength=p.num_sets))


def test_set_size_one_with_length_normalized_ratio_is_gspo():
    b = compile(synthetic_episodes(3, 4, seed=3, max_set=1))
    assert set(b.set_size.tolist()) == {1}
    new = content_logprobs(b)
    cfg = LossConfig(member_logratio="mean", eps_low=0.05, eps_high=0.08)
    loss, _ = srpo_loss(new, b, cfg)
    # GSPO (arXiv 2507.18071): s_i = exp(mean_t log r_t); J = mean_i min(s_i A_i, clip(s_i) A_i)
    J = 0.0
    for i in range(b.num_members):
        s, e = int(b.member_offsets[i]), int(b.member_offsets[i + 1])
        toks = [t for t in range(s, e) if b.loss_mask[t]]
        si = math.exp(sum(float(new[t]) - float(b.old_logprobs[t]) for t in toks) / len(toks))
        A = float(b.set_advantage[int(b.member_set[i])])
        J += min(si * A, min(max(si, 0.95), 1.08) * A)
    assert loss.item() == pytest.approx(-J / b.num_members, abs=1e-6)
    gspo, _ = srpo_loss(new, b, loss_preset("gspo", eps_low=0.05, eps_high=0.08))
    assert gspo.item() == pytest.approx(loss.item(), abs=1e-9)


def test_token_unit_is_grpo():
    b = compile(synthetic_episodes(3, 4, seed=4))
    new = content_logprobs(b)
    loss, _ = srpo_loss(new, b, loss_preset("grpo"))
    # GRPO (arXiv 2402.03300): mean over outputs of the per-output token mean of the clipped surrogate
    J = 0.0
    for i in range(b.num_members):
        s, e = int(b.member_offsets[i]), int(b.member_offsets[i + 1])
        A = float(b.set_advantage[int(b.member_set[i])])
        toks = [t for t in range(s, e) if b.loss_mask[t]]
        acc = 0.0
        for t in toks:
            r = math.exp(float(new[t]) - float(b.old_logprobs[t]))
            acc += min(r * A, min(max(r, 0.8), 1.2) * A)
        J += acc / len(toks)
    assert loss.item() == pytest.approx(-J / b.num_members, abs=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_old_equals_new_gives_ratio_one_and_scaled_reinforce_gradient(alpha):
    b = compile(synthetic_episodes(3, 4, seed=6))
    new = b.old_logprobs.double().clone().requires_grad_()
    loss, diag = srpo_loss(new, b, LossConfig(alpha=alpha))
    assert diag.ratio_min.item() == pytest.approx(1.0) and diag.ratio_max.item() == pytest.approx(1.0)
    (g,) = torch.autograd.grad(loss, new)
    K = b.set_size.double()[b.member_set][b.token_member]
    A = b.set_advantage.double()[b.member_set][b.token_member]
    want = -A * K.pow(-alpha) / b.num_sets * b.loss_mask.double()
    assert torch.allclose(g, want, atol=1e-9)


def test_diagnostics_to_dict_is_flat_floats():
    b = compile(synthetic_episodes(2, 3, seed=8))
    new = content_logprobs(b)
    _, diag = srpo_loss(new, b, LossConfig(), entropy=torch.rand(b.num_tokens), ref_logprobs=b.old_logprobs)
    d = diag.to_dict()
    assert all(isinstance(v, float) for v in d.values())
    assert {"clip_frac_upper", "approx_kl_k3", "entropy_mean", "adv_std", "mismatch_abs_max"} <= set(d)
    assert any(k.startswith("clip_upper/k") for k in d) and any(k.startswith("entropy/") for k in d)
    assert sum(v for k, v in d.items() if k.startswith("events/k")) == b.num_sets
