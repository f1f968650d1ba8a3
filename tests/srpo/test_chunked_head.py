"""The chunked lm_head + log-softmax (srpo/lm_head.py, Note [Chunked head]): the same log-probs,
entropies, losses and gradients as the whole-block path and as a slow one-member-at-a-time
reference, on every layout, tied and untied embeddings, a biased head, temperature, the
``allow:`` constraint and re-applied top-k / top-p; under bf16 autocast; and no tensor with a
vocabulary-sized row is saved for backward beyond one chunk (checked on the saved tensors
themselves, with the whole-block path as the control that the check can fail).

Models: the built-in tiny model (tied embeddings) and a small Qwen2 made here (untied, biases).
"""

from __future__ import annotations

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.lm_head import head_logprobs, output_head
from srpo_graph.srpo.logprobs import packed_logprobs
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig
from tests.support.models import tiny_and_small

LAYOUTS = ["packed", "padded", "prefix"]


@pytest.fixture(scope="module")
def models():
    """The tiny model (a tied head) and a small Qwen2 (an untied head, biased projections)."""
    return tiny_and_small("qwen2")


@pytest.fixture(scope="module")
def batch(models):
    """Two policies, temperatures, constraints, and top-k / top-p re-applied on some members."""
    eps = synthetic_episodes(3, 3, seed=11, vocab=models[0].config.vocab_size, policies=("tiny", "small"),
                             prompt_len=(2, 14), completion_len=(1, 12))
    b = compile(eps, CompileConfig(micro_batch_tokens=10**6))
    m = b.num_members
    top_k = torch.tensor([[0, 5, 0, 0][i % 4] for i in range(m)], dtype=torch.int64)
    top_p = torch.tensor([[1.0, 1.0, 0.8, 1.0][i % 4] for i in range(m)], dtype=torch.float32)
    b = b.with_(member_top_k=top_k, member_top_p=top_p)
    assert (b.member_allowed >= 0).any() and (b.member_temperature != 1).any()
    assert int(b.loss_mask.sum()) > 3 * 4  # more completion tokens than a few chunks of 3 rows
    return b


def _reference(models, b) -> torch.Tensor:
    """One member at a time through the model's own lm_head, float64, plain loops; the filters
    re-applied with backends.sampling's own truncation_mask."""
    from srpo_graph.backends.sampling import truncation_mask

    vals, where = [], []
    for m in range(b.num_members):
        s, e = int(b.member_offsets[m]), int(b.member_offsets[m + 1])
        logits = models[int(b.member_policy[m])](input_ids=b.input_ids[s:e].unsqueeze(0)).logits[0].double()
        logits = logits / float(b.member_temperature[m])
        a = int(b.member_allowed[m])
        if a >= 0:
            allow = torch.zeros(logits.shape[1], dtype=torch.bool)
            allow[b.allowed(a)] = True
            logits = logits.masked_fill(~allow, float("-inf"))
        k, p = int(b.member_top_k[m]), float(b.member_top_p[m])
        if k > 0 or p < 1.0:
            with torch.no_grad():
                drop = truncation_mask(torch.log_softmax(logits.float(), -1), torch.full((logits.shape[0],), k),
                                       torch.full((logits.shape[0],), p))
            logits = logits.masked_fill(drop, float("-inf"))
        logp = torch.log_softmax(logits, -1)
        for t in range(s + 1, e):
            if b.loss_mask[t]:
                vals.append(logp[t - s - 1, int(b.input_ids[t])].clamp(min=-1e4))
                where.append(t)
    return torch.zeros(b.num_tokens, dtype=torch.float64).index_put((torch.tensor(where),), torch.stack(vals))


def _grads(models):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for m in models for p in m.parameters()]


def _step(models, b, **kw):
    """Loss and gradients of the SRPO loss on ``b`` computed with ``packed_logprobs(**kw)``."""
    for m in models:
        m.zero_grad(set_to_none=True)
    cfg = LossConfig()
    lp, ent = packed_logprobs(models, b, **kw)
    loss, _ = srpo_loss(lp, b, cfg, denominator=loss_denominator(b, cfg), entropy=ent)
    loss.backward()
    return lp.detach(), ent, float(loss.detach()), _grads(models)


@pytest.fixture(scope="module")
def old_batch(models, batch):
    """``batch`` with pi_old a little away from pi, so the ratios differ from 1 and clipping acts."""
    with torch.no_grad():
        old, _ = packed_logprobs(models, batch, head_chunk=0)
    g = torch.Generator().manual_seed(5)
    return batch.with_(old_logprobs=(old + 0.05 * torch.randn(batch.num_tokens, generator=g)) * batch.loss_mask)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunked_head_equals_the_whole_block_and_the_reference(models, old_batch, layout):
    b = old_batch
    assert all(output_head(m) is not None for m in models)  # both models take the chunked path
    whole = _step(models, b, layout=layout, head_chunk=0)
    mask = b.loss_mask
    for rows in (1, 3, None):  # a row per chunk, several rows, the default (all rows in one chunk here)
        lp, ent, loss, grads = _step(models, b, layout=layout, head_chunk=rows)
        assert torch.allclose(lp[mask], whole[0][mask], atol=2e-6), rows
        assert torch.allclose(ent[mask], whole[1][mask], atol=2e-6), rows
        assert loss == pytest.approx(whole[2], abs=1e-6), rows
        assert any(g.abs().sum() > 0 for g in grads)
        for got, want in zip(grads, whole[3]):
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), rows
    # and against the slow reference (log-probs and, through the same loss, gradients)
    for m in models:
        m.zero_grad(set_to_none=True)
    ref = _reference(models, b)
    cfg = LossConfig()
    assert torch.allclose(whole[0].double()[mask], ref[mask], atol=2e-5)
    ref_loss, _ = srpo_loss(ref.float(), b, cfg, denominator=loss_denominator(b, cfg))
    ref_loss.backward()
    for got, want in zip(_step(models, b, layout=layout, head_chunk=3)[3], _grads(models)):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_a_biased_head_and_frozen_weights():
    """head_logprobs on a Linear with a bias against log_softmax(linear(h)/T) + gather, gradients of h,
    weight and bias; a frozen weight gets none (and costs no [V, H] accumulator)."""
    torch.manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=True)
    h = torch.randn(23, 16, requires_grad=True)
    target = torch.randint(0, 50, (23,))
    temp = torch.rand(23) + 0.5
    lp, ent = head_logprobs(h, head, target, temp, lambda scaled, s, e: None, rows=4)
    logp = torch.log_softmax(head(h).double() / temp.double().unsqueeze(1), -1)
    want = logp.gather(1, target.unsqueeze(1)).squeeze(1)
    assert torch.allclose(lp.double(), want, atol=1e-6)
    assert torch.allclose(ent.double(), -(logp.exp() * logp).sum(-1).detach(), atol=1e-5)
    w = torch.randn(23, dtype=torch.float64)
    got = torch.autograd.grad((lp.double() * w).sum(), [h, head.weight, head.bias])
    ref = torch.autograd.grad((want * w).sum(), [h, head.weight, head.bias])
    for a, r in zip(got, ref):
        assert torch.allclose(a.double(), r.double(), atol=1e-5)
    head.weight.requires_grad_(False)
    h2 = h.detach().requires_grad_(True)
    lp2, _ = head_logprobs(h2, head, target, temp, lambda scaled, s, e: None, rows=4)
    lp2.sum().backward()
    assert head.weight.grad is None and h2.grad is not None


def test_bf16_autocast_agrees_with_the_whole_block(models, batch):
    """Under bf16 autocast the chunked head runs in bf16 as ``lm_head(h)`` would: the same log-probs
    as the whole-block path under the same autocast, and close to float32."""
    with torch.no_grad():
        f32, _ = packed_logprobs(models, batch, layout="padded", head_chunk=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            whole, _ = packed_logprobs(models, batch, layout="padded", head_chunk=0)
            chunked, _ = packed_logprobs(models, batch, layout="padded", head_chunk=3)
    mask = batch.loss_mask
    assert torch.allclose(chunked[mask], whole[mask], atol=1e-3)
    assert (chunked[mask] - f32[mask]).abs().max() < 0.3  # bf16 rounding, not a different distribution
    assert not torch.equal(chunked[mask], f32[mask])  # autocast really ran the head in bf16


def _saved_shapes(fn) -> list[tuple[int, ...]]:
    """The shapes of every tensor autograd saves for backward while ``fn`` runs."""
    shapes: list[tuple[int, ...]] = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


def test_no_vocabulary_block_is_saved_for_backward(models, batch):
    vocab = models[0].config.vocab_size
    completion = int(batch.loss_mask.sum())
    for layout in LAYOUTS:
        whole = _saved_shapes(lambda: packed_logprobs(models, batch, layout=layout, head_chunk=0))
        assert max(s[0] for s in whole if len(s) == 2 and s[1] == vocab) >= completion // 4  # the control: [c, V] saved
        chunked = _saved_shapes(lambda: packed_logprobs(models, batch, layout=layout, head_chunk=3))
        assert not [s for s in chunked if s and s[-1] == vocab], layout  # nothing [.., V] but the weight [V, H]


def test_models_whose_head_is_not_a_plain_linear_keep_the_whole_block(models):
    from transformers import Gemma2Config

    class Wrapped(torch.nn.Module):  # no get_output_embeddings (e.g. FSDP's ordering wrapper)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    assert output_head(Wrapped(models[0])) is None
    tiny = models[0]
    saved = tiny.config
    try:
        tiny.config = Gemma2Config(final_logit_softcapping=30.0)
        assert output_head(tiny) is None
    finally:
        tiny.config = saved
    assert output_head(tiny) is tiny.lm_head
