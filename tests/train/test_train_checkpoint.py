"""Checkpoints: exact round trip of weights/optimizer/scheduler/RNG; half-written ones ignored."""

import json
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from srpo_graph.errors import ConfigError
from srpo_graph.models.tiny import ensure_tiny_model, load_tokenizer
from srpo_graph.train import checkpoint as ck


def _policy(lr=1e-2):
    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 1.0 / (1 + n))
    return model, load_tokenizer(path), opt, sched


def _train_one(model, opt, sched, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 30, (2, 6), generator=g)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def _save(run_dir, step, model, tok, opt, sched, keep=2):
    return ck.save_checkpoint(run_dir, ck.LoopState(step=step, cursor=step * 3, skipped_updates=1, rewards=[1.0]),
                              models={"p": model}, tokenizers={"p": tok}, optimizers={"p": opt},
                              schedulers={"p": sched}, keep_last=keep)


def test_round_trip_continues_exactly(tmp_path):
    model, tok, opt, sched = _policy()
    _train_one(model, opt, sched, 0)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    path = _save(tmp_path, 1, model, tok, opt, sched)
    expect_rng = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    _train_one(model, opt, sched, 1)  # the uninterrupted continuation
    # a fresh process: load the model from the checkpoint, restore optimizer/scheduler/RNG
    model2 = AutoModelForCausalLM.from_pretrained(ck.policy_path(path, "p"), dtype=torch.float32)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda n: 1.0 / (1 + n))
    state = ck.load_checkpoint(path, optimizers={"p": opt2}, schedulers={"p": sched2})
    assert (state.step, state.cursor, state.skipped_updates, state.rewards) == (1, 3, 1, [1.0])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expect_rng
    assert sched2.last_epoch == sched.last_epoch - 1
    _train_one(model2, opt2, sched2, 1)
    for (n, a), b in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(a, b), n


def test_half_written_checkpoints_are_never_taken(tmp_path):
    model, tok, opt, sched = _policy()
    _save(tmp_path, 2, model, tok, opt, sched)
    root = tmp_path / "checkpoints"
    # a crash during a later save: a temp folder, and a step folder without the COMPLETE marker
    (root / ".tmp-step_3-999").mkdir()
    (root / "step_4").mkdir()
    (root / "step_4" / "state.json").write_text("{")
    assert ck.latest_checkpoint(tmp_path) == root / "step_2"
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        ck.load_checkpoint(root / "step_4", optimizers={"p": opt}, schedulers={})
    _save(tmp_path, 5, model, tok, opt, sched)
    assert not (root / ".tmp-step_3-999").exists()  # stale temp folders are cleaned up


def test_keep_last_prunes_oldest(tmp_path):
    model, tok, opt, sched = _policy()
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, tok, opt, sched, keep=2)
    assert [s for s, _ in ck.checkpoint_dirs(tmp_path)] == [3, 4]
    meta = json.loads((tmp_path / "checkpoints" / "step_4" / "state.json").read_text())
    assert meta["step"] == 4 and meta["policies"] == ["p"]
    assert (tmp_path / "checkpoints" / "step_4" / "policies" / "p" / "model.safetensors").is_file()


def test_a_non_finite_model_is_never_saved(tmp_path):
    model, tok, opt, sched = _policy()
    _save(tmp_path, 1, model, tok, opt, sched)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        _save(tmp_path, 2, model, tok, opt, sched)
    assert ck.latest_checkpoint(tmp_path).name == "step_1"
