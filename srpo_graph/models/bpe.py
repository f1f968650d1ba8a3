"""Byte-level BPE tokenizers trained here, with the Qwen2.5 / Qwen3 / Llama 3 chat conventions (models stage).

Consumes the shipped corpus (``srpo_graph/data/corpus.jsonl``) and synthetic text generated in
code (:func:`training_text`: the corpus's sentences re-cased, arithmetic, chat turns in each
family's template, tool calls as JSON, ``<think>`` blocks); produces a ``PreTrainedTokenizerFast``
built the way the real families' are: a regex split (Qwen2's single digits, Llama 3's up to three),
byte-level pieces (every string round-trips, no ``<unk>``), BPE merges learned with the
``tokenizers`` trainer, then the family's special and added tokens after the learned ones (as in
the real vocabularies, where they sit at the end), its chat template and its end-of-turn token as
``eos_token`` (chat_templates.py).

The vocabulary is small (``VOCAB_SIZE`` learned tokens + the specials): the corpus cannot feed
150k merges. Models that need the real vocabulary size (architectures.py's ``scale`` size) have
more embedding rows than the tokenizer has tokens, as Qwen's own models do (151,936 rows for
151,665 tokens).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from srpo_graph.models.chat_templates import FAMILIES, ChatFamily

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.jsonl"
VOCAB_SIZE = 4096  # learned tokens (bytes + merges), before the special ones
SEED = 2024

_WORDS = ("the", "a", "of", "and", "to", "in", "is", "what", "which", "how", "many", "answer", "question", "search",
          "result", "think", "step", "first", "then", "so", "because", "country", "capital", "river", "city",
          "number", "sum", "total", "tool", "call", "user", "assistant", "system", "you", "are", "helpful")


def _corpus_texts(corpus: Path = CORPUS) -> list[str]:
    return [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


def training_text(family: ChatFamily, rng: random.Random | None = None, lines: int = 3000) -> list[str]:
    """The texts the BPE merges are learned from (deterministic for ``rng``'s seed): the corpus,
    upper- and title-cased copies, arithmetic, sentences of common words, and chat conversations
    rendered through ``family``'s template with tool calls and think blocks."""
    import jinja2

    rng = rng or random.Random(SEED)
    texts = _corpus_texts()
    out = list(texts) + [t.capitalize() for t in texts] + [t.upper() for t in texts[:50]]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v)
    template = env.from_string(family.template)
    for i in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        kind = i % 4
        if kind == 0:
            out.append(f"{a} + {b} = {a + b}. {a} - {b} = {a - b}; {a} * {b % 10} = {a * (b % 10)}")
        elif kind == 1:
            out.append(words.capitalize() + rng.choice((".", "?", "!", ":")) + "\n")
        else:
            fact = rng.choice(texts)
            messages = [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": f"{words}? {fact}"},
                        {"role": "assistant", "content": f"<think>\n{words}. {a} + {b} = {a + b}\n</think>\n\n{fact}"},
                        {"role": "tool", "content": json.dumps({"name": "search", "arguments": {"query": words}})},
                        {"role": "assistant", "content": f"The answer is {a + b}."}]
            out.append(template.render(messages=messages, bos_token=family.bos or "", add_generation_prompt=kind == 3))
    return out


def build_bpe_tokenizer(family: str, vocab_size: int = VOCAB_SIZE, model_max_length: int = 32768):
    """A byte-level BPE ``PreTrainedTokenizerFast`` of ``family`` (a key of ``chat_templates.FAMILIES``),
    trained here (a few seconds), not yet saved.

    Raises:
        KeyError: an unknown family.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(fam.split_pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = training_text(fam)
    # the specials are added after training (ids at the end) and must not be learned as text
    tok.train_from_iterator([_strip_specials(t, fam) for t in texts], trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.added])
    if fam.bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A",
            pair=f"{fam.bos} $A {fam.bos} $B",
            special_tokens=[(fam.bos, tok.token_to_id(fam.bos))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=fam.eos,
        pad_token=fam.pad,
        bos_token=fam.bos,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    out.chat_template = fam.template
    return out


def _strip_specials(text: str, fam: ChatFamily) -> str:
    for t in fam.special + fam.added:
        text = text.replace(t, " ")
    return text
