"""Step metrics are the whole mini-batch's (item 9) and clipping acts inside the update loop (item 11).

Diagnostics of many micro-batches, combined from sums, equal those of one call on the whole
mini-batch (the old code averaged per-micro-batch means: a wrong loss, ratio max and event
count); the update on a real tiny model clips from epoch 2 on, and that changes the weights.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo.diagnostics import LossDiagnostics
from srpo_graph.srpo.loss import loss_denominator, srpo_loss
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.learn.update import UpdatePolicy, recompute_old_logprobs, update_policies


def _new(b, seed=0):
    g = torch.Generator().manual_seed(seed)
    return b.old_logprobs.double() + 0.3 * torch.randn(b.num_tokens, generator=g, dtype=torch.float64) * b.loss_mask


@pytest.mark.parametrize("unit", ["set", "member", "token"])
def test_combined_micro_batch_diagnostics_equal_the_whole_batch(unit):
    eps = synthetic_episodes(4, 4, seed=11, max_set=4, policies=("p0", "p1"))
    b = compile(eps, CompileConfig(micro_batch_tokens=60))
    assert b.num_micro_batches > 3
    cfg = LossConfig(ratio_unit=unit)
    new = _new(b)
    ent = torch.rand(b.num_tokens, generator=torch.Generator().manual_seed(1))
    _, whole = srpo_loss(new, b.with_micro_batch_tokens(0), cfg, entropy=ent, ref_logprobs=b.old_logprobs.double())
    D = loss_denominator(b, cfg)
    parts = []
    start = 0
    for mb in b.micro_batches():  # contiguous runs of whole sets: contiguous slices of the stream
        idx = torch.arange(start, start + mb.num_tokens)
        start += mb.num_tokens
        _, d = srpo_loss(new[idx], mb, cfg, denominator=D, entropy=ent[idx], ref_logprobs=b.old_logprobs.double()[idx])
        parts.append(d)
    assert start == b.num_tokens
    combined = LossDiagnostics.combine(parts, "micro").to_dict()
    want = whole.to_dict()
    assert set(combined) == set(want)
    for k, v in want.items():
        assert combined[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k  # float32 per-token work
    assert combined["num_events"] == b.num_sets and combined["ratio_max"] > 1.2


def _real_batch(model_dir):
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task

    wf = load_workflow("workflows/coord_par2.wf")
    backend = TransformersBackend.from_pretrained(str(model_dir))
    eps = run(wf, [Task(id=f"t{i}", fields={"target": i}) for i in range(8)], {"tiny": backend},
              samples=8, seed=5).episodes
    return compile(eps, CompileConfig(micro_batch_tokens=64, policies=("tiny",)))


def _train(model_dir, batch, loss_cfg):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    b, _ = recompute_old_logprobs([model], batch)
    res = update_policies([UpdatePolicy(model, opt)], b, loss_cfg, epochs=3, mini_batches=2, grad_clip=0.0, seed=1)
    return res, {k: v.detach().clone() for k, v in model.named_parameters()}


def test_clipping_acts_from_the_second_epoch_and_changes_the_update(tmp_path, tiny_copy):
    torch.set_num_threads(1)
    model_dir = tiny_copy(tmp_path / "tiny")
    batch = _real_batch(model_dir)
    res, clipped_w = _train(model_dir, batch, LossConfig(eps_low=0.05, eps_high=0.05))
    d = res.diagnostics
    # epoch 1's first mini-batch runs at ratio 1 (nothing clipped); by epoch 2 the ratio has moved
    assert d["epoch2/clip_frac"] > 0 and d["epoch3/clip_frac"] > 0
    assert d["epoch1/clip_frac"] < d["epoch2/clip_frac"]
    assert d["num_events"] == batch.num_sets  # per pass, not summed over epochs or averaged over micro-batches
    assert any(k.startswith("epoch2/clip_upper/k2") for k in d) and "epoch2/clip_upper/a" in d
    res_free, free_w = _train(model_dir, batch, LossConfig(eps_low=0.99, eps_high=10.0))
    assert res_free.diagnostics["clip_frac"] < 0.5 * d["clip_frac"]
    diff = max((clipped_w[k] - free_w[k]).abs().max().item() for k in clipped_w)
    assert diff > 1e-4  # the clip changed the update
    assert d["loss"] == pytest.approx(res.loss, rel=1e-5, abs=1e-7)  # the logged loss is the mini-batches' mean
