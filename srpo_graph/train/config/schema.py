"""Trainer stage: the schema of the training configuration (``TrainConfig`` and its sections).

Every field says its unit and valid range; ``loading.py`` loads it from TOML and overrides, turns
validation errors into :class:`~srpo_graph.errors.ConfigError` naming the field, and writes it
to a run folder. The objective's :class:`LossConfig` and the compiler's :class:`CompileConfig`
are embedded as the ``loss`` and ``compile`` sections; ``objective`` (a row of ``OBJECTIVES``)
fills them in (:func:`resolve_objective`), then ``defaults.py`` the loss options a backend or
overlapped rollouts set unless the run does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from srpo_graph.backends import BACKENDS
from srpo_graph.compiler.options import CompileConfig
from srpo_graph.runtime.usercode import Deadlines
from srpo_graph.srpo.objectives import OBJECTIVES
from srpo_graph.srpo.options import LossConfig
from srpo_graph.train.config.defaults import resolve_loss_defaults
from srpo_graph.train.parallel.strategies import STRATEGIES


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _RolloutFields(_Section):
    """What is sampled each step and by which engine (its options: ``rollout.<backend>``)."""

    tasks: Path | None = Field(
        None,
        description="Training task file: JSONL, or (extra `datasets`) a .parquet file or a `save_to_disk` folder "
        "(`FOLDER@split` for a DatasetDict). Default: the file in the workflow's `tasks/` folder whose "
        "name matches the workflow (e.g. coord_par3.wf -> tasks/coord.jsonl) and whose fields fit it.",
    )
    eval_tasks: Path | None = Field(
        None,
        description="Held-out task file for evaluation. Default: `<tasks stem>_eval.jsonl` next to the training "
        "file if it exists, else the last `eval.num_tasks` tasks of the training file are held out (not trained on).",
    )
    samples: int = Field(8, ge=1, le=1024, description="G: episodes per task (the group size), 1..1024.")
    tasks_per_step: int = Field(
        16, ge=1, le=100_000, description="Tasks per step (a step samples tasks_per_step x samples episodes)."
    )
    backend: str = Field(  # a key of backends.BACKENDS (checked below); its options: the section of that name
        "transformers",
        description="Inference engine, a key of `backends.BACKENDS`: `transformers` (in-process, "
        "shares the trained model) or `sglang` (a server per policy). Its options are the section of the same "
        "name (`rollout.sglang.url`, `[rollout.sglang]`).",
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Failure budget per step, [0, 1]: the share of a step's episodes that may fail "
        "-- for any reason: a backend error (a server that died, hung or restarted mid-rollout), a tool, extractor or "
        "reward that raised or returned a non-number, a prompt that did not render, user code past its deadline -- "
        "before the run stops with the first failure of each kind and its `.wf` line (checkpoints intact: fix it, "
        "then `--resume`). Below it, the failed episodes are dropped (counted as `rollout/failed/<kind>`) and the step "
        "trains on the rest.",
    )
    deadlines: Deadlines = Field(
        default_factory=Deadlines,
        description="Seconds each call of user code may take (`tool`, `reward`, "
        "`extractor`); past it the episode fails (kind `timeout`) naming the call's `.wf` line.",
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Per-policy model overrides {policy name: HF name, local path or `tiny`}; e.g. run a math "
        'workflow on the tiny model with `rollout.models={solver="tiny"}`, or `*` for every policy.',
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="If set, caps every agent's `max_tokens` (tokens per generation). None: as declared.",
    )
    logprobs: Literal["full", "sampled"] = Field(
        "full",
        description="Log-prob of record for agents sampled with top-k/top-p: `full` (the full temperature-"
        "scaled distribution, as SGLang returns it) or `sampled` (the truncated distribution actually sampled, "
        "renormalized; the trainer re-applies the same filters). Without top-k/top-p both are the same.",
    )
    scheduler: Literal["auto", "lockstep", "streaming"] = Field(
        "auto",
        description="How episodes share the engine: `lockstep` (every live episode's pending agents are one "
        "batch per round: one forward per batch, right in-process), `streaming` (each episode advances as soon as "
        "its own outputs return, up to the backend's concurrency in flight: right for servers, which batch "
        "continuously) or `auto` (streaming when every policy's backend is a server, e.g. sglang or an external "
        "endpoint; else lockstep). The same seeds give the same traces under both wherever the backend is "
        "deterministic; failures and user-code deadlines are handled alike.",
    )
    every_rank: Literal["auto"] | bool = Field(
        "auto",
        description="Under torchrun (nproc > 1), which ranks sample: `true` every rank samples its share of the "
        "step's tasks (whole groups) on its own copy of the policies and the episodes are gathered on every rank, so N "
        "ranks sample about N times as fast with the same episodes and metrics as one; `false` rank 0 samples alone "
        "and broadcasts them; `auto` (default) every rank with an in-process backend (transformers) under strategy = "
        '"ddp", rank 0 alone with a server backend (one server batches every request) or under fsdp (the other '
        "ranks hold only shards).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=64,
        description="Overlapped rollouts with bounded staleness (`train/rollout/overlapped.py`): 0 = the "
        "synchronous loop (step s samples after update s-1 synced); k >= 1 = a producer thread samples the batches of "
        "the next steps while the trainer updates, and no output used by update s was sampled more than k weight "
        "versions before the weights it starts from (k = 1: one-step-off). Needs a server backend (sglang) or, "
        "with the transformers backend, rollout.worker = true; not under torchrun yet. Stale samples are corrected "
        "against the sampling policy: loss.mismatch defaults to decoupled (none is refused).",
    )
    partial_rollouts: bool = Field(
        False,
        description="With max_staleness >= 1 on sglang: a weight sync pauses the requests in flight and "
        "resumes them on the new weights (a member's tokens may come from two versions; the version of record is "
        "the oldest, the behaviour log-probs the sampler's) instead of waiting for them to finish.",
    )
    worker: bool = Field(
        False,
        description="Transformers backend only: sample in a rollout worker process holding its own copy of "
        "each policy (weights pushed after every update over a gloo group: full policies all weights, LoRA policies "
        "their adapters only) instead of in the trainer's process on the trained model objects, so sampling can run "
        "while an update mutates them. The same episodes and metrics for the same seed; costs a second copy of "
        'each model and a weight push per step (docs/training.md, "Rollout worker").',
    )
    worker_timeout: float = Field(
        1800.0,
        gt=0.0,
        le=86_400.0,
        description="Seconds the trainer waits for the rollout worker (`rollout.worker`) "
        "to start, to answer one rollout batch, or to take one policy's weights; past it, or when the worker dies, "
        "the step stops with an error naming the worker (never a hang).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the trained models live; `auto` = cuda if available."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Model weight dtype (float32 on CPU). float16 is refused for training: there is no loss scaler.",
    )

    @field_validator("every_rank", mode="before")
    @classmethod
    def _auto_true_false(cls, v: Any) -> Any:
        if isinstance(v, str) and v.lower() in ("auto", "true", "false"):
            return {"auto": "auto", "true": True, "false": False}[v.lower()]
        if v == "auto" or isinstance(v, bool):
            return v
        raise ValueError(f"must be auto, true or false, not {v!r}")


def _with_backend_sections(base: type[_Section]) -> Any:
    """``base`` plus one section per row of ``backends.BACKENDS`` (``rollout.sglang``, ...), so a
    new backend's options appear in the config, its TOML and the docs' reference by themselves."""
    sections: dict[str, Any] = {
        name: (spec.options, Field(default_factory=spec.options, description=spec.summary))
        for name, spec in BACKENDS.items()
    }
    model = create_model("RolloutConfig", __base__=base, __module__=__name__, **sections)
    model.__doc__ = base.__doc__
    return model


class _KnownBackend(_RolloutFields):
    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown backend {v!r}; known: {', '.join(BACKENDS)}")
        return v

    @model_validator(mode="after")
    def _worker_needs_in_process(self) -> Any:
        if self.worker and not BACKENDS[self.backend].in_process:
            raise ValueError(
                f"rollout.worker runs the transformers backend in a process of its own; backend "
                f"{self.backend!r} already samples outside the trainer (set rollout.worker = false)"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _legacy_flat_names(cls, data: Any) -> Any:
        """Configs written before the backend sections (``sglang_url = ...``, ``weight_dir``, e.g. an
        older run's config.toml being resumed) still load: ``<backend>_<field>`` -> ``<backend>.<field>``."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        if "weight_dir" in out:
            out["sglang_weight_dir"] = out.pop("weight_dir")
        for name, spec in BACKENDS.items():
            moved = {
                k[len(name) + 1 :]: out.pop(k)
                for k in list(out)
                if k.startswith(name + "_") and k[len(name) + 1 :] in spec.options.model_fields
            }
            if moved:
                section = out.get(name, {})
                out[name] = {**moved, **section} if isinstance(section, dict) else section
        return out


if TYPE_CHECKING:  # the sections are generated; type checkers see the common fields (sections: getattr)
    RolloutConfig = _KnownBackend
else:
    RolloutConfig = _with_backend_sections(_KnownBackend)


class OptimConfig(_Section):
    """The update: Adam(W) per policy, epochs and mini-batches over each step's SetBatch."""

    lr: float = Field(
        1e-3,
        gt=0.0,
        le=1.0,
        description="Peak learning rate, (0, 1]. 1e-3 suits the tiny model; ~1e-6 for billion-parameter LLMs.",
    )
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas, each in [0, 1).")
    eps: float = Field(1e-8, gt=0.0, le=1e-2, description="Adam epsilon, (0, 1e-2].")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="Decoupled (AdamW) weight decay, [0, 1].")
    grad_clip: float = Field(1.0, ge=0.0, description="Max global grad norm per policy; 0 = no clipping.")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="LR schedule after warm-up, decaying to 0 at `steps`."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps (optimizer steps), >= 0.")
    epochs: int = Field(
        2, ge=1, le=100, description="Passes over each step's SetBatch (PPO-style inner epochs), 1..100."
    )
    mini_batches: int = Field(
        1,
        ge=1,
        le=4096,
        description="Optimizer steps per epoch; sets are split into this many mini-batches of whole events.",
    )
    rollback_nonfinite: bool = Field(
        True,
        description="Undo an optimizer step that makes a weight non-finite (counted as skipped). Keeps a copy "
        "of the stepped policies' weights and Adam state during each step: turn off for policies too large for "
        "that copy (a non-finite step then stops the run; resume from the last checkpoint).",
    )
    layout: Literal["auto", "packed", "padded", "prefix"] = Field(
        "auto",
        description="How the log-prob forward batches each micro-batch's members (results are the same, "
        "only speed differs): `packed` = one row per policy with positions restarting per member (fast with a "
        "varlen attention kernel: flash-attention, FlexAttention), `padded` = length-bucketed right-padded rows "
        "(fast with sdpa/eager, e.g. on CPU, where a packed row costs a dense [n, n] mask), `prefix` = padded, but "
        "what members' inputs share runs once through the KV cache, nested (a task's prompt for its G samples, "
        "then each chat turn for the turns that extend it), "
        "`auto` = packed for flash/flex attention, else prefix for a model that takes a KV cache, else padded. "
        "See docs/performance.md (P5).",
    )
    autocast: Literal["off", "bfloat16"] = Field(
        "off",
        description="Run the update's forwards (and the old log-probs') under `torch.autocast` in this dtype: "
        "matmuls in bf16, weights, gradients and Adam states in `rollout.dtype`, the log-softmax in float32 "
        "(train/policies/precision.py). Saves activation memory and time on hardware with bf16 units; see "
        "docs/performance.md (P8).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward instead of keeping them "
        "(transformers' `GradientCheckpointingLayer`, non-reentrant): activation memory of one layer instead of all, "
        "for about one more forward. Turns the `prefix` layout off (it needs the KV cache): `auto` picks `padded`.",
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"each beta must be in [0, 1), got {list(v)}")
        return v


class EvalConfig(_Section):
    """Periodic evaluation on held-out tasks."""

    every: int = Field(10, ge=0, description="Evaluate every N steps (and after the last); 0 = never.")
    mode: Literal["greedy", "sampled"] = Field(
        "greedy", description="greedy = temperature 0; sampled = as declared in the .wf."
    )
    num_tasks: int = Field(
        32,
        ge=1,
        le=100_000,
        description="Held-out tasks evaluated (also the number held out when no eval file is given).",
    )
    samples: int = Field(1, ge=1, le=1024, description="Episodes per eval task (1 for greedy).")


class CheckpointConfig(_Section):
    """Checkpoints in RUN_DIR/checkpoints/step_N (atomic; see checkpoint.py)."""

    every: int = Field(50, ge=0, description="Save every N steps (and after the last); 0 = only at the end.")
    keep_last: int = Field(2, ge=1, le=1000, description="Keep the newest K complete checkpoints, 1..1000.")


class LoggingConfig(_Section):
    """Metrics, plots, traces and the progress bar."""

    tensorboard: bool = Field(True, description="Write TensorBoard event files to RUN_DIR/tensorboard.")
    plots: bool = Field(True, description="Draw PNG plots to RUN_DIR/plots (matplotlib, Agg).")
    plots_every: int = Field(
        25, ge=0, description="Redraw RUN_DIR/plots/*.png every N steps (and at the end); 0 = only at the end."
    )
    traces_every: int = Field(
        25,
        ge=0,
        description="Write the step's episodes to RUN_DIR/traces/step_N.jsonl every N steps (and step 1); 0 = never.",
    )
    progress: bool = Field(
        True,
        description="Show progress (rank 0 only): a rich bar in a terminal (fewer columns when "
        "narrow), plain lines every ~steps/20 steps when stdout is not a terminal.",
    )
    wandb: bool = Field(
        False,
        description="Also log every metric to Weights & Biases (the optional extra `wandb`; "
        "`WANDB_MODE=offline` writes RUN_DIR/wandb for a later `wandb sync`). Off by default.",
    )
    wandb_project: str = Field(
        "srpo-graph", min_length=1, description="The W&B project of the run (with logging.wandb)."
    )
    wandb_entity: str | None = Field(None, description="The W&B entity (team or user); None = your default.")
    wandb_name: str | None = Field(None, description="The W&B run name; None = the run folder's name.")


class DebugConfig(_Section):
    """Hooks for tests; leave empty in real runs."""

    nonfinite_at_steps: tuple[int, ...] = Field(
        (), description="Steps (1-based) whose first update gets a NaN loss injected, to exercise the non-finite guard."
    )
    stop_after_step: int | None = Field(
        None,
        ge=1,
        description="Stop after this step as if the process were killed (tests of --resume); None = run to `steps`.",
    )


class ObjectiveConfig(_Section):
    """The named objective: one row of ``srpo_graph.srpo.objectives.OBJECTIVES``."""

    name: str = Field(
        "srpo",
        description=(
            f"The objective, a row of docs/algorithm.md's table ({', '.join(OBJECTIVES)}). It sets the `loss` and "
            "`compile` options it needs; `loss.*` and `compile.*` given explicitly win. `objective=grpo` on the "
            "command line, or `[objective] name = ...` in the TOML."
        ),
    )

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in OBJECTIVES:
            import difflib

            near = difflib.get_close_matches(v, list(OBJECTIVES), n=1)
            raise ValueError(f"unknown objective {v!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        return v


class TrainConfig(_Section):
    """Everything a training run needs besides the workflow file.

    Sections: ``rollout``, ``optim``, ``objective`` (a named row of ``OBJECTIVES`` that fills in
    ``loss`` and ``compile``), ``loss`` (the objective's LossConfig), ``compile`` (the
    compiler's CompileConfig), ``eval``, ``checkpoint``, ``logging``, ``debug``.
    """

    steps: int = Field(
        100, ge=1, le=10_000_000, description="Training steps (rollout -> compile -> update -> sync), >= 1."
    )
    seed: int = Field(
        0, ge=0, le=2**31 - 1, description="Seed for task order, sampling and mini-batch shuffling, 0..2^31-1."
    )
    run_dir: Path | None = Field(
        None, description="Run folder. Default: a new runs/<workflow name>-<date-time> folder."
    )
    overwrite: bool = Field(
        False,
        description="Replace the outputs of an earlier run found in run_dir (otherwise "
        "a fresh run refuses a used folder: resume it, or pick another folder).",
    )
    nproc: int = Field(1, ge=1, le=1024, description="Data-parallel processes (torchrun) per node; 1 = this process.")
    dist_timeout: float = Field(
        600.0,
        gt=0.0,
        description="Seconds a collective (gradient all-reduce, episode "
        "gather or broadcast, ...) may wait for a rank under torchrun: a rank that died or stalls "
        "ends the job with an error, never a hang.",
    )
    strategy: str = Field(  # a key of train/parallel/strategies.py's STRATEGIES (checked below)
        "ddp",
        description="Data-parallel strategy with nproc > 1. `ddp`: every rank holds whole models, "
        "gradients are all-reduced (fastest while a policy, its gradients and Adam state fit one device). "
        "`fsdp`: FSDP2 `fully_shard` per decoder layer, each rank holds 1/N of weights, gradients and Adam "
        "state (for models too large for one device; more communication: parameters are all-gathered in "
        "every forward; with the transformers backend rank 0 keeps an unsharded copy to sample from, with "
        "SGLang the weights are streamed bucket by bucket; checkpoints are sharded, see `srpo-graph "
        "consolidate`). Same results either way (docs/training.md).",
    )
    rollout: RolloutConfig = RolloutConfig()  # its backend sections are generated from BACKENDS
    optim: OptimConfig = OptimConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    loss: LossConfig = LossConfig()
    compile: CompileConfig = CompileConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    debug: DebugConfig = DebugConfig()

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str) -> str:
        if v not in STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}; known: {', '.join(STRATEGIES)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _objective_fills_loss_and_compile(cls, data: Any) -> Any:
        """``objective`` sets the loss and compile options of its row; explicit ones win (``resolve_objective``);
        then the backend's and overlapped rollouts' loss defaults fill what is still unset (``defaults.py``)."""
        return resolve_loss_defaults(resolve_objective(data)) if isinstance(data, dict) else data


def resolve_objective(data: dict[str, Any]) -> dict[str, Any]:
    """``objective`` (a name, or a section with ``name``) -> the row's loss and compile options
    under the explicit ``loss`` / ``compile`` settings of ``data`` (a copy; unknown names are
    left for validation to report).

    >>> d = resolve_objective({"objective": "dapo", "loss": {"eps_low": 0.1}})
    >>> d["objective"], d["loss"]["eps_low"], d["loss"]["eps_high"], d["compile"]["drop_zero_variance"]
    ({'name': 'dapo'}, 0.1, 0.28, True)
    """
    out = dict(data)
    obj = out.get("objective")
    if isinstance(obj, str):
        obj = out["objective"] = {"name": obj}
    name = obj.get("name", "srpo") if isinstance(obj, dict) else None
    row = OBJECTIVES.get(name) if isinstance(name, str) else None
    if row is not None:
        for section, values in (("loss", row.loss), ("compile", row.compile)):
            given = out.get(section, {})
            out[section] = {**values, **given} if isinstance(given, dict) else given
    return out
