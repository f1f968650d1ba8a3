"""packed_logprobs against running each member separately (unpacked) through the real models.

Models: the built-in tiny model (ensure_tiny_model) and a second, smaller LlamaConfig model made
here with transformers (hidden 32, 2 layers) as another policy. Also: real traces from the
tiny model running a coordination workflow, whose recomputed log-probs must equal the
sampler's (same model, same temperature and constraint).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from srpo_graph.compiler.compile import compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.logprobs import packed_logprobs
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig
from tests.support.models import NoKeep, tiny_and_small

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models():
    """The built tiny model (Llama) and a small Llama with a tied head (tests/support/models.py)."""
    return tiny_and_small("llama")


def unpacked_logprobs(models, b) -> tuple[dict[int, float], dict[int, float]]:
    """Member by member, token by token, float64: the distribution the sampler used."""
    lp, ent = {}, {}
    for m in range(b.num_members):
        s, e = int(b.member_offsets[m]), int(b.member_offsets[m + 1])
        model = models[int(b.member_policy[m])]
        ids = b.input_ids[s:e]
        with torch.no_grad():
            logits = model(input_ids=ids.unsqueeze(0)).logits[0].double()
        logits = logits / float(b.member_temperature[m])
        a = int(b.member_allowed[m])
        if a >= 0:
            allow = torch.zeros(logits.shape[1], dtype=torch.bool)
            allow[b.allowed(a)] = True
            logits = logits.masked_fill(~allow, float("-inf"))
        logp = torch.log_softmax(logits, dim=-1)
        for t in range(s + 1, e):
            if b.loss_mask[t]:
                row = logp[t - s - 1]
                lp[t] = float(row[int(b.input_ids[t])])
                p = row.exp()
                ent[t] = float(-(p[p > 0] * row[p > 0]).sum())
    return lp, ent


def test_packed_equals_unpacked_with_two_policies(models):
    vocab = models[0].config.vocab_size
    b = compile(synthetic_episodes(2, 3, seed=1, vocab=vocab, policies=("tiny", "small"), completion_len=(1, 9)))
    assert b.policies == ["tiny", "small"] and (b.member_allowed >= 0).any() and (b.member_temperature != 1).any()
    lp, ent = packed_logprobs(models, b)
    want_lp, want_ent = unpacked_logprobs(models, b)
    assert set(want_lp) == set(b.loss_mask.nonzero().squeeze(1).tolist())
    for t, v in want_lp.items():
        assert lp[t].item() == pytest.approx(v, abs=1e-5)
        assert ent[t].item() == pytest.approx(want_ent[t], abs=1e-5)
    assert torch.all(lp[~b.loss_mask] == 0)


def test_gradient_reaches_only_each_members_own_policy(models):
    vocab = models[0].config.vocab_size
    b = compile(synthetic_episodes(1, 2, seed=2, vocab=vocab, policies=("tiny", "small")))
    only_tiny = b.select_sets([s for s in range(b.num_sets)
                               if set(b.member_policy[b.member_set == s].tolist()) == {0}])
    assert only_tiny.num_sets > 0
    for m in models:
        m.zero_grad(set_to_none=True)
    lp, _ = packed_logprobs(models, only_tiny)
    lp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in models[0].parameters())
    assert all(p.grad is None for p in models[1].parameters())
    for m in models:
        m.zero_grad(set_to_none=True)


def test_real_traces_from_the_tiny_model_recompute_to_the_sampler_logprobs(models, tmp_path):
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.compiler.setbatch import SetBatch
    from srpo_graph.lang import load_workflow
    from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task
    from srpo_graph.runtime.trace import read_traces, write_traces

    wf = load_workflow(REPO / "workflows" / "coord_mixed.wf")
    backend = TransformersBackend(models[0], load_tokenizer(ensure_tiny_model()))
    tasks = [Task(id=f"t{i}", fields={"target": i}) for i in range(4)]
    result = run(wf, tasks, {"tiny": backend}, samples=4, seed=3)
    path = tmp_path / "traces.jsonl"
    write_traces(path, result.episodes)
    b = compile(read_traces(path))
    assert sorted(set(b.set_size.tolist())) == [1, 2]
    b.save(tmp_path / "b.safetensors")
    b = SetBatch.load(tmp_path / "b.safetensors")
    with torch.no_grad():
        lp, _ = packed_logprobs([models[0]], b)
    assert torch.allclose(lp[b.loss_mask], b.sampler_logprobs[b.loss_mask], atol=1e-5)
    # one real loss step: old == new so the ratio is 1 and the gradient is finite and non-zero
    lp, ent = packed_logprobs([models[0]], b)
    cfg = LossConfig()
    loss, diag = srpo_loss(
        lp, b.with_(old_logprobs=lp.detach()), cfg, denominator=loss_denominator(b, cfg), entropy=ent
    )
    loss.backward()
    assert diag.ratio_max.item() == pytest.approx(1.0)
    grads = [p.grad for p in models[0].parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    models[0].zero_grad(set_to_none=True)


def test_gradients_equal_unpacked_and_both_logit_paths_agree(models):
    small = models[1]
    vocab = small.config.vocab_size
    b = compile(synthetic_episodes(2, 2, seed=4, vocab=vocab, policies=("small",), completion_len=(1, 6)))
    assert (b.member_allowed >= 0).any()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(b.num_tokens, generator=g)  # a random linear functional of the log-probs
    small.zero_grad(set_to_none=True)
    lp, _ = packed_logprobs([small], b)
    (lp * w).sum().backward()
    packed = [p.grad.clone() for p in small.parameters()]
    small.zero_grad(set_to_none=True)
    lp_full, _ = packed_logprobs([NoKeep(small)], b)  # full [tokens, V] logits, then gathered
    assert torch.allclose(lp_full.detach(), lp.detach(), atol=1e-6)
    small.zero_grad(set_to_none=True)
    total = 0.0
    for m in range(b.num_members):  # one member at a time, no packing
        s, e = int(b.member_offsets[m]), int(b.member_offsets[m + 1])
        logits = small(input_ids=b.input_ids[s:e].unsqueeze(0)).logits[0] / float(b.member_temperature[m])
        a = int(b.member_allowed[m])
        if a >= 0:
            allow = torch.zeros(vocab, dtype=torch.bool)
            allow[b.allowed(a)] = True
            logits = logits.masked_fill(~allow, float("-inf"))
        logp = torch.log_softmax(logits, -1)
        for t in range(s + 1, e):
            if b.loss_mask[t]:
                total = total + w[t] * logp[t - s - 1, int(b.input_ids[t])]
    total.backward()
    for got, p in zip(packed, small.parameters()):
        assert torch.allclose(got, p.grad, atol=1e-5, rtol=1e-4)
    small.zero_grad(set_to_none=True)
