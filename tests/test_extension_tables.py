"""The extension walkthroughs of docs/architecture.md are true: a toy objective and a toy strategy
added through their tables alone are selectable by config and run (issue 10)."""

from __future__ import annotations

import pytest
import torch

from srpo_graph.compiler.compile import compile
from srpo_graph.compiler.synthetic import synthetic_episodes
from srpo_graph.srpo import objectives
from srpo_graph.srpo.loss import srpo_loss
from srpo_graph.train.config.loading import load_config
from srpo_graph.train.parallel import strategies


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
    from srpo_graph.train.parallel.job import DistInfo

    dist = DistInfo(rank=0, world_size=2)  # rank 0 of 2 (no collective is called below)
    s = strategies.make_strategy("counting", dist)
    assert isinstance(s, Counting)
    b = compile(synthetic_episodes(3, 4, seed=2))
    assert 0 < s.shard(b).num_sets < b.num_sets  # rank 0's whole events only
    assert isinstance(strategies.make_strategy("counting", DistInfo()), strategies.Single)  # one process
    s.reduce_grads([torch.nn.Parameter(torch.zeros(2))])
    assert calls == [1]


_TOY_BACKEND = '''
"""A toy backend added through BACKENDS alone: one options model, two builders, one row."""
import json
import sys
from pathlib import Path

from pydantic import Field

import srpo_graph.backends as B
from srpo_graph.backends.options import BackendOptions


class CountingOptions(BackendOptions):
    log: Path = Field(Path("calls.jsonl"), description="Where every generate call is logged.")


class Counting:
    """Samples with the transformers backend it wraps; logs the size of every batch."""

    def __init__(self, inner, log):
        self.inner, self.log, self.tokenizer = inner, Path(log), inner.tokenizer

    def generate(self, requests):
        with self.log.open("a") as f:
            f.write(json.dumps({"requests": len(requests)}) + "\\n")
        return self.inner.generate(requests)

    def sync_weights(self, model, version):
        self.inner.sync_weights(model, version)

    def close(self):
        self.inner.close()


def load(model, options, *, device="cpu", **kw):
    return Counting(B.load_backend("transformers", model, device=device), options.log)


def for_training(policies, options, run_dir):
    inner = B.BACKENDS["transformers"].for_training(policies, B.TransformersOptions(), run_dir)
    return {name: Counting(b, options.log) for name, b in inner.items()}


B.BACKENDS["counting"] = B.BackendSpec("Counts generate calls.", CountingOptions, load, for_training, in_process=True)

from srpo_graph.cli import main  # noqa: E402  (after the row: the config and CLI are generated from the table)

main(sys.argv[1:])
'''


@pytest.mark.proc
def test_a_toy_backend_through_the_table_alone(tmp_path):
    """The row alone gives the backend a `run --backend` choice and `--counting-log` flag, a
    `rollout.counting` config section, training on it, and a line in the config reference."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "toy_backend.py"
    script.write_text(_TOY_BACKEND)
    env = {**os.environ, "PYTHONPATH": str(root)}

    def cli(*args):
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, cwd=root,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    wf, tasks = "workflows/coord_par2.wf", "workflows/tasks/coord.jsonl"
    run_help = cli("run", "--help").stdout
    assert "counting" in run_help and "--counting-log" in run_help
    run_log = tmp_path / "run_calls.jsonl"
    cli("run", wf, "--tasks", tasks, "--limit", "2", "--samples", "2", "--backend", "counting",
        "--counting-log", str(run_log), "--out", str(tmp_path / "t.jsonl"), "--quiet")
    assert sum(json.loads(line)["requests"] for line in run_log.read_text().splitlines()) == 2 * 2 * 2  # 2 agents

    train_log = tmp_path / "train_calls.jsonl"
    run_dir = tmp_path / "run"
    cli("train", wf, "steps=2", "rollout.backend=counting", f"rollout.counting.log={train_log}",
        "rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0", f"run_dir={run_dir}", "logging.plots=false")
    assert len(train_log.read_text().splitlines()) >= 2  # one batch per step at least
    assert 'backend = "counting"' in (run_dir / "config.toml").read_text()
    assert "[rollout.counting]" in (run_dir / "config.toml").read_text()
    with pytest.raises(AssertionError, match="unknown backend 'nope'"):
        cli("train", wf, "steps=1", "rollout.backend=nope", f"run_dir={tmp_path / 'r2'}")
