"""The extension walkthroughs of docs/architecture.md are true: a toy objective and a toy strategy
added through their tables alone are selectable by config and run (issue 10)."""

from __future__ import annotations

import pytest
import torch

from srpo_graph.compiler.compile import compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo import objectives
from srpo_graph.srpo.loss import srpo_loss
from srpo_graph.train import strategies
from srpo_graph.train.config import load_config


def test_a_toy_objective_through_the_table_alone(monkeypatch):
    toy = objectives.Objective("toy", "Toy: member ratio, sum reduction", "https://arxiv.org/abs/0000.00000",
                               loss={"ratio_unit": "member", "reduction": "constant", "constant_denominator": 7.0},
                               compile={"advantage": "episode", "use_std": False})
    monkeypatch.setitem(objectives.OBJECTIVES, "toy", toy)
    cfg = load_config(None, ["objective=toy", "loss.eps_high=0.3"])
    assert cfg.loss.ratio_unit.value == "member" and cfg.loss.constant_denominator == 7.0
    assert cfg.loss.eps_high == 0.3 and cfg.compile.use_std is False  # explicit settings win over the row
    assert "`toy`" in objectives.objectives_table()
    b = compile(synthetic_episodes(2, 3, seed=1), cfg.compile)
    loss, _ = srpo_loss(b.old_logprobs.clone(), b, cfg.loss)  # ratio 1: -sum(member A) / 7
    assert loss.item() == pytest.approx(-b.member_advantage.double().sum().item() / 7.0, abs=1e-6)
    with pytest.raises(Exception, match="unknown objective 'tooy'.*did you mean 'toy'"):
        load_config(None, ["objective=tooy"])


def test_a_toy_strategy_through_the_table_alone(monkeypatch):
    calls = []

    class Counting(strategies.DataParallel):
        name = "counting"

        def reduce_grads(self, params):
            calls.append(len(params))

    monkeypatch.setitem(strategies.STRATEGIES, "counting", Counting)
    assert load_config(None, ["strategy=counting"]).strategy == "counting"
    with pytest.raises(Exception, match="unknown strategy"):
        load_config(None, ["strategy=nope"])
    from srpo_graph.train.distributed import DistInfo

    dist = DistInfo(rank=0, world_size=2)  # rank 0 of 2 (no collective is called below)
    s = strategies.make_strategy("counting", dist)
    assert isinstance(s, Counting)
    b = compile(synthetic_episodes(3, 4, seed=2))
    assert 0 < s.shard(b).num_sets < b.num_sets  # rank 0's whole events only
    assert isinstance(strategies.make_strategy("counting", DistInfo()), strategies.Single)  # one process
    s.reduce_grads([torch.nn.Parameter(torch.zeros(2))])
    assert calls == [1]
