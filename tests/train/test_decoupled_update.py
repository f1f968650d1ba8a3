"""Decoupled PPO on a real tiny model with genuinely stale rollouts (issue 26, item 3).

Episodes are sampled by the transformers backend at weights v0; the model then takes one update
(v1), and the next update uses those v0 episodes: pi_old (recomputed at v1, the proximal policy)
differs from the sampler's log-probs (v0, the behaviour policy) by a real update, not by injected
noise. Every ratio unit trains with ``mismatch = decoupled``; the step's diagnostics report the
importance weights by set size and the clipped/masked shares, and the staleness histogram says
every output is one version old.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.srpo.diagnostics import staleness_histogram
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.learn.update import UpdatePolicy, recompute_old_logprobs, update_policies


@pytest.fixture(scope="module")
def stale(tmp_path_factory, tiny_copy):
    from srpo_graph.backends.transformers import TransformersBackend
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.executor import run
    from srpo_graph.runtime.tasks import Task

    torch.set_num_threads(1)
    model_dir = tiny_copy(tmp_path_factory.mktemp("tiny") / "tiny")
    wf = load_workflow("workflows/coord_par2.wf")
    backend = TransformersBackend.from_pretrained(str(model_dir))
    eps = run(wf, [Task(id=f"t{i}", fields={"target": i}) for i in range(6)], {"tiny": backend},
              samples=6, seed=5).episodes
    batch = compile(eps, CompileConfig(micro_batch_tokens=64, policies=("tiny",)))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    b0, _ = recompute_old_logprobs([model], batch)
    update_policies([UpdatePolicy(model, opt)], b0, LossConfig(), epochs=1, mini_batches=1, grad_clip=0.0, seed=1)
    return model_dir, model.state_dict(), batch  # weights v1, episodes sampled at v0


@pytest.mark.parametrize("unit", ["set", "member", "token"])
def test_decoupled_update_on_stale_rollouts_reports_weights_and_staleness(stale, unit):
    model_dir, v1, batch = stale
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(v1)
    b, mismatch = recompute_old_logprobs([model], batch)
    assert mismatch["max_abs"] > 1e-2  # pi_old (v1) really differs from the behaviour policy (v0)
    assert staleness_histogram(b, {"tiny": 1}) == {"mean": 1.0, "max": 1.0, "s1": 1.0, "tokens_s1": 1.0}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = LossConfig(ratio_unit=unit, mismatch="decoupled", decoupled_cap="mask", mismatch_threshold=1.5)
    res = update_policies([UpdatePolicy(model, opt)], b, cfg, epochs=2, mini_batches=2, grad_clip=0.0, seed=1)
    d = res.diagnostics
    sizes = [k.removeprefix("is_weight_mean/k") for k in d if k.startswith("is_weight_mean/k")]
    assert sizes and all(f"is_masked/k{k}" in d and f"is_weight_std/k{k}" in d for k in sizes)
    assert any(abs(d[f"is_weight_mean/k{k}"] - 1.0) > 1e-3 for k in sizes)  # the weights are not 1
    for key in ("tokens_clipped_share", "sets_clipped_share", "tokens_masked_share", "mismatch_masked_share"):
        assert 0.0 <= d[key] <= 1.0
    assert d["is_weight_max"] > 1.0 and torch.isfinite(torch.tensor(res.loss))
