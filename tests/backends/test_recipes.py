"""The locally pre-trained recipe models (``backends/recipes.py``): SFT data, build, cache, CLI.

The real ``tiny-reason`` build takes minutes; here a shrunken copy of the recipe (same code, same
data generator, a few SFT steps of a smaller network) is built into a temporary directory.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from srpo_graph.backends import recipes as R


def _examples(seed: int = 0, num: int = 3000):
    return R.sft_examples(random.Random(seed), num)


def test_sft_data_is_deterministic_and_covers_every_role():
    a, b = _examples(), _examples()
    assert a == b and a != _examples(seed=1)
    roles = {p[:3] for p, _ in a}
    assert roles == {"<q>", "<r>", "<k>"}
    assert {p[p.rindex("<"):] for p, _ in a if p.startswith("<q>")} == {"<s>", "<e>", "<v>", "<g>"}


def test_sft_data_never_holds_a_held_out_problem():
    for prompt, _ in _examples(num=6000):
        question = prompt[3:].split("<", 1)[0]
        assert not R.is_held_out(question), prompt
    qs = R.search_questions()
    assert len(qs) == 350 and 0.1 < sum(R.is_held_out(q.question) for q in qs) / len(qs) < 0.3


def test_solutions_are_multi_token_and_their_format_can_break():
    tok = R.build_tokenizer()
    rng = random.Random(3)
    broken = lengths = 0
    n = 2000
    for _ in range(n):
        p = R.math_problem(rng)
        clean = R.solution(p)
        assert R.final_answer(clean) == p.answer and R.solution_correct(clean, str(p.answer)) == 1.0
        noisy = R.solution(p, rng)
        broken += "#" not in noisy
        lengths = max(lengths, len(tok(noisy, add_special_tokens=False)["input_ids"]))
        assert 7 <= len(tok(clean, add_special_tokens=False)["input_ids"]) <= 60
    assert lengths <= 60
    assert 0.1 < broken / n < 0.2  # P_NO_ANSWER
    assert R.solution_correct("12+5=17", "17") == 0.0 and R.solution_correct(None, "17") == 0.0
    with pytest.raises(ValueError):
        R.final_answer("12+5=17;#")


def test_search_examples_use_the_real_retriever():
    from srpo_graph.std import retrieve

    pairs = [(p, c) for p, c in _examples(num=800) if p.startswith("<k>")]
    answers = [(p, c) for p, c in pairs if c.startswith("answer: ") and "<d><s>" not in p]
    assert answers
    for prompt, _ in answers[:20]:
        docs = prompt.split("<d>", 1)[1].removesuffix("<s>")
        assert docs.count("\n") == 1  # the retriever's 2 passages
    q = next(q for q in R.search_questions() if q.kind == "crop")
    assert q.answer in retrieve(q.queries[-1], k=2) and len(q.queries) == 2


@pytest.fixture
def small_recipe(monkeypatch):
    small = replace(R.RECIPES["tiny-reason"], hidden=32, intermediate=64, layers=1, heads=2, num_examples=200,
                    steps=6, batch_size=8, version=10_001)
    monkeypatch.setitem(R.RECIPES, "tiny-reason", small)
    return small


def test_build_is_deterministic_cached_and_loads_like_any_causal_lm(tmp_path, small_recipe):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = R.ensure_recipe_model("tiny-reason", tmp_path / "a")
    b = R.ensure_recipe_model("tiny-reason", tmp_path / "b")
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    info = R.recipe_info(a)
    assert info["recipe"] == "tiny-reason" and info["steps"] == 6 and info["parameters"] > 0
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert R.ensure_recipe_model("tiny-reason", a) == a and (a / "model.safetensors").stat().st_mtime_ns == stamp

    model = AutoModelForCausalLM.from_pretrained(str(a))
    tok = AutoTokenizer.from_pretrained(str(a))
    ids = tok("<q>12+5<s>")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "<q>", "1", "2", "+", "5", "<s>"]
    assert torch.isfinite(model(torch.tensor([ids])).logits).all()
    assert tok("a\nb", add_special_tokens=False)["input_ids"] == [R.VOCAB.index(c) for c in "a\nb"]


def test_a_stale_or_other_version_is_rebuilt(tmp_path, small_recipe):
    target = tmp_path / "m"
    target.mkdir()
    (target / R.MARKER).write_text(json.dumps({"recipe": "tiny-reason", "version": -1}))
    assert not R.is_recipe_dir(target, "tiny-reason")
    R.ensure_recipe_model("tiny-reason", target)
    assert R.is_recipe_dir(target, "tiny-reason")


def test_unknown_recipe_is_a_clear_error():
    from srpo_graph.errors import BackendError

    with pytest.raises(BackendError, match="unknown model recipe 'nope' \\(known: tiny-reason\\)"):
        R.ensure_recipe_model("nope")


def test_init_model_recipe_cli_and_resolve_model(tmp_path, small_recipe, monkeypatch):
    from click.testing import CliRunner

    from srpo_graph.backends import resolve_model
    from srpo_graph.cli import app

    res = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), "--recipe", "tiny-reason"])
    assert res.exit_code == 0, res.output
    assert "tiny-reason ready at" in res.output and "parameters" in res.output
    assert R.is_recipe_dir(tmp_path / "m", "tiny-reason")
    bad = CliRunner().invoke(app, ["init-model", str(tmp_path / "x"), "--recipe", "nope"])
    assert bad.exit_code != 0 and "unknown recipe 'nope'" in bad.output
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    assert resolve_model("tiny-reason") == str(tmp_path / "home" / "tiny-reason")
    assert R.is_recipe_dir(tmp_path / "home" / "tiny-reason", "tiny-reason")
