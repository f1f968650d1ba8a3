"""Trainer stage: policies that do not train (``policy p = "model" frozen`` and ``openai(...)``).

Consumes the workflow and the run's config; produces a backend per frozen policy, sampled
like any policy and never updated: no optimizer, no weights in checkpoints (the run's loop
state records a pointer to each, checked on resume), no weight sync (the version recorded in
traces stays 0). A frozen local model samples on the run's rollout backend (in process for
``transformers``, a server of its own for ``sglang``); an external policy always talks to its
endpoint (``backends/openai.py``). LoRA bases are not handled here (``lora.py`` owns them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srpo_graph.backends import TrainedPolicy
from srpo_graph.errors import ConfigError
from srpo_graph.models import resolve_model
from srpo_graph.train.checkpoint import verified_model_path
from srpo_graph.workflow import Workflow


def frozen_policies(wf: Workflow) -> tuple[str, ...]:
    """Policies declared ``frozen`` or external (LoRA bases excluded: their agents stay in the loss
    as before, through the adapters' shared model), in declaration order."""
    return tuple(p.name for p in wf.policies
                 if (p.frozen or p.external is not None) and p.name not in wf.frozen_bases)


def check_something_trains(wf: Workflow, workflow_path: str | Path) -> None:
    """``train`` refuses a workflow whose every policy is frozen or external.

    Raises:
        ConfigError: naming the workflow file and its frozen policies.
    """
    if not wf.trained_policies:
        names = ", ".join(p.name for p in wf.policies) or "none"
        raise ConfigError.at(str(workflow_path), f"nothing to train: every policy ({names}) is frozen or external",
                             why="training updates trainable policies only",
                             fix="remove `frozen` from the policy to train, or use `srpo-graph run` to sample only")


def pointers(wf: Workflow) -> dict[str, str]:
    """What a checkpoint records of each frozen policy: its declaration (a pointer, never weights)."""
    by_name = wf.policy_by_name
    return {n: by_name[n].label() for n in frozen_policies(wf)}


def check_pointers(saved: dict[str, str] | None, wf: Workflow, checkpoint: Path) -> None:
    """On resume: the frozen policies are the ones the run started with.

    Raises:
        ConfigError: a frozen policy now points elsewhere (the run would resume against another model).
    """
    if saved is None:
        return
    now = pointers(wf)
    for name in sorted(set(saved) | set(now)):
        if saved.get(name) != now.get(name):
            raise ConfigError.at(str(checkpoint), f"frozen policy {name!r} was {saved.get(name) or 'absent'} when the "
                                 f"run started, now {now.get(name) or 'absent'}",
                                 fix="resume with the .wf file the run was started with")


def saved_pointers(checkpoint: Path) -> dict[str, str] | None:
    """The frozen-policy pointers a checkpoint's loop state recorded (None: none recorded)."""
    from srpo_graph.train.checkpoint.layout import read_state

    try:
        return (read_state(checkpoint).get("extra") or {}).get("frozen")
    except (OSError, ValueError):
        return None  # the checkpoint verifier reports an unreadable state


def load_frozen(wf: Workflow, config: Any, device: str) -> tuple[list[TrainedPolicy], dict[str, Any]]:
    """The frozen policies of ``frozen_policies``: (local models, to be given a backend of the run's
    kind together with the trained policies -- one ``for_training`` call, so SGLang servers get
    distinct ports --, and a ready backend per external policy). Call on the process that samples.

    Raises:
        BackendError: a model that does not load.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from srpo_graph.models.tiny import load_tokenizer

    out: dict[str, Any] = {}
    local: list[TrainedPolicy] = []
    for name in frozen_policies(wf):
        pol = wf.policy_by_name[name]
        if pol.external is not None:
            from srpo_graph.backends.openai import OpenAIBackend

            out[name] = OpenAIBackend.for_policy(pol.external)
            continue
        path = verified_model_path(str(resolve_model(pol.model)))  # Note [One verified read]
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, config.rollout.dtype))
        model = model.to(device).eval()
        model.requires_grad_(False)  # never updated: no grads, no optimizer
        local.append(TrainedPolicy(name, path, model, load_tokenizer(path), device))
    return local, out
