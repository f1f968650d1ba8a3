"""The chat recipe on Qwen3's exact vocabulary (``models/chat_recipe.py``, ``qwen3-realvocab-math``).

The real build takes minutes; here the same code builds a shrunken copy (a narrow network, a few
SFT steps) into temporary folders. The tokenizer is the exact one (vocab.py), so the tests skip
without the ``tokenizers`` extra.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from srpo_graph.models import chat_recipe as C
from srpo_graph.models import recipes as R
from srpo_graph.models import sft_data as D

NAME = "qwen3-realvocab-math"
ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "workflows" / "chat_math_qwen3.wf"
# Qwen2.5's well-known ids for its default system turn (issue 37): the exact BPE, not one trained here
QWEN_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
QWEN_SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]
NARROW = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
              num_hidden_layers=1, max_position_embeddings=256)


@pytest.fixture
def tok(realvocab):
    from srpo_graph.models.vocab import load_vocab_tokenizer

    realvocab("qwen3-realvocab-test")  # skips without the extra; builds the cached tokenizer once
    return load_vocab_tokenizer("qwen3")


@pytest.fixture
def small(monkeypatch, tok, tmp_path):
    """The recipe at a narrow width and 4 SFT steps, resolving under a temporary SRPO_GRAPH_HOME."""
    monkeypatch.setattr(C, "WIDTH", NARROW)
    r = replace(R.RECIPES[NAME], num_examples=300, steps=4, batch_size=8)
    monkeypatch.setitem(R.RECIPES, NAME, r)
    return r


def test_the_data_are_the_imperfect_teachers_and_never_held_out():
    a = C.chat_math_examples(random.Random(0), 2000)
    assert a == C.chat_math_examples(random.Random(0), 2000) and a != C.chat_math_examples(random.Random(1), 2000)
    assert not any(D.is_held_out(q) for q, _ in a)
    arith = [(q, c) for q, c in a if q[0].isdigit()]  # "6+3-2": its answer is the expression's value
    right = sum(D.solution_correct(c, str(eval(q))) for q, c in arith) / len(arith)
    assert 0.45 < right < 0.8  # the teacher's slips and missing #answers (Note [An imperfect teacher])
    held = C.held_out_examples(random.Random(0), 50)
    assert all(D.is_held_out(q) and "#" in c for q, c in held)


def test_the_sft_prompt_is_what_the_workflows_chat_agent_sends(tok):
    """The SFT prompts are the template's rendering of the agent's system prompt and question, encoded
    as the runtime encodes a chat prompt; the workflow's agent says the same system prompt."""
    from srpo_graph.lang import load_workflow
    from srpo_graph.runtime.chat import chat_plan

    agent = next(a for a in load_workflow(WORKFLOW).agents if a.name == "solver")
    assert agent.chat is not None and agent.chat.system is not None
    assert "".join(p.text for p in agent.chat.system.parts) == C.SYSTEM
    assert [getattr(p, "text", None) for p in agent.template.parts] == [None]  # "{task.question}"
    [(ids, n_prompt)] = C.encode_pairs(tok, [("3+4-2", "3+4=7;7-2=5;#5")])
    cp = chat_plan(agent, tok)
    text = cp.render(C.chat_messages("3+4-2"))
    assert text.endswith("<|im_start|>assistant\n") and ids[:n_prompt] == list(cp.encode(text))
    assert tok.decode(ids[n_prompt:]) == "3+4=7;7-2=5;#5<|im_end|>"


def test_the_pooled_loss_is_the_full_vocabulary_models_loss(tok):
    """Note [Training the rows the data uses]: the SFT loss over the used ids plus one pooled logit is,
    exactly, the loss of the widened 151,669-way model whose other rows are all the SFT model's last row."""
    import torch

    seqs = C.encode_pairs(tok, C.chat_math_examples(random.Random(0), 6))
    used = C.used_ids(tok, seqs)
    local = {g: i for i, g in enumerate(used)}
    torch.manual_seed(0)
    cfg = {**C.config_dict("qwen3", len(used)), **NARROW, "bos_token_id": None, "eos_token_id": None}
    model = C._model({**cfg, "vocab_size": len(used) + 1}).eval()
    full = C.widen(model, used, {**C.config_dict("qwen3", len(tok)), **NARROW})
    assert full.config.vocab_size == len(tok) == 151_669  # no id the tokenizer cannot decode
    width = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    labels = torch.full_like(ids, -100)
    attn = torch.zeros_like(ids)
    for i, (s, n) in enumerate(seqs):
        ids[i, : len(s)], attn[i, : len(s)] = torch.tensor(s), 1
        labels[i, n : len(s)] = torch.tensor(s[n:])
    to_local = torch.tensor([local.get(i, 0) for i in range(len(tok))])
    local_labels = torch.where(labels >= 0, to_local[labels.clamp(min=0)], labels)
    with torch.no_grad():
        pooled = C.pooled_loss(len(tok) - len(used))(model, to_local[ids], attn, local_labels)
        exact = full(input_ids=ids, attention_mask=attn, labels=labels).loss
    assert torch.allclose(pooled, exact, atol=1e-5), (pooled, exact)
    unused = torch.ones(len(tok), dtype=torch.bool)
    unused[used] = False
    emb = full.get_input_embeddings().weight
    shared = model.get_input_embeddings().weight[-1]
    assert shared.any() and torch.equal(emb[unused], shared.expand(int(unused.sum()), -1))


def test_an_unused_id_fed_back_as_input_gets_a_gradient_like_a_trained_ids(tok):
    """The rule behind Note [Training the rows the data uses]: no row of the tied embedding is zero, so
    an unused id that RL samples and feeds back as the next input gets a gradient of a trained row's
    size. (Zero rows made RMSNorm's 1/sqrt(eps) reach it: ~10^5 times larger, which the global clip
    then spread over the whole update.)"""
    import torch

    seqs = C.encode_pairs(tok, C.chat_math_examples(random.Random(1), 4))
    used = C.used_ids(tok, seqs)
    torch.manual_seed(0)
    cfg = {**C.config_dict("qwen3", len(used) + 1), **NARROW, "bos_token_id": None, "eos_token_id": None}
    full = C.widen(C._model(cfg), used, {**C.config_dict("qwen3", len(tok)), **NARROW})
    s, n_prompt = seqs[0]
    stray = next(i for i in range(1000, len(tok)) if i not in set(used))
    ids = torch.tensor([s[: n_prompt + 1] + [stray] + s[n_prompt + 1 :]])  # sampled mid-completion
    logp = full(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])
    (-logp[n_prompt - 1 :].mean()).backward()
    rows = full.get_input_embeddings().weight.grad.norm(dim=1)
    assert rows[stray] < 10 * rows[used].max(), (float(rows[stray]), float(rows[used].max()))


def test_the_build_is_deterministic_exact_and_loads_like_any_model(small, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a, b = R.ensure_recipe_model(NAME, tmp_path / "a"), R.ensure_recipe_model(NAME, tmp_path / "b")
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    info = R.recipe_info(a)
    assert info["recipe"] == NAME and info["steps"] == 4 and info["vocab_size"] == 151_669
    assert 50 < info["trained_rows"] < 300 and 0 <= info["unused_mass"]["mean"] <= info["unused_mass"]["max"] <= 1
    model = AutoModelForCausalLM.from_pretrained(str(a))
    tok = AutoTokenizer.from_pretrained(str(a))
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.vocab_size == len(tok)
    assert tok(QWEN_SYSTEM, add_special_tokens=False)["input_ids"] == QWEN_SYSTEM_IDS
    assert tok.eos_token == "<|im_end|>" and "<think>" in tok.chat_template
    logits = model(torch.tensor([QWEN_SYSTEM_IDS])).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


def test_the_checker_and_resolve_model_know_the_recipe(small, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from srpo_graph.cli import app
    from srpo_graph.lang.chat import builtin_chat_template
    from srpo_graph.models import local_names, resolve_model

    assert NAME in local_names() and builtin_chat_template(NAME) is True
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(app, ["check", str(WORKFLOW)])
    assert res.exit_code == 0, res.output
    assert resolve_model(NAME) == str(tmp_path / "home" / NAME) and R.is_recipe_dir(tmp_path / "home" / NAME, NAME)


@pytest.mark.slow
def test_the_chat_workflow_trains_two_steps(small, tmp_path, monkeypatch):
    """``srpo-graph train workflows/chat_math_qwen3.wf`` on the (shrunken) recipe: two steps, an
    evaluation, and every sampled id is one the tokenizer decodes."""
    import json

    from click.testing import CliRunner

    from srpo_graph.cli import app

    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", str(WORKFLOW), "--steps", "2", "--run-dir", str(run),
                                   "rollout.tasks_per_step=4", "rollout.samples=4", "eval.num_tasks=4",
                                   "logging.plots=false", "logging.tensorboard=false"])
    assert res.exit_code == 0, res.output
    episodes = [json.loads(line) for line in (run / "traces" / "step_1.jsonl").read_text().splitlines()]
    assert len(episodes) == 16
    outputs = [o for e in episodes for o in e["outputs"]]
    assert outputs and all(0 <= i < 151_669 for o in outputs for i in o["completion_ids"])
    tok = R.build_tokenizer(small)
    for e, o in zip(episodes, outputs):  # the SFT prompt is the prompt the agent sent, id for id
        question = next(t["question"] for t in _tasks() if t["id"] == e["task_id"])
        [(ids, n_prompt)] = C.encode_pairs(tok, [(question, "")])
        assert o["prompt_ids"] == ids[:n_prompt]


def _tasks():
    import json

    return [json.loads(line) for line in (ROOT / "workflows" / "tasks" / "chat_math_qwen3.jsonl").open()]
