"""The tiny default model (``policy p = "tiny"``): built locally in code, never downloaded.

Models stage. Consumes nothing; produces a model directory that loads like any Hugging Face
causal LM: a char-level ``tokenizers`` WordLevel tokenizer wrapped in
``PreTrainedTokenizerFast`` and a ``LlamaConfig`` (hidden 64, 2 layers, 4 heads, tied
embeddings) whose weights come from a fixed seed, both written with ``save_pretrained``.

Vocabulary: ``<pad> <bos> <eos> <unk>``, the role tokens ``<a> <b> <c> <d> <e> <r> <s> <v> <q>
<sep>`` (one token each), the digits, ``a``-``z``, space and a little punctuation. Upper case is
lower-cased by the normalizer; any other character becomes ``<unk>``. Encoding adds ``<bos>``.

The build is atomic: everything is written into a temporary directory next to the target and
renamed into place, so two processes racing to build it never see a half-written model.
(We use ``LlamaConfig``, not ``Qwen2Config``: with a Qwen config ``AutoTokenizer`` silently swaps in
Qwen's byte-level tokenizer; see shared/reference/transformers-cpu.md.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ROLE_TOKENS = ("<a>", "<b>", "<c>", "<d>", "<e>", "<r>", "<s>", "<v>", "<q>", "<sep>")
CHARS = tuple("0123456789") + tuple("abcdefghijklmnopqrstuvwxyz") + tuple(" .,:;?!+-*/=()[]{}_'\"\\^")
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + ROLE_TOKENS + CHARS
TINY_VERSION = 1  # bump when the vocabulary or the config changes: old caches are rebuilt
MARKER = "srpo_graph_tiny.json"
SEED = 1234


def default_dir() -> Path:
    """Where the tiny model lives: ``$SRPO_GRAPH_HOME/tiny``, else ``~/.cache/srpo-graph/tiny``.

    >>> default_dir().name
    'tiny'
    """
    home = os.environ.get("SRPO_GRAPH_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "srpo-graph"
    return base / "tiny"


def is_tiny_dir(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a complete tiny model of the current version.

    >>> is_tiny_dir("/nonexistent")
    False
    """
    marker = Path(path) / MARKER
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("version") == TINY_VERSION
    except (OSError, ValueError):
        return False


def build_tokenizer(vocabulary=None, special_tokens=None, role_tokens=None, model_max_length: int = 2048,
                    pattern: str = r"[\s\S]"):
    r"""The char-level tokenizer as a ``PreTrainedTokenizerFast`` (not yet saved).

    The defaults are the tiny model's ``VOCAB``, ``SPECIAL_TOKENS`` and ``ROLE_TOKENS``; the
    recipe models (``recipes.py``) pass their own (the same construction, a larger vocabulary).
    ``pattern`` splits the text into its pieces (default: every character); each piece is one
    token of ``vocabulary`` or ``<unk>``, and decoding joins the pieces back, so the text is kept
    exactly when every piece is known (a word-level vocabulary splits on ``[a-z0-9]+|[\s\S]``).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocabulary = VOCAB if vocabulary is None else vocabulary
    special_tokens = SPECIAL_TOKENS if special_tokens is None else special_tokens
    role_tokens = ROLE_TOKENS if role_tokens is None else role_tokens
    vocab = {tok: i for i, tok in enumerate(vocabulary)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    # by default every character is its own word ([\s\S] also matches newlines, which become <unk>)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in role_tokens])
    bos = vocab["<bos>"]
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=model_max_length,
    )


def build_config():
    """The ``LlamaConfig`` of the tiny model (~130k parameters)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=VOCAB.index("<pad>"),
        bos_token_id=VOCAB.index("<bos>"),
        eos_token_id=VOCAB.index("<eos>"),
    )


def _write_model(target: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(build_config())
    model.generation_config.max_new_tokens = 64
    model.generation_config.do_sample = True
    model.generation_config.top_k = 0
    model.generation_config.top_p = 1.0
    model.save_pretrained(target)
    build_tokenizer().save_pretrained(target)
    (target / MARKER).write_text(json.dumps({"version": TINY_VERSION, "seed": SEED}), encoding="utf-8")


def ensure_tiny_model(path: str | os.PathLike | None = None) -> Path:
    """Build the tiny model at ``path`` (default :func:`default_dir`) unless it is already there.

    Args:
        path: the model directory.
    Returns:
        The directory, loadable with ``from_pretrained``.
    Raises:
        OSError: when the directory cannot be written.
    """
    target = Path(path) if path is not None else default_dir()
    if is_tiny_dir(target):
        return target
    return build_atomically(target, _write_model, is_tiny_dir)


def build_atomically(target: Path, write: Callable[[Path], None], is_good: Callable[[Path], bool]) -> Path:
    """Build a model folder with ``write(tmp)`` in a temporary sibling, then rename it to ``target``.

    An outdated or broken ``target`` (``is_good`` false) is moved aside first (rename is atomic);
    losing the race against another process's good build is fine; the temporary folder never stays.
    Used by the tiny model and the recipe models (``recipes.py``).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        write(tmp)
        if target.exists() and not is_good(target):
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
            os.replace(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_good(target):  # lost a race against a good build: fine; else re-raise
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(path: str | os.PathLike):
    """Load a tokenizer: the tiny one, the Qwen/Llama-shaped models built here (architectures.py,
    released.py) and the exact tokenizers (vocab.py) explicitly as ``PreTrainedTokenizerFast`` (a
    Qwen config would make ``AutoTokenizer`` swap in Qwen's own tokenizer class), else ``AutoTokenizer``."""
    built_here = ("srpo_graph_local.json", "srpo_graph_vocab.json", "srpo_graph_released.json")
    if is_tiny_dir(path) or any((Path(path) / marker).is_file() for marker in built_here):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), padding_side="left")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
