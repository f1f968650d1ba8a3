"""The tiny default model: vocabulary, tokenizer behaviour, deterministic atomic build."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from srpo_graph.models import resolve_model
from srpo_graph.models.tiny import VOCAB, ensure_tiny_model, is_tiny_dir, load_tokenizer


def test_vocabulary_and_one_token_per_char(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    assert len(tok) == len(VOCAB)
    ids = tok("<a>7<sep>Hi, x^2!")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "<a>", "7", "<sep>", "h", "i", ",", " ", "x", "^", "2", "!"]
    for role in ("<a>", "<b>", "<c>", "<d>", "<e>", "<r>", "<s>", "<v>", "<q>", "<sep>"):
        assert len(tok(role, add_special_tokens=False)["input_ids"]) == 1
    assert tok.convert_ids_to_tokens(tok("é\n", add_special_tokens=False)["input_ids"]) == ["<unk>", "<unk>"]
    assert tok.decode(tok("<b>ab 12")["input_ids"], skip_special_tokens=True) == "<b>ab 12"


def test_autotokenizer_agrees(tiny_dir):
    from transformers import AutoTokenizer

    auto, ours = AutoTokenizer.from_pretrained(str(tiny_dir)), load_tokenizer(tiny_dir)
    for s in ["<a>3<sep>hello world", "what is 12+7? (x)", "<q>\"quoted\" \\ ok"]:
        assert auto(s)["input_ids"] == ours(s)["input_ids"]


def test_model_loads_like_any_causal_lm(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    cfg = model.config
    assert isinstance(cfg, LlamaConfig)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.tie_word_embeddings) == (
        64,
        2,
        4,
        True,
    )
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert torch.isfinite(model(torch.tensor([[1, 4, 14]])).logits).all()


def test_build_is_deterministic_and_cached(tmp_path, tiny_dir):
    from safetensors.torch import load_file

    other = ensure_tiny_model(tmp_path / "again")
    a, b = load_file(str(tiny_dir / "model.safetensors")), load_file(str(other / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    stamp = (other / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(other) == other and (other / "model.safetensors").stat().st_mtime_ns == stamp


def test_stale_directory_is_rebuilt(tmp_path):
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "junk.txt").write_text("half-written")
    assert not is_tiny_dir(target)
    ensure_tiny_model(target)
    assert is_tiny_dir(target) and not (target / "junk.txt").exists()


def _build(path: str) -> str:
    return str(ensure_tiny_model(path))


@pytest.mark.slow
def test_two_processes_racing_both_get_a_complete_model(tmp_path):
    target = str(tmp_path / "race" / "tiny")
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.map(_build, [target, target])
    assert results == [target, target] and is_tiny_dir(target)
    assert not [p for p in Path(target).parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_resolve_model(monkeypatch, tiny_dir):
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tiny_dir.parent))
    assert resolve_model("tiny") == str(tiny_dir)
    assert resolve_model("/some/local/path") == "/some/local/path"
