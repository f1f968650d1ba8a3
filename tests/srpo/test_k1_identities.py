"""Where every active set has size 1, the set objectives are one loss: the study runs one of them.

With K = 1 the set log-ratio is the member's own (K^-alpha = 1 for every alpha) and one set is one
member, so ``srpo`` (alpha 1/2), ``srpo_sum`` (alpha 0), ``srpo_mean`` (alpha 1) and
``independent`` (member unit, member mean) give the same loss and gradient; ``benchmarks/study.py``
relies on it to run only ``srpo`` of the four on workflows whose sets all have size 1. With
sets of several members they differ (the second test), so the first one can fail.
"""

from __future__ import annotations

import pytest
import torch

from srpo_graph.compiler.compile import compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.objectives import get_objective

SAME_AT_K1 = ("srpo_sum", "srpo_mean", "independent")


def _loss_and_grad(batch, name: str):
    obj = get_objective(name)
    cfg = obj.loss_config()
    new = (batch.old_logprobs.double() + 0.3 * torch.randn(batch.num_tokens, generator=torch.Generator().manual_seed(1),
                                                           dtype=torch.float64)).requires_grad_()
    loss, _ = srpo_loss(new, batch, cfg, denominator=loss_denominator(batch, cfg))
    (grad,) = torch.autograd.grad(loss, new)
    return loss.detach(), grad


def _batch(max_set: int):
    # multi-token members (1-6 completion tokens), so the token sum is not the token ratio
    eps = synthetic_episodes(6, 4, seed=3, max_set=max_set, completion_len=(2, 6), policies=("p0",))
    return compile(eps, get_objective("srpo").compile_config())


@pytest.mark.parametrize("name", SAME_AT_K1)
def test_set_objectives_are_one_loss_when_every_set_has_one_member(name):
    batch = _batch(max_set=1)
    assert int(batch.set_size.max()) == 1
    ref_loss, ref_grad = _loss_and_grad(batch, "srpo")
    loss, grad = _loss_and_grad(batch, name)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", SAME_AT_K1)
def test_they_differ_once_sets_have_several_members(name):
    batch = _batch(max_set=4)
    assert int(batch.set_size.max()) > 1
    ref_loss, ref_grad = _loss_and_grad(batch, "srpo")
    _, grad = _loss_and_grad(batch, name)
    assert not torch.allclose(grad, ref_grad, rtol=1e-6, atol=1e-9)
