"""The Qwen2.5 / Qwen3 / Llama 3-shaped models built here (models/architectures.py, bpe.py,
chat_templates.py): byte-level BPE round-trips any text, the special tokens are single ids at the
end of the vocabulary, each family's chat template renders the system / user / assistant / tool
roles (and Qwen3's ``<think>`` rules), the model directory loads with ``from_pretrained`` as the
family's architecture and trains (a real forward/backward through the chunked log-prob path),
the names resolve through ``resolve_model`` and ``init-model``, and the three sizes have the
shapes they claim."""

from __future__ import annotations

import pytest
import torch

from srpo_graph.models.architectures import LOCAL_MODELS, REAL_VOCAB, build_config, ensure_local_model, local_info
from srpo_graph.models.chat_templates import FAMILIES
from srpo_graph.models.tiny import load_tokenizer

TEXTS = ["Hello, World!", "the capital of rira is beto.", "  two  spaces\tand a tab\nnew line\r\n",
         "12345 + 678 = 13023", "ünïcödé 🙂 中文 emoji", 'def f(x):\n    return {"a": [1, 2]}', "",
         "<think> is text here, not a token </think>"]
ARCH = {"qwen2.5": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama3": "LlamaForCausalLM"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def built(request, tmp_path_factory):
    fam = request.param
    path = ensure_local_model(f"{fam}-test", tmp_path_factory.mktemp(fam) / "m")
    return fam, path, load_tokenizer(path)


def test_bpe_round_trips_every_text(built):
    fam, _, tok = built
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, (fam, text)
        if text.isascii() and len(text) > 12:  # merges were learned: fewer tokens than bytes
            assert len(ids) < len(text.encode()), (fam, text)
    assert tok.unk_token is None  # byte-level: nothing is unknown


def test_special_tokens_are_single_ids_after_the_learned_ones(built):
    fam, _, tok = built
    spec = FAMILIES[fam]
    learned = len(tok) - len(spec.special) - len(spec.added)
    for t in spec.special + spec.added:
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] >= learned, (fam, t, ids)
    assert tok.eos_token == spec.eos and tok.pad_token == spec.pad
    bos = tok.encode("x")[0]
    assert (bos == tok.convert_tokens_to_ids(spec.bos)) if spec.bos else (tok.decode([bos]) == "x")


def test_chat_template_renders_the_roles(built):
    fam, _, tok = built
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "tool", "content": "RESULT 17"},
            {"role": "user", "content": "And 3+3?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    if fam == "llama3":
        assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
        assert "<|start_header_id|>ipython<|end_header_id|>\n\nRESULT 17<|eot_id|>" in text  # Llama 3.1's tool role
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    else:
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
        assert "<|im_start|>assistant\n4<|im_end|>\n" in text
        assert "<|im_start|>user\n<tool_response>\nRESULT 17\n</tool_response><|im_end|>\n" in text
        assert text.endswith("<|im_start|>assistant\n")
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.decode(ids) == text  # the template's text is what the ids say
    assert tok.convert_tokens_to_ids(FAMILIES[fam].eos) in ids  # every finished turn ends with the end-of-turn token


def test_qwen3_think_blocks(tmp_path):
    tok = load_tokenizer(ensure_local_model("qwen3-test", tmp_path / "q3"))
    earlier = {"role": "assistant", "content": "<think>\nfirst thought\n</think>\n\n4"}
    msgs = [{"role": "user", "content": "2+2?"}, earlier, {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "<think>\nsecond thought\n</think>\n\n6"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    # stripped before the last query
    assert "first thought" not in text and "<|im_start|>assistant\n4<|im_end|>" in text
    assert "<|im_start|>assistant\n<think>\nsecond thought\n</think>\n\n6<|im_end|>" in text  # kept after it
    off = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert [tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>")] == tok.encode("<think></think>")


def test_from_pretrained_loads_and_a_forward_backward_runs(built):
    from transformers import AutoConfig, AutoModelForCausalLM

    from srpo_graph.compiler.compile import compile
    from srpo_graph.compiler.synthetic import synthetic_episodes
    from srpo_graph.srpo.lm_head import output_head
    from srpo_graph.srpo.logprobs import packed_logprobs

    fam, path, tok = built
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert type(model).__name__ == ARCH[fam] and AutoConfig.from_pretrained(str(path)).tie_word_embeddings
    assert model.config.vocab_size >= len(tok) and model.lm_head.weight is model.get_input_embeddings().weight
    assert output_head(model) is model.lm_head  # the chunked log-prob path takes it
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    b = compile(synthetic_episodes(2, 2, seed=1, vocab=len(tok), policies=("m",)))
    lp, _ = packed_logprobs([model], b, head_chunk=2)
    lp.sum().backward()
    assert lp[b.loss_mask].lt(0).all() and model.lm_head.weight.grad.abs().sum() > 0
    assert local_info(path)["parameters"] == sum(p.numel() for p in model.parameters())


def test_sizes_have_the_shapes_they_claim():
    from transformers import AutoModelForCausalLM

    for name, (fam, size) in LOCAL_MODELS.items():
        cfg = build_config(fam, size, 4096)
        with torch.device("meta"):
            n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
        if size == "test":
            assert n < 1_000_000, name
        elif size == "mid":
            assert 20e6 <= n <= 50e6 and cfg.hidden_size in (896, 1024) and cfg.num_hidden_layers == 2, (name, n)
        else:
            assert cfg.vocab_size == REAL_VOCAB[fam] and cfg.hidden_size in (896, 1024), name
    assert REAL_VOCAB["qwen2.5"] == 151_936 and REAL_VOCAB["llama3"] == 128_256


def test_names_resolve_and_the_cli_builds_them(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from srpo_graph.cli import app as cli
    from srpo_graph.models import resolve_model

    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path))
    res = CliRunner().invoke(cli, ["init-model", "--model", "llama3-test"])
    assert res.exit_code == 0 and "llama3-test ready" in res.output, res.output
    assert resolve_model("llama3-test") == str(tmp_path / "llama3-test")
    assert resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    bad = CliRunner().invoke(cli, ["init-model", "--model", "qwen9-huge"])
    assert bad.exit_code != 0 and "unknown model 'qwen9-huge'" in bad.output


def test_autotokenizer_agrees_with_the_explicit_load(built):
    """What a server loads (``AutoTokenizer``, which may pick the family's own class) encodes and
    decodes as ``load_tokenizer`` does."""
    from transformers import AutoTokenizer

    fam, path, tok = built
    auto = AutoTokenizer.from_pretrained(str(path))
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>", "<|start_header_id|>x<|eot_id|>"]:
        ids = tok.encode(text)
        assert auto.encode(text) == ids and auto.decode(ids) == tok.decode(ids), (fam, text)
    assert auto.chat_template == tok.chat_template


def test_the_checker_knows_every_local_models_chat_template_by_name():
    """lang/chat.py (which may not import models) names which locally built models have a chat
    template, so `check` can refuse a chat agent on `tiny-search` before it is built: its table
    must cover every name of ``local_names()`` and agree with the tokenizers those builders make
    (recipes' and tiny's built in code here, one family tokenizer each for the FAMILY-SIZE models)."""
    from srpo_graph.lang.chat import builtin_chat_template
    from srpo_graph.models import local_names
    from srpo_graph.models.architectures import LOCAL_MODELS
    from srpo_graph.models.bpe import build_bpe_tokenizer
    from srpo_graph.models.recipes import RECIPES
    from srpo_graph.models.recipes import build_tokenizer as recipe_tokenizer
    from srpo_graph.models.tiny import build_tokenizer as tiny_tokenizer

    truth = {"tiny": bool(getattr(tiny_tokenizer(), "chat_template", None))}
    truth |= {name: bool(getattr(recipe_tokenizer(r), "chat_template", None)) for name, r in RECIPES.items()}
    families = {fam: bool(build_bpe_tokenizer(fam).chat_template) for fam, _ in set(LOCAL_MODELS.values())}
    truth |= {name: families[fam] for name, (fam, _) in LOCAL_MODELS.items()}
    # the exact tokenizers (vocab.py) carry their family's template, set in build_vocab_tokenizer
    from srpo_graph.models.released import SHAPED_MODELS

    truth |= {name: bool(FAMILIES[fam].template) for name, (fam, _) in SHAPED_MODELS.items()}
    assert set(truth) == set(local_names())
    assert {name: builtin_chat_template(name) for name in local_names()} == truth
    assert builtin_chat_template("qwen3-huge") is None and builtin_chat_template("org/qwen3-test") is None
