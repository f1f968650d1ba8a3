"""Qwen2-, Qwen3- and Llama-shaped causal LMs at three sizes, built here (models stage).

Consumes a name ``FAMILY-SIZE`` (:data:`LOCAL_MODELS`); produces a model directory that loads
like any Hugging Face chat model: the family's architecture (``Qwen2ForCausalLM`` for
``qwen2.5``, ``Qwen3ForCausalLM`` with its q/k norms for ``qwen3``, ``LlamaForCausalLM`` for
``llama3``) with weights from a fixed seed, and its byte-level BPE tokenizer with the family's
chat template (bpe.py), both written with ``save_pretrained``; the tokenizer is reloaded with
:func:`~srpo_graph.models.tiny.load_tokenizer` (``PreTrainedTokenizerFast`` explicitly: a Qwen
config would make ``AutoTokenizer`` pick Qwen's own class).

Sizes (``SIZES``; all with tied embeddings, as Qwen2.5-0.5B, Qwen3-0.6B and Llama 3.2-1B have):

* ``test``: hidden 64, 2 layers (~0.3M parameters), built in seconds, for tests;
* ``mid``: the real hidden width, heads and MLP of the family's smallest model (Qwen2.5-0.5B:
  896 wide, 14 heads, 2 kv heads, MLP 4,864; Qwen3-0.6B: 1,024 wide, 16 heads of 128, 8 kv heads,
  MLP 3,072; Llama 3 at Qwen2.5-0.5B's shape) with 2 layers: 33-45M parameters;
* ``scale``: ``mid`` at the real vocabulary size (151,936 rows for Qwen, 128,256 for Llama 3):
  136-167M parameters, for memory and time measurements (benchmarks/bench_real_models.py).

The embedding has exactly the tokenizer's length of rows at ``test`` and ``mid`` (these models
are sampled from: an untrained model gives padding rows as much mass as any token, and an id the
tokenizer cannot decode would end the rollout), and the real size at ``scale`` (measured, never
sampled), whose rows beyond the tokenizer are never produced by it, as in Qwen's own models. Builds are deterministic
for the seed and atomic (``tiny.build_atomically``), cached under
``$SRPO_GRAPH_HOME/NAME`` (else ``~/.cache/srpo-graph/NAME``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from srpo_graph.models.chat_templates import FAMILIES
from srpo_graph.models.tiny import build_atomically

VERSION = 2  # 2: no padding rows at test/mid (they were sampled by the untrained models)
MARKER = "srpo_graph_local.json"
SEED = 4321

# the shapes of each family's smallest real model (hidden, heads, kv heads, head dim, MLP)
_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5": dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864),
    "qwen3": dict(
        hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072
    ),
    "llama3": dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864),
}
REAL_VOCAB = {"qwen2.5": 151_936, "qwen3": 151_936, "llama3": 128_256}
SIZES = ("test", "mid", "scale")
LOCAL_MODELS: dict[str, tuple[str, str]] = {f"{fam}-{size}": (fam, size) for fam in FAMILIES for size in SIZES}


def default_dir(name: str) -> Path:
    """``$SRPO_GRAPH_HOME/NAME``, else ``~/.cache/srpo-graph/NAME``.

    >>> default_dir("qwen3-test").name
    'qwen3-test'
    """
    home = os.environ.get("SRPO_GRAPH_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "srpo-graph") / name


def is_local_dir(path: str | os.PathLike, name: str | None = None) -> bool:
    """True when ``path`` holds a complete local model of the current version (of ``name`` if given)."""
    try:
        info = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("version") == VERSION and (name is None or info.get("name") == name)


def build_config(family: str, size: str, vocab_size: int, tokenizer: Any = None):
    """The transformers config of ``family`` at ``size`` with ``vocab_size`` embedding rows.

    Raises:
        KeyError: an unknown family or size.
    """
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if size not in SIZES:
        raise KeyError(size)
    shape = dict(_SHAPES[family])
    if size == "test":
        shape = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
        if family == "qwen3":
            shape["head_dim"] = 16
    if size == "scale":
        vocab_size = REAL_VOCAB[family]
    ids: dict[str, Any] = {}
    if tokenizer is not None:
        ids = dict(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    common = dict(
        vocab_size=vocab_size,
        num_hidden_layers=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        **shape,
        **ids,
    )
    if family == "qwen2.5":
        return Qwen2Config(
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False, **common
        )
    if family == "qwen3":
        return Qwen3Config(
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, use_sliding_window=False, **common
        )
    return LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 500_000.0}, **common)


def _write(name: str, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from srpo_graph.models.bpe import build_bpe_tokenizer

    family, size = LOCAL_MODELS[name]
    tok = build_bpe_tokenizer(family)
    vocab = len(tok)
    config = build_config(family, size, vocab, tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config)
    stop = [tok.convert_tokens_to_ids(t) for t in FAMILIES[family].stop]
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = stop, tok.pad_token_id, tok.bos_token_id
    gen.do_sample, gen.top_k, gen.top_p, gen.max_new_tokens = True, 0, 1.0, 64
    model.save_pretrained(target)
    tok.save_pretrained(target)
    n = sum(p.numel() for p in model.parameters())
    (target / MARKER).write_text(
        json.dumps(
            {
                "version": VERSION,
                "name": name,
                "family": family,
                "size": size,
                "seed": SEED,
                "parameters": n,
                "vocab_size": config.vocab_size,
                "tokenizer_size": len(tok),
            }
        ),
        encoding="utf-8",
    )


def ensure_local_model(name: str, path: str | os.PathLike | None = None) -> Path:
    """Build the local model ``name`` (a key of :data:`LOCAL_MODELS`) at ``path`` (default
    :func:`default_dir`) unless it is already there; returns the directory.

    Raises:
        KeyError: an unknown name.
        OSError: the directory cannot be written.
    """
    if name not in LOCAL_MODELS:
        raise KeyError(f"unknown local model {name!r}; known: {', '.join(LOCAL_MODELS)}")
    target = Path(path) if path is not None else default_dir(name)
    if is_local_dir(target, name):
        return target
    return build_atomically(target, lambda tmp: _write(name, tmp), lambda p: is_local_dir(p, name))


def local_info(path: str | os.PathLike) -> dict[str, Any]:
    """What the build recorded: name, family, size, parameters, vocab_size, tokenizer_size."""
    return json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
