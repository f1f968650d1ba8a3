"""Small pretrained models built locally (``policy p = "tiny-reason"``, ``"tiny-search"``): ``RECIPES``, one table.

Models stage. Consumes nothing but code and the shipped corpus (``srpo_graph/data``); produces a
model directory that loads like any Hugging Face causal LM (``LlamaConfig`` + a character- or
word-level ``PreTrainedTokenizerFast``, both written with ``save_pretrained``). Unlike the untrained ``tiny``
model, a recipe model is *pre-trained* here, by supervised learning on synthetic data generated
in code, so that RL starts where the paper's does: from a model that half-knows the task.

Three recipes (``RECIPES``):

* ``tiny-reason`` (648k parameters, 3 layers, characters; ~7 min to build on one thread) writes
  multi-token outputs (10-60 tokens) in a format that can be broken, for the math roles of ``sft_data.py``;
* ``tiny-search`` (~0.9M parameters, 4 layers, words: one token per corpus word, space or
  punctuation mark; ``sft_data.py``, Note [Synthetic worlds]) is the searcher of ``workflows/tinysearch.wf``;
* ``qwen3-realvocab-math`` (20M parameters, 19.4M of them the 151,669-row embedding; 3 layers at
  hidden 128; ~7 min on one thread) is a ``Qwen3ForCausalLM`` on Qwen3's exact tokenizer and chat
  template, pre-trained on the math problems as chat turns (``chat_recipe.py``) for
  ``workflows/chat_math_qwen3.wf``.

The roles, their prompts and the synthetic pre-training data (math problems, search questions
over the shipped corpus and renamed worlds, the imperfect teacher, held-out problems) are
``sft_data.py``'s.

The build is deterministic for a seed (one thread, fixed data order) and atomic, like
:func:`srpo_graph.models.tiny.ensure_tiny_model`; the result is cached under
``$SRPO_GRAPH_HOME/<recipe>`` (else ``~/.cache/srpo-graph/<recipe>``).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from srpo_graph.models.chat_recipe import WIDTH, chat_math_examples
from srpo_graph.models.sft import sft_steps
from srpo_graph.models.sft_data import (
    ROLE_TOKENS,
    SPECIAL_TOKENS,
    VOCAB,
    WORD_PATTERN,
    char_vocabulary,
    search_reading_examples,
    search_sft_examples,
    sft_examples,
    solution_correct,  # the reward the tiny math workflows name (`tr.solution_correct`)
    word_vocabulary,
)
from srpo_graph.models.tiny import build_atomically

MARKER = "srpo_graph_recipe.json"
__all__ = ["RECIPES", "Recipe", "Stage", "build_tokenizer", "default_dir", "ensure_recipe_model", "is_recipe_dir",
           "recipe_info", "solution_correct"]

# --------------------------------------------------------------------------- model + training


@dataclass(frozen=True)
class Stage:
    """A later SFT stage: it continues from the previous stage's weights with its own pairs and a fresh
    AdamW (warm-up, then cosine decay over its ``steps``)."""

    examples: Callable[[random.Random, int], list[tuple[str, str]]]
    num_examples: int
    steps: int
    lr: float


@dataclass(frozen=True)
class Recipe:
    """One buildable model: its architecture, its SFT data and budget (and any later ``stages``)."""

    name: str
    description: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    examples: Callable[[random.Random, int], list[tuple[str, str]]]
    num_examples: int
    steps: int
    batch_size: int
    lr: float
    seed: int
    version: int  # bump when anything above changes: old caches are rebuilt
    vocabulary: Callable[[], tuple[str, ...]] = char_vocabulary
    pattern: str = r"[\s\S]"  # how the tokenizer splits text into vocabulary pieces (default: characters)
    stages: tuple[Stage, ...] = ()  # run after the first, in order
    # a chat family of vocab.py (``"qwen3"``): the recipe is on that exact tokenizer and its chat template, a
    # Qwen-shaped model built by chat_recipe.py (``examples`` then give (question, completion) pairs)
    family: str | None = None


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "tiny-reason",
            "digit chains, verifier/aggregator/router roles and multi-turn search (~0.65M params)",
            hidden=128,
            layers=3,
            heads=4,
            intermediate=384,
            examples=sft_examples,
            num_examples=40_000,
            steps=1200,
            batch_size=32,
            lr=4e-3,
            seed=1234,
            version=3,
        ),
        Recipe(
            "tiny-search",
            "a word-level searcher: queries and answers over the local corpus (Notes [Synthetic worlds], [Reading])",
            hidden=128,
            layers=4,
            heads=4,
            intermediate=384,
            examples=search_sft_examples,
            num_examples=96_000,
            steps=3000,
            batch_size=32,
            lr=1e-3,
            seed=1234,
            version=2,
            vocabulary=word_vocabulary,
            pattern=WORD_PATTERN,
            # Note [Reading] (sft_data.py): then read (answer turns over renamed worlds), then the whole mix again
            stages=(Stage(search_reading_examples, 16_000, 2000, 1e-3), Stage(search_sft_examples, 16_000, 500, 5e-4)),
        ),
        Recipe(
            "qwen3-realvocab-math",
            "a Qwen3-shaped chat model on Qwen3's exact tokenizer: math problems as chat turns (chat_recipe.py)",
            hidden=WIDTH["hidden_size"],
            layers=WIDTH["num_hidden_layers"],
            heads=WIDTH["num_attention_heads"],
            intermediate=WIDTH["intermediate_size"],
            examples=chat_math_examples,
            num_examples=40_000,
            steps=1200,
            batch_size=32,
            lr=4e-3,
            seed=1234,
            version=2,  # 2: the unused rows share a trained row, not zero (Note [Training the rows the data uses])
            family="qwen3",
        ),
    )
}


def build_tokenizer(r: Recipe | None = None):
    """A recipe's tokenizer (default ``tiny-reason``'s: characters, ``VOCAB``), as a ``PreTrainedTokenizerFast``:
    the tiny model's construction (``tiny.build_tokenizer``) with the recipe's vocabulary and split pattern."""
    from srpo_graph.models.tiny import build_tokenizer as piece_tokenizer

    r = r or RECIPES["tiny-reason"]
    if r.family is not None:  # the exact released tokenizer (vocab.py), with its chat template
        from srpo_graph.models.vocab import load_vocab_tokenizer

        return load_vocab_tokenizer(r.family)
    return piece_tokenizer(r.vocabulary(), SPECIAL_TOKENS, ROLE_TOKENS, model_max_length=1024, pattern=r.pattern)


def build_config(r: Recipe):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(r.vocabulary()),
        hidden_size=r.hidden,
        intermediate_size=r.intermediate,
        num_hidden_layers=r.layers,
        num_attention_heads=r.heads,
        num_key_value_heads=r.heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=VOCAB.index("<pad>"),
        bos_token_id=VOCAB.index("<bos>"),
        eos_token_id=VOCAB.index("<eos>"),
    )


def default_dir(name: str) -> Path:
    """``$SRPO_GRAPH_HOME/<name>``, else ``~/.cache/srpo-graph/<name>``.

    >>> default_dir("tiny-reason").name
    'tiny-reason'
    """
    home = os.environ.get("SRPO_GRAPH_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "srpo-graph") / name


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        from srpo_graph.errors import BackendError

        raise BackendError(f"unknown model recipe {name!r} (known: {', '.join(RECIPES)})")
    return RECIPES[name]


def is_recipe_dir(path: str | os.PathLike, name: str) -> bool:
    """True when ``path`` holds a complete build of recipe ``name`` at its current version."""
    try:
        meta = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("recipe") == name and meta.get("version") == get_recipe(name).version


def _sft(
    model,
    tok,
    pairs: list[tuple[str, str]],
    steps: int,
    lr: float,
    batch_size: int,
    rng: random.Random,
    log: Callable[[str], None] | None,
    label: str,
) -> list[float]:
    """``steps`` AdamW steps of next-token loss on the completions of ``pairs`` (+ eos); the losses."""
    eos = tok.eos_token_id
    seqs = []
    for prompt, completion in pairs:
        p_ids = tok(prompt)["input_ids"]
        c_ids = tok(completion, add_special_tokens=False)["input_ids"] + [eos]
        seqs.append((p_ids + c_ids, len(p_ids)))
    return sft_steps(model, seqs, tok.pad_token_id, steps, lr, batch_size, rng, log, label)


def pretrain(r: Recipe, log: Callable[[str], None] | None = None):
    """Build and SFT-train recipe ``r``'s model (its first stage, then ``r.stages``) on one thread;
    returns (model, tokenizer, info)."""
    import torch
    from transformers import LlamaForCausalLM

    tok = build_tokenizer(r)
    rng = random.Random(r.seed)
    stages = (Stage(r.examples, r.num_examples, r.steps, r.lr), *r.stages)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic, and polite on a shared machine
    t0 = time.perf_counter()
    examples, final = 0, []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(r.seed)
            model = LlamaForCausalLM(build_config(r))
            model.config.use_cache = False
            for i, st in enumerate(stages):
                pairs = st.examples(rng, st.num_examples)
                examples += len(pairs)
                label = f"stage {i + 1}/{len(stages)} " if len(stages) > 1 else ""
                final.append(_sft(model, tok, pairs, st.steps, st.lr, r.batch_size, rng, log, label))
            model.eval()
    finally:
        torch.set_num_threads(threads)
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "recipe": r.name,
        "version": r.version,
        "seed": r.seed,
        "parameters": n_params,
        "steps": sum(st.steps for st in stages),
        "examples": examples,
        "final_loss": sum(final[-1][-50:]) / len(final[-1][-50:]),  # the last stage's
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    if len(stages) > 1:
        info["stages"] = [
            {"steps": st.steps, "lr": st.lr, "examples": st.num_examples, "final_loss": sum(ls[-50:]) / len(ls[-50:])}
            for st, ls in zip(stages, final)
        ]
    return model, tok, info


def ensure_recipe_model(
    name: str, path: str | os.PathLike | None = None, log: Callable[[str], None] | None = None
) -> Path:
    """Build recipe ``name`` at ``path`` (default :func:`default_dir`) unless it is already there.

    Returns:
        The directory, loadable with ``from_pretrained``; ``srpo_graph_recipe.json`` in it records
        the recipe, its version, the parameter count, the final SFT loss and the build time.
    Raises:
        BackendError: an unknown recipe.
        OSError: the directory cannot be written.
    """
    r = get_recipe(name)
    target = Path(path) if path is not None else default_dir(name)
    if is_recipe_dir(target, name):
        return target

    def write(tmp: Path) -> None:
        if r.family is not None:  # the exact vocabulary: chat_recipe.py writes the model and the tokenizer's files
            from srpo_graph.models.chat_recipe import write_chat_recipe

            info = write_chat_recipe(r, tmp, log)
        else:
            model, tok, info = pretrain(r, log)
            model.generation_config.do_sample = True
            model.generation_config.top_k = 0
            model.generation_config.top_p = 1.0
            model.generation_config.max_new_tokens = 64
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(info), encoding="utf-8")

    return build_atomically(target, write, lambda d: is_recipe_dir(d, name))


def recipe_info(path: str | os.PathLike) -> dict:
    """What the build recorded (``srpo_graph_recipe.json``)."""
    return json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
