"""Inference backends: one ``Backend`` protocol (``base.py``) and one table, :data:`BACKENDS`.

Backends stage. :data:`BACKENDS` maps each backend's name to its :class:`BackendSpec`: its
options (the ``rollout.<name>`` config section), how to build it for ``srpo-graph run`` and for
training, and what the trainer must know about it. Everything else is generated from the table:
the ``rollout.backend`` choices and sections of the training config, the ``--backend`` choices
and ``--<name>-<field>`` flags of ``srpo-graph run``, and the reference in docs/training.md.
Adding a backend is one module plus one row (docs/architecture.md, "Extension points"). A
policy's model name becomes a loadable path in ``srpo_graph.models.resolve_model``.

The modules (none imports this package's ``__init__`` back: the table sits on top of them):

* ``base.py``: the ``Backend`` protocol, ``GenerationRequest`` and ``Completion``;
* ``options.py``: each backend's ``rollout.<name>`` options;
* ``sampling.py``: temperature, constraints, top-k/top-p and seeds of in-process samplers;
* ``transformers.py``: the embedded default, in this process;
* ``sglang.py``: the HTTP client of an SGLang server; ``sglang_server.py``: starting and stopping
  server processes; ``sglang_lora.py``: LoRA adapters served per request;
  ``sglang_fleet.py``: which servers serve which policies (launched or connected);
  ``weight_sync.py`` and ``weight_dir.py``: weights to the servers, over a process group or disk;
* ``openai.py``: the chat-completions client of external ``openai(...)`` policies;
* ``tiny.py`` and ``recipes.py``: aliases of their modules in ``srpo_graph/models/``.

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
    from srpo_graph.backends.sglang_fleet import connect

    return connect(model, options, **kw)


def _sglang_training(policies: Sequence[TrainedPolicy], options: SGLangOptions, run_dir: Path):
    from srpo_graph.backends.sglang_fleet import serve_policies

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
