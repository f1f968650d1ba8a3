"""Backends stage: each backend's options -- its ``rollout.<backend>`` config section.

One pydantic model per backend of ``backends.BACKENDS``. The trainer's ``RolloutConfig`` gets one
section per row (``rollout.sglang.url``, ``[rollout.sglang]`` in TOML), ``srpo-graph run`` gets
one ``--<backend>-<field>`` flag per scalar field, and docs/training.md's reference lists them:
all generated from the table, so a new backend's options are declared here once.

A field's ``json_schema_extra``: ``{"cli": ["--url"]}`` adds short flag names for ``srpo-graph run``;
``{"train_only": True}`` keeps a field that only training uses (launching servers) off ``run``.

>>> SGLangOptions().url, SGLangOptions(launch="cpu").port is None  # None: launched servers get free ports
('http://127.0.0.1:30000', True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BackendOptions(BaseModel):
    """Base of every backend's options (frozen; unknown fields are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TransformersOptions(BackendOptions):
    """The in-process Hugging Face transformers backend (samples from the trained model itself)."""

    max_batch_size: int = Field(256, ge=1, le=1_000_000, description="Most sequences in one batched generate call "
                                "(longer request lists are split), >= 1.")


class SGLangOptions(BackendOptions):
    """An SGLang server (or sglang-router) per policy, driven over HTTP."""

    url: str = Field("http://127.0.0.1:30000", description="SGLang server or sglang-router URL of every policy "
                     "not in `urls`; ignored when `launch` is set.", json_schema_extra={"cli": ["--url"]})
    urls: dict[str, str] = Field(
        default_factory=dict, description="Per-policy server URLs {policy name: URL}: one server per policy, "
        "each synced after every update of its policy. Policies not listed use `url`.")
    workers: tuple[str, ...] = Field(
        (), description="SGLang worker URLs that receive weight updates when `url` is a router (the router has "
        "no update route). Empty: the server at `url` itself. One-policy workflows only.")
    launch: str | None = Field(
        None, description="Start the servers here, one per policy, and stop them when training ends, fails or is "
        "interrupted: `cpu` (the CPU recipe of shared/sglang-cpu, with the python of $SRPO_GRAPH_SGLANG_PYTHON or "
        "~/.cache/srpo-graph/sglang-venv), `gpu` (`python -m sglang.launch_server` defaults), or a command template "
        "with {model} and {port} (and {host}, {python}). None: connect to servers you started (`url(s)`).",
        json_schema_extra={"train_only": True})
    port: int | None = Field(None, ge=1024, le=65000, description="First port of launched servers; policy i (in "
                             "declaration order) gets port + i, each refused (named) if already in use or claimed by "
                             "another srpo-graph process. None: free ports are picked and claimed machine-wide until "
                             "the server stops. Launched servers listen on 127.0.0.1 and are checked to be the ones "
                             "answering (a per-launch token in /server_info).", json_schema_extra={"train_only": True})
    update_connected: bool = Field(False, description="Let training push weight updates into servers it did not "
                                   "launch (`url`, `urls`, `workers`). Off: such a run is refused before anything is "
                                   "written, since that server's weights would be replaced for everyone using it.",
                                   json_schema_extra={"train_only": True})
    health_timeout: float = Field(
        600.0,
        gt=0.0,
        description="Seconds a launched server may take to answer /health 200.",
        json_schema_extra={"train_only": True},
    )
    timeout: float = Field(
        300.0,
        gt=0.0,
        description="Deadline in seconds for one /generate request in all "
        "(connect, answer and the whole body; a server that drips bytes is cut off).",
        json_schema_extra={"cli": ["--timeout"]},
    )
    retries: int = Field(
        4,
        ge=0,
        le=100,
        description="Retries of one request on connection errors and HTTP 5xx, with exponential backoff from 0.5 s.",
        json_schema_extra={"cli": ["--retries"]},
    )
    sync: Literal["auto", "distributed", "disk"] = Field(
        "auto",
        description="How updated weights reach the servers: `distributed` streams them over a process "
        "group per worker (SGLang's /init_weights_update_group + /update_weights_from_distributed; gloo on CPU, "
        "NCCL on GPU; no shared file system needed), `disk` saves them into `weight_dir` for "
        "/update_weights_from_disk, `auto` streams where the workers can join a group and falls back to disk "
        "(with a warning) where they cannot. LoRA adapter policies sync their adapter files by disk under `auto` and "
        "refuse `distributed` (SGLang 0.5.23 streams base weights only; docs/sglang.md).",
        json_schema_extra={"train_only": True},
    )
    sync_bucket_mb: float = Field(
        256.0,
        gt=0.0,
        description="Most MiB broadcast at once in a `distributed` sync "
        "(one flattened bucket; an FSDP policy is gathered one bucket at a time).",
        json_schema_extra={"train_only": True},
    )
    sync_address: str | None = Field(
        None,
        description="The address servers reach the trainer at for a "
        "`distributed` sync (default: the local end of a route to each server; "
        "127.0.0.1 for local ones).",
        json_schema_extra={"train_only": True},
    )
    sync_timeout: float = Field(
        300.0,
        gt=0.0,
        description="Deadline in seconds for one weight-update group to "
        "form and for each bucket of a `distributed` sync; a server that stalls or dies "
        "ends the step with an error naming it, never a hang.",
        json_schema_extra={"train_only": True},
    )
    weight_dir: Path | None = Field(
        None,
        description="Where updated weights are saved for SGLang's update_weights_from_disk; must be "
        "readable by the server; each policy saves into its own subfolder <policy>. Default: RUN_DIR/weights. "
        "Only folders srpo-graph wrote there (listed in its .srpo-graph-weights.json) are ever replaced or deleted.",
        json_schema_extra={"train_only": True},
    )


class OpenAIOptions(BackendOptions):
    """An OpenAI-compatible chat-completions endpoint (text in and out; never trained).

    In a workflow, an external policy declares these itself (``openai("url", model=.., ...)``);
    this section serves ``srpo-graph run --backend openai`` on a workflow of plain policies, each
    policy's model string then being the endpoint's ``model`` name.
    """

    url: str = Field("http://127.0.0.1:30000/v1", description="API base URL (`/chat/completions` is appended).")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the API key (never the key itself)."
    )
    timeout: float = Field(
        60.0, gt=0, le=3600,
        description="Seconds for a whole request: connecting, sending and every byte of the answer, (0, 3600].",
    )
    retries: int = Field(2, ge=0, le=10, description="Further attempts after a failed request, [0, 10].")
    concurrency: int = Field(8, ge=1, le=1024, description="Requests in flight at once, [1, 1024].")
