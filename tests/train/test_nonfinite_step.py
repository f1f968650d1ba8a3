"""The non-finite guard also catches NaN/inf made by the optimizer step itself (issue 12, item 8).

Real tiny model, real AdamW steps: the step is rolled back (weights and Adam state exactly as
before), counted as a skipped update, and the scheduler does not advance. Configs that cannot
train (float16 without a loss scaler, an eps below the dtype's smallest normal) are refused.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from srpo_graph.compiler.compile import CompileConfig, compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.errors import ConfigError
from srpo_graph.models.tiny import ensure_tiny_model
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.config.loading import TrainConfig, load_config
from srpo_graph.train.learn.update import UpdatePolicy, recompute_old_logprobs, update_policies


def _setup(dtype):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=dtype).eval()
    eps = synthetic_episodes(4, 4, seed=3, max_set=2, vocab=32, policies=("p0",))
    batch = compile(eps, CompileConfig(micro_batch_tokens=64, policies=("p0",)))
    return model, batch


def _update(model, opt, batch, sched=None, mini_batches=1):
    batch, _ = recompute_old_logprobs([model], batch)
    return update_policies([UpdatePolicy(model, opt, sched)], batch, LossConfig(), epochs=1, mini_batches=mini_batches,
                           grad_clip=1.0, seed=1)


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_float16_adamw_nan_weights_are_rolled_back_and_counted():
    model, batch = _setup(torch.float16)  # the case: NaN weights after one float16 AdamW update
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0)
    before = _params(model)
    res = _update(model, opt, batch, sched, mini_batches=2)
    assert res.skipped_updates == 2 and res.num_updates == 0
    assert res.warnings == ["non-finite weights after the optimizer step; update rolled back"] * 2
    after = _params(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not opt.state and sched.last_epoch == 0  # no optimizer state kept, the schedule did not move


def test_an_overflowing_step_restores_weights_and_adam_state_exactly():
    model, batch = _setup(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    assert _update(model, opt, batch).num_updates == 1  # a normal step: Adam state exists now
    emb = model.get_input_embeddings().weight
    assert int(batch.input_ids.max()) < emb.shape[0] - 1
    with torch.no_grad():  # a row no token of the batch uses: the loss stays finite ...
        emb[-1].fill_(1e10)
    for group in opt.param_groups:  # ... but the decoupled weight decay overflows it: 1e10 * 1e30
        group["lr"], group["weight_decay"] = 1e30, 1.0
    before = _params(model)
    state = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in model.named_parameters()}
    res = _update(model, opt, batch)
    assert (res.num_updates, res.skipped_updates) == (0, 1)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    for n, p in model.named_parameters():
        assert all(torch.equal(state[n][k], v) for k, v in opt.state[p].items()), n
    for group in opt.param_groups:  # and training goes on from the same state
        group["lr"], group["weight_decay"] = 1e-3, 0.01
    with torch.no_grad():
        emb[-1].zero_()
    assert _update(model, opt, batch).num_updates == 1


@pytest.mark.parametrize("overrides, field, fix", [
    (["rollout.dtype=float16"], "rollout.dtype", "bfloat16"),
    (["optim.eps=1e-46"], "optim.eps", "optim.eps >= 1.18e-38"),
    (["optim.eps=1e-39", "rollout.dtype=bfloat16"], "optim.eps", "optim.eps >= 1.18e-38"),
])
def test_configs_that_cannot_train_are_refused(overrides, field, fix):
    with pytest.raises(ConfigError, match=f"field `{field}`") as info:
        load_config(None, overrides)
    assert fix in str(info.value)


def test_train_refuses_them_too_when_built_in_code(tmp_path):
    from srpo_graph.train.config.schema import RolloutConfig
    from srpo_graph.train.trainer import train

    with pytest.raises(ConfigError, match="rollout.dtype"):
        train("workflows/coord_seq.wf", TrainConfig(run_dir=tmp_path / "r", rollout=RolloutConfig(dtype="float16")))
    assert not (tmp_path / "r").exists()  # refused before anything was created


def test_without_rollback_a_non_finite_step_stops_instead_of_keeping_nan_weights():
    model, batch = _setup(torch.float16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b, _ = recompute_old_logprobs([model], batch)
    with pytest.raises(FloatingPointError, match="rollback_nonfinite"):
        update_policies([UpdatePolicy(model, opt)], b, LossConfig(), epochs=1, mini_batches=1, grad_clip=1.0, seed=1,
                        rollback_nonfinite=False)
