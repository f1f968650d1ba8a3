"""A training run on the Qwen3- and Llama 3-shaped BPE models built here (srpo_graph/models/),
with bf16 autocast and gradient checkpointing on: one command, one step, a checkpoint whose
model and tokenizer (chat template included) load back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["qwen3-test", "llama3-test"])
def test_one_command_trains_a_local_chat_model(name, tmp_path, monkeypatch):
    from click.testing import CliRunner
    from transformers import AutoModelForCausalLM

    from srpo_graph.cli import app
    from srpo_graph.models.tiny import load_tokenizer

    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "workflows/coord_par2.wf", "--steps", "1", "--run-dir", str(run),
                                   f'rollout.models={{"*"="{name}"}}', "rollout.tasks_per_step=4", "rollout.samples=4",
                                   "eval.every=0", "logging.tensorboard=false", "optim.autocast=bfloat16",
                                   "optim.gradient_checkpointing=true"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["tokens"] > 0
    saved = sorted((run / "checkpoints").glob("step_*/policies/*")) or sorted((run / "checkpoints").glob("step_*/*"))
    model_dirs = [p for p in saved if (p / "config.json").is_file()]
    assert model_dirs, saved
    model = AutoModelForCausalLM.from_pretrained(str(model_dirs[0]))
    assert type(model).__name__ == {"qwen3-test": "Qwen3ForCausalLM", "llama3-test": "LlamaForCausalLM"}[name]
    tok = load_tokenizer(model_dirs[0])
    assert tok.chat_template and tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                         add_generation_prompt=True)


def test_one_command_trains_the_chat_workflow(tmp_path, monkeypatch):
    """workflows/chat_search_qwen3.wf (a chat agent in turns, issue 21) trains on CPU with one command:
    its multi-turn outputs reach the update (one step) and the per-agent sampler/trainer gap is logged."""
    from click.testing import CliRunner

    from srpo_graph.cli import app

    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "workflows/chat_search_qwen3.wf", "--steps", "1", "--run-dir", str(run),
                                   "rollout.tasks_per_step=2", "rollout.samples=2", "eval.every=0",
                                   "logging.tensorboard=false"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["tokens"] > 0
    assert rows[0]["mismatch/searcher/max_abs"] < 1e-3  # the transformers backend samples with the trained weights
