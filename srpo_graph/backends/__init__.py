"""Inference backends: one ``Backend`` protocol (``base.py``) and one table, :data:`BACKENDS`.

Backends stage. ``resolve_model`` turns a policy's model name into something ``from_pretrained``
loads (``"tiny"`` -> the locally built tiny model); :data:`BACKENDS` maps each backend's name to
its :class:`BackendSpec`: its options (the ``rollout.<name>`` config section), how to build it
for ``srpo-graph run`` and for training, and what the trainer must know about it. Everything
else is generated from the table: the ``rollout.backend`` choices and sections of the training
config, the ``--backend`` choices and ``--<name>-<field>`` flags of ``srpo-graph run``, and the
reference in docs/training.md. Adding a backend is one module plus one row (docs/architecture.md,
"Extension points").

Heavy imports (torch, transformers, httpx) happen inside the builders.

>>> sorted(BACKENDS)
['openai', 'sglang', 'transformers']
>>> BACKENDS["sglang"].remote, BACKENDS["transformers"].in_process
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from srpo_graph.backends.options import BackendOptions, OpenAIOptions, SGLangOptions, TransformersOptions
from srpo_graph.errors import BackendError

TINY = "tiny"


def resolve_model(name: str) -> str:
    """The path or hub name to load for a policy's ``model`` string.

    Args:
        name: ``"tiny"`` (built on first use), a recipe of ``models.recipes.RECIPES`` such as
            ``"tiny-reason"`` (pre-trained locally on first use, a few minutes), a model of
            ``models.architectures.LOCAL_MODELS`` such as ``"qwen3-test"`` (built on first use), a
            local path or a Hugging Face name.
    Returns:
        ``name`` unchanged, except the locally built models' names -> their directory.

    >>> resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    'Qwen/Qwen2.5-0.5B-Instruct'
    """
    from srpo_graph.models import local_model_path

    path = local_model_path(name)  # tiny, a recipe, or a Qwen/Llama-shaped model built here
    if path is not None:
        return str(path)
    return name


@dataclass(frozen=True)
class TrainedPolicy:
    """What a backend needs of one policy the trainer updates, to sample for it.

    Attributes:
        name: the policy's name in the workflow.
        model_path: its resolved base model (what a server loads at start).
        model: the live model the trainer updates (an in-process backend samples from it), or
            None where this process holds no whole copy.
        tokenizer: its tokenizer.
        device: where ``model`` lives.
    """

    name: str
    model_path: str
    model: Any
    tokenizer: Any
    device: str = "cpu"


@dataclass(frozen=True)
class BackendSpec:
    """One row of :data:`BACKENDS`.

    Attributes:
        summary: one line for ``--help`` and the docs.
        options: the pydantic model of its ``rollout.<name>`` section (``backends/options.py``).
        load: ``load(model, options, *, device, **kw) -> Backend`` for ``srpo-graph run`` and
            :func:`load_backend`; ``kw`` goes to the backend's constructor.
        for_training: ``for_training(policies, options, run_dir) -> {policy name: Backend}``, one
            backend per :class:`TrainedPolicy` (the trainer calls it on the process that samples).
        in_process: samples from the trainer's own model object (no weight transfer).
        remote: a server that can die: its errors fail the affected episodes (counted against
            ``rollout.max_failed_fraction``) instead of stopping the step.
        loss_defaults: loss options this backend sets unless the user set them (e.g. SGLang's
            ``mismatch = "tis"``, docs/sglang.md).
    """

    summary: str
    options: type[BackendOptions]
    load: Callable[..., Any]
    for_training: Callable[[Sequence[TrainedPolicy], Any, Path], dict[str, Any]]
    in_process: bool = False
    remote: bool = False
    loss_defaults: Mapping[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- transformers


def _transformers(model: str, options: TransformersOptions, *, device: str = "cpu", **kw: Any):
    from srpo_graph.backends.transformers import TransformersBackend

    return TransformersBackend.from_pretrained(model, device=device, **{"max_batch_size": options.max_batch_size, **kw})


def _transformers_training(policies: Sequence[TrainedPolicy], options: TransformersOptions, run_dir: Path):
    from srpo_graph.backends.transformers import TransformersBackend

    return {p.name: TransformersBackend(p.model, p.tokenizer, device=p.device, max_batch_size=options.max_batch_size)
            for p in policies}


# --------------------------------------------------------------------------- sglang


def _sglang(model: str, options: SGLangOptions, *, device: str = "cpu", **kw: Any):
    from srpo_graph.backends.sglang import SGLangBackend
    from srpo_graph.models.tiny import load_tokenizer

    path = resolve_model(model)
    if "vocab_size" not in kw or "context_length" not in kw:
        from transformers import AutoConfig

        from srpo_graph.backends.base import context_length_of

        try:
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError):
            config = None  # constrained requests will then say what is missing; lengths go unchecked
        kw.setdefault("vocab_size", getattr(config, "vocab_size", None))  # logit rows, for `allow:`
        kw.setdefault("context_length", context_length_of(config))
    kw = {"timeout": options.timeout, "max_retries": options.retries, "worker_urls": list(options.workers) or None,
          "sync": options.sync, "sync_options": {"bucket_bytes": int(options.sync_bucket_mb * (1 << 20)),
                                                 "master_address": options.sync_address,
                                                 "timeout": options.sync_timeout},
          **({"weight_dir": options.weight_dir} if options.weight_dir is not None else {}), **kw}
    return SGLangBackend(kw.pop("url", options.url), load_tokenizer(path), **kw)


def _sglang_training(policies: Sequence[TrainedPolicy], options: SGLangOptions, run_dir: Path):
    from srpo_graph.backends.sglang_server import serve_policies

    return serve_policies(policies, options, run_dir)


# --------------------------------------------------------------------------- openai


def _openai(model: str, options: OpenAIOptions, *, device: str = "cpu", **kw: Any):
    from srpo_graph.backends.openai import OpenAIBackend
    from srpo_graph.workflow import ExternalModel

    return OpenAIBackend(ExternalModel(url=options.url, model=model, api_key_env=options.api_key_env,
                                       timeout=options.timeout, retries=options.retries,
                                       concurrency=options.concurrency), **kw)


def _openai_training(policies: Sequence[TrainedPolicy], options: OpenAIOptions, run_dir: Path):
    from srpo_graph.errors import ConfigError

    raise ConfigError.at("field `rollout.backend`", "an OpenAI-compatible endpoint cannot sample a trained policy",
                         why="its weights are behind an API: no log-probs of record, no weight sync",
                         fix='declare the external model in the workflow, `policy p = openai("URL", model="m")`, '
                             "and train the other policies on transformers or sglang")


BACKENDS: dict[str, BackendSpec] = {
    "transformers": BackendSpec(
        "Hugging Face transformers in this process; samples from the trained model itself (the default).",
        TransformersOptions, _transformers, _transformers_training, in_process=True),
    "sglang": BackendSpec(
        "An SGLang server per policy over HTTP (started by training with `rollout.sglang.launch`, or yours).",
        SGLangOptions, _sglang, _sglang_training, remote=True, loss_defaults={"mismatch": "tis"}),
    "openai": BackendSpec(
        "An OpenAI-compatible chat-completions endpoint: text only, frozen (external `openai(...)` policies).",
        OpenAIOptions, _openai, _openai_training, remote=True),
}


def backend_spec(kind: str) -> BackendSpec:
    """The row of :data:`BACKENDS` named ``kind``.

    Raises:
        BackendError: unknown kind, naming the known ones.

    >>> backend_spec("vllm")
    Traceback (most recent call last):
    ...
    srpo_graph.errors.BackendError: unknown backend 'vllm' (known: transformers, sglang, openai)
    """
    if kind not in BACKENDS:
        raise BackendError(f"unknown backend {kind!r} (known: {', '.join(BACKENDS)})")
    return BACKENDS[kind]


def load_backend(kind: str, model: str, options: BackendOptions | None = None, **kw: Any):
    """Build a backend of ``kind`` for ``model``.

    Args:
        kind: a key of :data:`BACKENDS` (``"transformers"``, ``"sglang"``).
        model: a model name/path (``"tiny"`` allowed); for sglang it names the tokenizer to load
            (the server serves its own copy of the model).
        options: the backend's options (default: its defaults).
        kw: passed on to the backend's constructor, over ``options`` (``device`` for
            transformers; ``url``/``timeout``/``backoff``/... for sglang).
    Raises:
        BackendError: unknown kind, or the backend cannot start.
    """
    spec = backend_spec(kind)
    return spec.load(model, options if options is not None else spec.options(), **kw)
