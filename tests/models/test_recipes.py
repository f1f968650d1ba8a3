"""The locally pre-trained recipe models (``models/recipes.py``): SFT data, build, cache, CLI.

The real ``tiny-reason`` build takes minutes; here a shrunken copy of the recipe (same code, same
data generator, a few SFT steps of a smaller network) is built into a temporary directory.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from srpo_graph.models import recipes as R
from srpo_graph.models import sft_data as D


def _examples(seed: int = 0, num: int = 3000):
    return D.sft_examples(random.Random(seed), num)


def test_sft_data_is_deterministic_and_covers_every_role():
    a, b = _examples(), _examples()
    assert a == b and a != _examples(seed=1)
    roles = {p[:3] for p, _ in a}
    assert roles == {"<q>", "<r>", "<k>"}
    assert {p[p.rindex("<"):] for p, _ in a if p.startswith("<q>")} == {"<s>", "<e>", "<v>", "<g>"}


def test_sft_data_never_holds_a_held_out_problem():
    for prompt, _ in _examples(num=6000):
        question = prompt[3:].split("<", 1)[0]
        assert not D.is_held_out(question), prompt
    qs = D.search_questions()
    assert len(qs) == 350 and 0.1 < sum(D.is_held_out(q.question) for q in qs) / len(qs) < 0.3


def test_solutions_are_multi_token_and_their_format_can_break():
    tok = R.build_tokenizer()
    rng = random.Random(3)
    broken = lengths = 0
    n = 2000
    for _ in range(n):
        p = D.math_problem(rng)
        clean = D.solution(p)
        assert D.final_answer(clean) == p.answer and D.solution_correct(clean, str(p.answer)) == 1.0
        noisy = D.solution(p, rng)
        broken += "#" not in noisy
        lengths = max(lengths, len(tok(noisy, add_special_tokens=False)["input_ids"]))
        assert 7 <= len(tok(clean, add_special_tokens=False)["input_ids"]) <= 60
    assert lengths <= 60
    assert 0.1 < broken / n < 0.2  # P_NO_ANSWER
    assert D.solution_correct("12+5=17", "17") == 0.0 and D.solution_correct(None, "17") == 0.0
    with pytest.raises(ValueError):
        D.final_answer("12+5=17;#")


def test_search_examples_use_the_real_retriever():
    from srpo_graph.std import retrieve

    pairs = [(p, c) for p, c in _examples(num=800) if p.startswith("<k>")]
    answers = [(p, c) for p, c in pairs if c.startswith("answer: ") and "<d><s>" not in p]
    assert answers
    for prompt, _ in answers[:20]:
        docs = prompt.split("<d>", 1)[1].removesuffix("<s>")
        assert docs.count("\n") == 1  # the retriever's 2 passages
    q = next(q for q in D.search_questions() if q.kind == "crop")
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
    assert tok("a\nb", add_special_tokens=False)["input_ids"] == [D.VOCAB.index(c) for c in "a\nb"]


def test_a_later_stage_continues_from_the_first_stages_weights(tmp_path, small_recipe, monkeypatch):
    """A stage trains the previous stage's model: at lr 0 it leaves the weights bit for bit as the
    one-stage build made them; at lr > 0 it moves them; ``info`` records every stage."""
    import torch
    from safetensors.torch import load_file

    one = load_file(str(R.ensure_recipe_model("tiny-reason", tmp_path / "one") / "model.safetensors"))
    weights = {}
    for lr in (0.0, 1e-2):
        staged = replace(small_recipe, stages=(R.Stage(D.search_reading_examples, 16, 3, lr),))
        monkeypatch.setitem(R.RECIPES, "tiny-reason", staged)
        path = R.ensure_recipe_model("tiny-reason", tmp_path / f"lr{lr}")
        weights[lr] = load_file(str(path / "model.safetensors"))
        info = R.recipe_info(path)
        assert info["steps"] == small_recipe.steps + 3 and [s["steps"] for s in info["stages"]] == [6, 3]
    assert all(torch.equal(one[k], weights[0.0][k]) for k in one)
    assert any(not torch.equal(one[k], weights[1e-2][k]) for k in one)


def test_reading_examples_are_answer_turns_over_renamed_worlds_only():
    pairs = D.search_reading_examples(random.Random(0), 300)
    assert len(pairs) == 300 and pairs == D.search_reading_examples(random.Random(0), 300)
    shipped = {d["text"] for d in D.corpus_docs()}
    passages = []
    for prompt, completion in pairs:
        assert completion.startswith("answer: ") and not prompt.endswith("<d><s>")
        passages += [line.split(": ", 1)[1] for line in prompt.split("<d>", 1)[1].removesuffix("<s>").split("\n")]
    # renamed worlds: reading, not remembering (a short passage, a flag's, can match a shipped one by chance)
    assert sum(p in shipped for p in passages) < 0.05 * len(passages)


def test_a_stale_or_other_version_is_rebuilt(tmp_path, small_recipe):
    target = tmp_path / "m"
    target.mkdir()
    (target / R.MARKER).write_text(json.dumps({"recipe": "tiny-reason", "version": -1}))
    assert not R.is_recipe_dir(target, "tiny-reason")
    R.ensure_recipe_model("tiny-reason", target)
    assert R.is_recipe_dir(target, "tiny-reason")


def test_unknown_recipe_is_a_clear_error():
    from srpo_graph.errors import BackendError

    known = "tiny-reason, tiny-search, qwen3-realvocab-math"
    with pytest.raises(BackendError, match=f"unknown model recipe .nope. \\(known: {known}\\)"):
        R.ensure_recipe_model("nope")


def test_init_model_recipe_cli_and_resolve_model(tmp_path, small_recipe, monkeypatch):
    from click.testing import CliRunner

    from srpo_graph.cli import app
    from srpo_graph.models import resolve_model

    res = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), "--recipe", "tiny-reason"])
    assert res.exit_code == 0, res.output
    assert "tiny-reason ready at" in res.output and "parameters" in res.output
    assert R.is_recipe_dir(tmp_path / "m", "tiny-reason")
    bad = CliRunner().invoke(app, ["init-model", str(tmp_path / "x"), "--recipe", "nope"])
    assert bad.exit_code != 0 and "unknown recipe 'nope'" in bad.output
    monkeypatch.setenv("SRPO_GRAPH_HOME", str(tmp_path / "home"))
    assert resolve_model("tiny-reason") == str(tmp_path / "home" / "tiny-reason")
    assert R.is_recipe_dir(tmp_path / "home" / "tiny-reason", "tiny-reason")


# --------------------------------------------------------------------------- tiny-search


def _search_pairs(seed: int = 0, num: int = 1500):
    return D.search_sft_examples(random.Random(seed), num)


def test_word_tokenizer_keeps_every_corpus_text_and_makes_a_word_one_token():
    """``tiny-search`` reads words: every passage, question and action of the corpus round-trips exactly,
    and a name is one token (so copying it is one step, Note [Synthetic worlds])."""
    import re

    tok = R.build_tokenizer(R.RECIPES["tiny-search"])
    texts = [f"{d['title']}: {d['text']}" for d in D.corpus_docs()] + [q.question for q in D.search_questions()]
    texts += [f"search: {q.queries[0]}" for q in D.search_questions()]
    texts += [f"answer: {q.answer}" for q in D.search_questions()]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == text, text
        assert len(ids) == len(re.findall(D.WORD_PATTERN, text))
    assert len(tok("search: flag of teda", add_special_tokens=False)["input_ids"]) == 8
    unknown = tok("peru", add_special_tokens=False)["input_ids"]
    assert unknown == [tok.unk_token_id]  # a word outside the corpus is one <unk>, not its characters
    # tiny-reason's tokenizer is unchanged: characters
    assert len(R.build_tokenizer()("teda", add_special_tokens=False)["input_ids"]) == 4


def test_renamed_worlds_keep_the_words_and_deal_the_facts_again():
    shipped = D.corpus_docs()
    vocab = set(D.word_vocabulary())
    a, b = D.renamed_world(random.Random(1)), D.renamed_world(random.Random(1))
    assert a == b and a != D.renamed_world(random.Random(2)) and len(a) == len(shipped)
    qs = D.questions_from([d["text"] for d in a])
    assert len(qs) == 350 and len({q.question.split()[-1] for q in qs if q.kind == "capital"}) == 70
    words = {w for d in a for w in __import__("re").findall(r"[a-z0-9]+", d["title"] + " " + d["text"])}
    assert words <= vocab
    same = {(q.question, q.answer) for q in qs} & {(q.question, q.answer) for q in D.search_questions()}
    assert len(same) < 0.1 * len(qs)  # the facts are others: remembering the shipped world does not answer


def test_search_sft_data_is_deterministic_never_held_out_and_reads_renamed_worlds():
    a = _search_pairs()
    assert a == _search_pairs() and a != _search_pairs(seed=1) and len(a) == 1500
    assert all(p.startswith("<k>") and p.endswith("<s>") for p, _ in a)
    assert all(c.startswith(("search: ", "answer: ")) for _, c in a)
    for prompt, _ in a:
        assert not D.is_held_out(prompt[3:].split("<d>", 1)[0]), prompt
    shipped = {d["text"] for d in D.corpus_docs()}
    read = [p.split("<d>", 1)[1].removesuffix("<s>") for p, _ in a if "<d><s>" not in p]
    passages = [line.split(": ", 1)[1] for docs in read for line in docs.split("\n")]
    renamed = sum(t not in shipped for t in passages) / len(passages)
    assert 0.3 < renamed < 0.7  # P_WORLD of the episodes are over renamed worlds
    # the imperfect teacher: the gold answer most of the time, not always
    gold = {q.question: q.answer for q in D.search_questions()}
    final = [(p, c) for p, c in a if c.startswith("answer: ") and "<d><s>" not in p and p[3:].split("<d>")[0] in gold]
    right = sum(c == f"answer: {gold[p[3:].split('<d>')[0]]}" for p, c in final) / len(final)
    assert 0.5 < right < 0.95


def test_tiny_search_builds_and_loads_like_any_model(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    small = replace(
        R.RECIPES["tiny-search"],
        hidden=32,
        intermediate=64,
        layers=1,
        heads=2,
        num_examples=200,
        steps=4,
        batch_size=8,
        stages=tuple(replace(s, num_examples=40, steps=2) for s in R.RECIPES["tiny-search"].stages),
    )
    monkeypatch.setitem(R.RECIPES, "tiny-search", small)
    path = R.ensure_recipe_model("tiny-search", tmp_path / "s")
    assert [s["steps"] for s in R.recipe_info(path)["stages"]] == [4, 2, 2]  # the read and the refresh stages
    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(D.word_vocabulary()) == len(tok)
    text = "<k>what is the capital of rira?<d><s>"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=False) == "<bos>" + text
    assert R.recipe_info(path)["recipe"] == "tiny-search"
