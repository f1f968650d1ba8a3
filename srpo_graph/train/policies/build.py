"""Trainer stage, policies: the trained policies built from the config, one :class:`PolicySlot` each.

Consumes the checked workflow (models overridden as the run says), the config, the device, the
checkpoint a resumed run starts from and the rank; produces one slot per trained policy: its
model (``from_pretrained``, or the checkpoint's weights), tokenizer, AdamW and LR schedule, and
the KL reference when the objective has a KL term. LoRA adapters on one shared base are
``lora.py``'s; frozen and external policies are ``frozen.py``'s (no slot). Under
``strategy = "fsdp"`` the models are sharded (``parallel/fsdp.py``) before the optimizer sees
them, and rank 0 keeps an unsharded replica to sample from in process; a sharded checkpoint's
shards are loaded into every rank's shards (``checkpoint/sharded.py``). Backends are attached
by the rollout stage (``rollout/backends.py``), not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from srpo_graph.backends import backend_spec
from srpo_graph.models import resolve_model
from srpo_graph.models.tiny import load_tokenizer
from srpo_graph.train.checkpoint import layout, sharded, verified_model_path
from srpo_graph.train.parallel import fsdp
from srpo_graph.train.parallel.job import DistInfo
from srpo_graph.train.policies import lora
from srpo_graph.train.policies.precision import enable_gradient_checkpointing
from srpo_graph.train.policies.slot import PolicySlot, make_optimizer


def device_of(config: Any) -> str:
    """Where the run's models live: ``rollout.device``, ``auto`` = ``cuda`` when there is one.

    >>> from srpo_graph.train.config.schema import TrainConfig
    >>> device_of(TrainConfig.model_validate({"rollout": {"device": "cpu"}}))
    'cpu'
    """
    if config.rollout.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.rollout.device


def shard_with_replica(model: torch.nn.Module, path: str, dtype: torch.dtype, replica_device: str,
                       dist: DistInfo) -> torch.nn.Module | None:
    """``fsdp.shard_model(model)``; on rank 0 also load an unsharded replica of ``path``.

    Returns:
        The replica (rank 0) or None.
    """
    replica = None
    if dist.is_main:  # a sharded checkpoint's folder: built from its config, filled by the first sync
        replica = sharded.load_model(path, dtype).eval().to(replica_device)
    fsdp.shard_model(model)
    return replica


def build_policies(wf: Any, config: Any, device: str, resume_from: Path | None, dist: DistInfo) -> list[PolicySlot]:
    """One slot per trained policy of ``wf`` (backends not attached yet).

    Raises:
        ConfigError: ``resume_from`` lacks a policy the workflow loads from it (a run of another workflow);
            LoRA adapters under fsdp, a damaged adapter or shard (naming the file).
    """
    if resume_from is not None:  # every trained slot (and a LoRA policy's shared base) reads policies/<name>/
        layout.check_holds(resume_from, [p.name for p in wf.policies if p.name not in wf.untrained_policies
                                         or p.name in wf.frozen_bases], wf.name)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dtype = getattr(torch, config.rollout.dtype)
    kl = float(getattr(config.loss, "kl_coef", 0.0) or 0.0)
    in_process = backend_spec(config.rollout.backend).in_process
    sharded_run = config.strategy == "fsdp" and dist.enabled
    slots: list[PolicySlot] = []
    if lora.uses_adapters(wf):  # LoRA adapters on one shared frozen base per base policy: lora.py
        slots = lora.build_slots(wf, config, device, resume_from, dist)
    for pol in wf.policies if not slots else ():
        if pol.name in wf.untrained_policies:  # frozen / external: frozen.py, no slot
            continue
        base = verified_model_path(str(resolve_model(pol.model)))  # Note [One verified read]
        path = str(layout.policy_path(resume_from, pol.name)) if resume_from else base
        model: Any = sharded.load_model(path, dtype)  # a sharded checkpoint: its config; shards below
        model = model.to(device).eval()  # no dropout: learn/update.py
        tok = load_tokenizer(path)
        # fsdp: shard before the optimizer sees the parameters; rank 0 keeps a whole replica only to
        # sample from in process; a server gets the weights streamed bucket by bucket (train/sync.py)
        replica = shard_with_replica(model, path, dtype, device, dist) if sharded_run and in_process else None
        if sharded_run and not in_process:
            fsdp.shard_model(model)
        opt, sched = make_optimizer(model.parameters(), config)
        if resume_from is not None and sharded.is_sharded_checkpoint(resume_from):  # every rank its shards
            sharded.load_policy(resume_from, pol.name, model, opt)
        ref: Any = None
        if kl != 0.0:
            ref = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
            ref = ref.to(device).eval()
            ref.requires_grad_(False)
        slots.append(PolicySlot(pol.name, base, model, tok, opt, sched, None, ref, replica=replica,
                                stream=sharded_run and not in_process))
    if config.optim.gradient_checkpointing:  # policies/precision.py
        for s in slots:
            enable_gradient_checkpointing(s.model)
    return slots
