"""The update's memory options (train/policies/precision.py): gradient checkpointing gives the same
gradients as the plain forward while saving far fewer tensors for backward (it really
checkpoints, though the trainer keeps models in eval mode), bf16 autocast runs the matmuls in
bf16 with float32 weights and gradients, both reach ``update_policies`` through the config, and
the config refuses other values naming the field."""

from __future__ import annotations

import copy

import pytest
import torch

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.errors import ConfigError
from srpo_graph.srpo.logprobs import choose_layout, packed_logprobs
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.config.loading import TrainConfig, apply_overrides
from srpo_graph.train.learn.update import UpdatePolicy, recompute_old_logprobs, update_policies
from srpo_graph.train.policies.precision import enable_gradient_checkpointing, update_forward


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from srpo_graph.models.tiny import ensure_tiny_model

    return AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model())).eval()


@pytest.fixture(scope="module")
def batch(model):
    eps = synthetic_episodes(2, 3, seed=3, vocab=model.config.vocab_size, policies=("tiny",),
                             prompt_len=(4, 20), completion_len=(2, 10))
    return compile(eps, CompileConfig(micro_batch_tokens=10**6))


def _grads_and_saved(m, b, autocast="off"):
    m.zero_grad(set_to_none=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        with update_forward([m], autocast):
            lp, _ = packed_logprobs([m], b, layout="padded")
    (lp * torch.linspace(-1, 1, lp.numel())).sum().backward()
    return lp.detach(), [p.grad.clone() for p in m.parameters()], sum(saved)


def test_gradient_checkpointing_same_gradients_fewer_saved_activations(model, batch):
    plain = copy.deepcopy(model)
    ckpt = copy.deepcopy(model)
    assert enable_gradient_checkpointing(ckpt) == ckpt.config.num_hidden_layers
    assert choose_layout(plain) == "prefix" and choose_layout(ckpt) == "padded"  # the cache is off with it
    lp0, g0, saved0 = _grads_and_saved(plain, batch)
    lp1, g1, saved1 = _grads_and_saved(ckpt, batch)
    assert torch.allclose(lp0, lp1, atol=1e-6)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert saved1 < 0.5 * saved0  # the layers' activations are not kept
    assert not any(m.training for m in ckpt.modules())  # eval mode again after the forward (no dropout)
    with pytest.raises(ValueError, match="GradientCheckpointingLayer"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_bf16_autocast_runs_in_bf16_with_float32_weights_and_gradients(model, batch):
    m = copy.deepcopy(model)
    lp32, g32, _ = _grads_and_saved(m, batch)
    lp16, g16, _ = _grads_and_saved(m, batch, autocast="bfloat16")
    mask = batch.loss_mask
    diff = (lp16 - lp32)[mask].abs().max()
    assert 0 < diff < 0.3  # bf16 rounding: different, not another distribution
    assert all(g.dtype == torch.float32 for g in g16) and all(p.dtype == torch.float32 for p in m.parameters())
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in g16]),
                                                torch.cat([g.flatten() for g in g32]), dim=0)
    assert cos > 0.95


def test_the_options_reach_the_update(model, batch):
    cfg = apply_overrides(TrainConfig(), ["optim.autocast=bfloat16", "optim.gradient_checkpointing=true"])
    assert cfg.optim.autocast == "bfloat16" and cfg.optim.gradient_checkpointing
    with pytest.raises(ConfigError, match="optim.autocast"):
        apply_overrides(TrainConfig(), ["optim.autocast=float8"])
    results = {}
    for autocast in ("off", "bfloat16"):
        m = copy.deepcopy(model)
        enable_gradient_checkpointing(m)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        b, _ = recompute_old_logprobs([m], batch, autocast=autocast)
        res = update_policies([UpdatePolicy(m, opt)], b, LossConfig(), epochs=1, mini_batches=1, grad_clip=0.0,
                              seed=0, autocast=autocast)
        results[autocast] = (b.old_logprobs, res.loss)
    assert not torch.equal(results["off"][0], results["bfloat16"][0])  # the old log-probs under the same autocast
