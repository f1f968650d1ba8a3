"""Inference backends: one ``Backend`` protocol (``base.py``), ``transformers`` and ``sglang``.

Backends stage. ``resolve_model`` turns a policy's model name into something ``from_pretrained``
loads (``"tiny"`` -> the locally built tiny model); ``load_backend`` builds a backend by kind.
Heavy imports (torch, transformers, httpx) happen inside the functions.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

BackendKind = Literal["transformers", "sglang"]
TINY = "tiny"


def resolve_model(name: str) -> str:
    """The path or hub name to load for a policy's ``model`` string.

    Args:
        name: ``"tiny"`` (built on first use), a recipe of ``backends.recipes.RECIPES`` such as
            ``"tiny-reason"`` (pre-trained locally on first use, a few minutes), a local path or
            a Hugging Face name.
    Returns:
        ``name`` unchanged, except ``"tiny"`` and recipe names -> the built model's directory.

    >>> resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    'Qwen/Qwen2.5-0.5B-Instruct'
    """
    if name == TINY:
        from srpo_graph.backends.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    from srpo_graph.backends.recipes import RECIPES

    if name in RECIPES:  # a small model pre-trained locally (``srpo-graph init-model --recipe NAME``)
        from srpo_graph.backends.recipes import ensure_recipe_model

        return str(ensure_recipe_model(name))
    return name


def _transformers(model: str, **kw: Any):
    from srpo_graph.backends.transformers import TransformersBackend

    return TransformersBackend.from_pretrained(model, **kw)


def _sglang(model: str, **kw: Any):
    from srpo_graph.backends.sglang import SGLangBackend
    from srpo_graph.backends.tiny import load_tokenizer

    url = kw.pop("url", None)
    if not url:
        from srpo_graph.errors import BackendError

        raise BackendError("the sglang backend needs --url (the server's address, e.g. http://127.0.0.1:30000)")
    path = resolve_model(model)
    if "vocab_size" not in kw:  # logit rows, for `allow:` (the tokenizer may have fewer entries)
        from transformers import AutoConfig

        try:
            kw["vocab_size"] = AutoConfig.from_pretrained(path).vocab_size
        except (OSError, ValueError):
            kw["vocab_size"] = None  # constrained requests will then say what is missing
    return SGLangBackend(url, load_tokenizer(path), **kw)


_LOADERS: dict[str, Callable[..., Any]] = {"transformers": _transformers, "sglang": _sglang}


def load_backend(kind: BackendKind, model: str, **kw: Any):
    """Build a backend of ``kind`` for ``model``.

    Args:
        kind: ``"transformers"`` or ``"sglang"``.
        model: a model name/path (``"tiny"`` allowed); for sglang it names the tokenizer to load
            (the server serves its own copy of the model).
        kw: passed on (``device``/``dtype`` for transformers; ``url``/``timeout``/... for sglang).
    Raises:
        BackendError: unknown kind, or the backend cannot start.

    >>> load_backend("vllm", "tiny")
    Traceback (most recent call last):
    ...
    srpo_graph.errors.BackendError: unknown backend 'vllm' (known: transformers, sglang)
    """
    if kind not in _LOADERS:
        from srpo_graph.errors import BackendError

        raise BackendError(f"unknown backend {kind!r} (known: {', '.join(_LOADERS)})")
    return _LOADERS[kind](model, **kw)
