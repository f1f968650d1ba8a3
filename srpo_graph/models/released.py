"""Models shaped like the released Qwen2.5-0.5B-Instruct and Qwen3-0.6B, on their exact tokenizers (models stage).

Consumes a name of :data:`SHAPED_MODELS` and the exact tokenizer of its family (vocab.py);
produces a model directory whose ``config.json`` and ``generation_config.json`` are the released
ones (:data:`RELEASED_CONFIGS`, written as released, not re-serialized by transformers) except in
the fields the name says, with random weights from a fixed seed (bf16, as released) and the exact
tokenizer files. It loads as the released class (``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``) in
transformers and in SGLang, and tokenizes exactly as the released checkpoint does.

* ``qwen2.5-0.5b-2layer`` / ``qwen3-0.6b-2layer``: the released config.json with
  ``num_hidden_layers`` 2 instead of 24 / 28 (~180 / ~190M parameters, 136 / 156M of them the
  tied 151,936-row embedding): widths, heads, vocabulary, RoPE, norms, ids all as released.
* ``qwen2.5-realvocab-test`` / ``qwen3-realvocab-test`` / ``llama3-realvocab-test``: the same
  tokenizer at the test width (hidden 64, 4 heads, 2 kv heads, MLP 128, 2 layers; ~10M
  parameters, nearly all embedding), for tests of the id-level rules on the real vocabulary.
  Their embedding has one row per token of the tokenizer (151,665 / 151,669 / 128,256), not
  Qwen's 151,936: an untrained model would sample the padding rows, ids no tokenizer decodes.
  Llama 3's is Llama 3.2-1B-Instruct's config.json at that width and depth.

The ``2layer`` models are for loading, serving and measuring (their random weights do sample
Qwen's padding rows, which the runtime refuses as ids outside the tokenizer); pre-trained
models on the exact vocabulary (recipes.py) learn to give those rows no mass.

Names say what the model is, never a hub name: a workflow that names ``"Qwen/Qwen2.5-0.5B-Instruct"``
gets the released checkpoint from the Hugging Face cache (``models.resolve_model``). Builds are
atomic and cached under ``$SRPO_GRAPH_HOME/NAME``; they need the ``tokenizers`` extra (vocab.py).
It does not know how the models are trained or served.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from srpo_graph.models.architectures import default_dir  # $SRPO_GRAPH_HOME/NAME, like the other local models

VERSION = 3  # 2: the test size has one embedding row per token; 3: the released tokenizer_class (vocab.py)
MARKER = "srpo_graph_released.json"
SEED = 4321

# config.json and generation_config.json of the released checkpoints, field for field (sources:
# huggingface.co/Qwen/Qwen2.5-0.5B-Instruct and huggingface.co/Qwen/Qwen3-0.6B, config.json and
# generation_config.json at their main revisions, as mirrored in public repositories' fixtures;
# meta-llama/Llama-3.2-1B-Instruct's for Llama 3).
RELEASED_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "llama3": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
}
RELEASED_GENERATION: dict[str, dict[str, Any]] = {
    "qwen2.5": {
        "bos_token_id": 151643,
        "pad_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "repetition_penalty": 1.1,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "transformers_version": "4.37.0",
    },
    "qwen3": {
        "bos_token_id": 151643,
        "do_sample": True,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.51.0",
    },
    "llama3": {
        "bos_token_id": 128000,
        "do_sample": True,
        "eos_token_id": [128001, 128008, 128009],
        "temperature": 0.6,
        "top_p": 0.9,
        "transformers_version": "4.45.0.dev0",
    },
}
# the test width (the trained-here ``*-test`` models' shape, architectures.py)
TEST_WIDTH: dict[str, Any] = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
_TEST_HEAD_DIM = {"qwen3": 16, "llama3": 16}  # where the released config names head_dim

# name -> (family, the fields that differ from the released config.json)
# (the test size's embedding has exactly the tokenizer's rows: 151,665 / 151,669 / 128,256; an
# untrained model gives the released checkpoints' 271 / 267 padding rows as much mass as any token,
# and an id the tokenizer cannot decode ends a rollout, so the sampled test models have none)
SHAPED_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b-2layer": ("qwen2.5", {"num_hidden_layers": 2}),
    "qwen3-0.6b-2layer": ("qwen3", {"num_hidden_layers": 2}),
    "qwen2.5-realvocab-test": ("qwen2.5", {**TEST_WIDTH, "num_hidden_layers": 2, "vocab_size": 151_665}),
    "qwen3-realvocab-test": ("qwen3", {**TEST_WIDTH, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 151_669}),
    "llama3-realvocab-test": ("llama3", {**TEST_WIDTH, "head_dim": 16, "num_hidden_layers": 2}),
}


def config_json(name: str) -> dict[str, Any]:
    """The ``config.json`` of model ``name``: the released one with the name's fields changed.

    >>> c = config_json("qwen2.5-0.5b-2layer")
    >>> c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    (2, 896, 151936)
    """
    family, changed = SHAPED_MODELS[name]
    return {**RELEASED_CONFIGS[family], **changed}


def is_shaped_dir(path: str | os.PathLike, name: str | None = None) -> bool:
    """True when ``path`` holds a complete build (of ``name`` if given) at the current version."""
    try:
        info = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("version") == VERSION and (name is None or info.get("name") == name)


def _write(name: str, target: Path) -> None:
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from srpo_graph.models.vocab import MARKER as VOCAB_MARKER
    from srpo_graph.models.vocab import ensure_vocab_tokenizer

    family, _ = SHAPED_MODELS[name]
    tok_dir = ensure_vocab_tokenizer(family)
    cfg = config_json(name)
    (target / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    config = AutoConfig.from_pretrained(str(target))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(target)
    # transformers re-serializes both files in its own layout: put the released text back
    (target / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    gen = RELEASED_GENERATION[family]
    (target / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    for f in tok_dir.iterdir():
        if f.is_file() and f.name != VOCAB_MARKER:
            shutil.copy2(f, target / f.name)
    n = sum(p.numel() for p in model.parameters())
    info = {"version": VERSION, "name": name, "family": family, "seed": SEED, "parameters": n,
            "vocab_size": cfg["vocab_size"], "tokenizer": json.loads((tok_dir / VOCAB_MARKER).read_text())}
    (target / MARKER).write_text(json.dumps(info), encoding="utf-8")


def ensure_shaped_model(name: str, path: str | os.PathLike | None = None) -> Path:
    """Build model ``name`` (a key of :data:`SHAPED_MODELS`) at ``path`` (default :func:`default_dir`)
    unless it is already there; returns the directory.

    Raises:
        KeyError: an unknown name.
        BackendError: the ``tokenizers`` extra is not installed (vocab.py).
    """
    from srpo_graph.models.tiny import build_atomically

    if name not in SHAPED_MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(SHAPED_MODELS)}")
    target = Path(path) if path is not None else default_dir(name)
    if is_shaped_dir(target, name):
        return target
    return build_atomically(target, lambda tmp: _write(name, tmp), lambda p: is_shaped_dir(p, name))


def shaped_info(path: str | os.PathLike) -> dict[str, Any]:
    """What the build recorded: name, family, parameters, vocab_size, the tokenizer's build."""
    return json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
